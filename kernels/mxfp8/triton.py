"""MXFP8 quantization in Triton: bit-identical to kernels/mxfp8/reference.py.

Kernels (one pass over the input each):
  _rows_kernel    blocks of 32 contiguous elements (quantize along the last dim of a contiguous tensor: the
                  tensor is just a run of blocks, scale i belongs to block i)
  _cols_kernel    [R, C] along R (dim 0); also every non-last dim of an N-D tensor, viewed [outer*D, inner]
  _rowcol_kernel  [M, K] along K AND along M from one read of x; the column copy is stored either [K, M]
                  row-major (COL_T, what wgrad reads) or [M, K]; options for the [K, M] store (transposed
                  input tile, TMA stores, grouped tile order, streaming stores) are sweep candidates
  _tiles32_kernel [B, N, K] with one scale per 32x32 tile, stored expanded along K and along N

How the numbers are made (same rule as the reference, done on integer bits so nothing depends on float
division, log2 or the fp8 cast's rounding):
  a = bits(max over the block of |x|) & 0x7FFFFFFF   # a >= 0x7F800000 <=> NaN/inf in block
      (the max is max.NaN.f32 with |.| operands, one FMNMX.NAN per element: NaN-propagating, no .ftz, so it
      orders finite values exactly as the integer compare of their magnitude bits would)
  e = ceil(log2(fl(amax/448))) from a's exponent field p and mantissa m (amax = 1.m * 2^p):
      e = p - 8 if m <= 0.75 else p - 7            # 448 = 1.75 * 2^8; for normal s rounding can't cross 2^k
      except p = -119, m = 0.75 + 2^-23: fl(amax/448) is the subnormal 2^-127 rounded DOWN, e = -127
      then clamp to [-127, 127] (amax = 0 or subnormal lands on -127)
  y = x * 2^-e with 2^-e built from its bits ((127 - e) << 23; e <= 121 so it is never subnormal); the
      compiled PTX has no .ftz anywhere, so fp32-subnormal inputs survive the multiply
  data: clamp to +-448 and round to e4m3 nearest-even:
      HW_CAST=True (default when compiled for sm_90+): the hardware cvt.rn.satfinite.e4m3x2.f32 (exact on
      sm_90, FACTS.md); satfinite is the clamp. A non-finite block's multiplier is NaN, so its elements
      convert to the NaN byte 0x7F with no per-element select. About 8.5 instructions per element (rows).
      HW_CAST=False: integer RNE on the fp32 bits (normal range) and a 2^14 magic add (subnormal range,
      multiples of 2^-9), then the e4m3 byte is assembled directly, so no fp8 cast runs at all. This is the
      path the interpreter uses (its fp32->e4m3 cast is wrong) and the GPU tests check it compiled too;
      about 2.5x the instructions of the hardware path.
  Non-finite block: scale 0xFF, every data byte 0x7F.
bf16 input: compiled, the hardware widening (exact); interpreted, the int16 bits shifted left 16, because the
interpreter's bf16 -> fp32 conversion is wrong for bf16 subnormals (see _load_f32).
"""
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .reference import BLOCK, check_input, scale_shape

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


# ----------------------------------------------------------------------------------------- shared math
@triton.jit
def _exponent_from_amax_bits(a):
    """a: int32 bits of amax (sign cleared). Returns e = clamp(ceil(log2(fl(amax / 448))), -127, 127)."""
    ea = a >> 23
    man = a & 0x7FFFFF
    e = ea - 135 + (man > 0x600000).to(tl.int32)
    e = tl.where((ea == 8) & (man == 0x600001), -127, e)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def _pow2_neg(e):
    """2^-e as fp32 for e in [-127, 121] (never subnormal)."""
    return ((127 - e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _scale_byte(a, e):
    return tl.where(a >= 0x7F800000, 255, e + 127)


@triton.jit
def _multiplier(a, e, HW_CAST: tl.constexpr):
    """Per-block factor 2^-e. On the hardware-cast path a non-finite block gets NaN instead, so every element
    becomes NaN and the cvt writes e4m3fn's NaN byte 0x7F with no per-element select."""
    m = _pow2_neg(e)
    if HW_CAST:
        m = tl.where(a >= 0x7F800000, float("nan"), m)
    return m


@triton.jit
def _encode(y, nonfinite, HW_CAST: tl.constexpr):
    """y = x * 2^-e (fp32) -> e4m3fn byte (uint8) of clamp(y, -448, 448), round to nearest even; elements of a
    non-finite block -> 0x7F."""
    if HW_CAST:
        # cvt.rn.satfinite.e4m3x2.f32: RNE, saturates beyond +-448 (our clamp), NaN -> 0x7F
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        yb = y.to(tl.int32, bitcast=True)
        sign = (yb >> 24) & 0x80
        ab = tl.minimum(yb & 0x7FFFFFFF, 0x43E00000)  # |y| clamped to 448 (on the bits: same order)
        r = ab + 0x7FFFF + ((ab >> 20) & 1)  # round the 23-bit mantissa to 3 bits, nearest even
        code_n = (r >> 20) - 960  # (exp << 3 | mant) re-biased 127 -> 7
        f = ab.to(tl.float32, bitcast=True) + 16384.0  # ulp(2^14) = 2^-9: RNE onto the subnormal grid
        code_s = f.to(tl.int32, bitcast=True) - 0x46800000  # k * 2^-9 -> k (k = 8 is 2^-6 = 0x08: seamless)
        code = tl.where(ab < 0x3C800000, code_s, code_n) | sign
        code = tl.where(nonfinite, 0x7F, code).to(tl.uint8)
    return code


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


# How _amax_bits takes the max. Compiled: a NaN-propagating float max (one FMNMX.NAN per element). Interpreted:
# the integer max of the magnitude bits (same bits; tl.reduce with a custom combine runs ~10x slower in the
# interpreter than tl.max). tests/cpu sets this to False on a few cases to run the float path there too.
_AMAX_ON_INT_BITS = tl.constexpr(_INTERPRET)


@triton.jit
def _amax_bits(x, axis: tl.constexpr):
    """Bits of max|x| along `axis` (sign cleared); >= 0x7F800000 iff the block holds NaN or inf. Compiled: one
    FMNMX.NAN with |.| operands per element (max.NaN.f32: a NaN anywhere makes the max NaN; no .ftz, so
    fp32 subnormals compare as themselves), the same order as the integer compare of the magnitude bits."""
    if _AMAX_ON_INT_BITS:
        return tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis)
    return tl.reduce(tl.abs(x), axis, _max_nan).to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _amax_bits_raw(x, axis: tl.constexpr, IS_BF16: tl.constexpr):
    """_amax_bits of x in its storage type (as _load_raw returns it), without widening the whole tile to fp32
    first. 16-bit floats, compiled: the integer max of the magnitude bits orders them as the float max does and
    puts NaN above inf above every finite value, so the block's amax (and whether it is non-finite) comes out
    exact; only the reduced amax is widened. (One if/else chain: Triton compiles the code after an early
    return inside a constexpr if, and the 16-bit bitcast does not compile for fp32.)"""
    WIDE: tl.constexpr = x.dtype.primitive_bitwidth == 32
    if WIDE:  # fp32: nothing to save
        res = _amax_bits(x, axis)
    elif _AMAX_ON_INT_BITS:
        res = _amax_bits(_widen(x, IS_BF16), axis)
    else:
        m = tl.max(x.to(tl.int16, bitcast=True) & 0x7FFF, axis=axis)
        if IS_BF16 or x.dtype == tl.bfloat16:  # bf16 bits (or the interpreter's int16 bits of bf16): fp32's top half
            res = m << 16
        else:
            res = m.to(tl.int16).to(x.dtype, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return res


@triton.jit
def _load_raw(ptr, offs, mask, IS_BF16: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """Load x in its storage type (bf16 as int16 bits under the interpreter, see _widen). EVICT_FIRST: the
    input is read exactly once, so ask L2 to drop it first and keep room for the outputs being merged."""
    other = 0 if IS_BF16 else 0.0
    if EVICT_FIRST:
        x = tl.load(ptr + offs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptr + offs, mask=mask, other=other)
    return x


@triton.jit
def _widen(x, IS_BF16: tl.constexpr):
    """Storage type -> fp32. IS_BF16 (interpreter only): bf16 arrives as its int16 bits and is widened by a
    shift, because the Triton interpreter's bf16 -> fp32 conversion gets bf16 subnormals wrong (triton 3.6:
    5.23e-39 -> 9.18e-39, 1e-40 -> 0)."""
    if IS_BF16:
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _load_f32(ptr, offs, mask, IS_BF16: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """Load x as fp32 (see _load_raw, _widen)."""
    return _widen(_load_raw(ptr, offs, mask, IS_BF16, EVICT_FIRST), IS_BF16)


@triton.jit
def _store(ptr, val, mask, STREAM: tl.constexpr):
    """STREAM: st.global.cs (evict-first streaming store): the outputs are not read again by this kernel."""
    if STREAM:
        tl.store(ptr, val, mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptr, val, mask=mask)


# ----------------------------------------------------------------------------------------- kernels
# Addresses: one int64 scalar base per program, int32 offsets inside the tile (fewer 64-bit ops per element).


@triton.jit
def _rows_kernel(x_ptr, q_ptr, s_ptr, n_blocks, BLOCKS: tl.constexpr, HW_CAST: tl.constexpr,
                 IS_BF16: tl.constexpr):
    # A contiguous tensor quantized along its last dim is a run of 32-element blocks; scale i is block i's.
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCKS
    inb = pid * BLOCKS + tl.arange(0, BLOCKS) < n_blocks
    offs = tl.arange(0, BLOCKS)[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = _load_f32(x_ptr + base * 32, offs, inb[:, None], IS_BF16)
    a = _amax_bits(x, 1)
    e = _exponent_from_amax_bits(a)
    code = _encode(x * _multiplier(a, e, HW_CAST)[:, None], (a >= 0x7F800000)[:, None], HW_CAST)
    tl.store(q_ptr + base * 32 + offs, code, mask=inb[:, None])
    tl.store(s_ptr + base + tl.arange(0, BLOCKS), _scale_byte(a, e).to(tl.uint8), mask=inb)


@triton.jit
def _tile_ids(M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, K_FAST: tl.constexpr, GROUP_M: tl.constexpr = 0):
    """1-D grid -> (pid_m, pid_k). K_FAST: neighbouring programs walk along K, so the programs in flight read
    whole row bands (long contiguous runs); else they walk down M (one BLOCK_K-wide strip of many rows).
    GROUP_M > 0 (overrides K_FAST): bands of GROUP_M row tiles, walked down M first and then along K, so the
    programs in flight cover GROUP_M * BLOCK_M consecutive rows of a few K strips: for a [K, M] output
    every K row then receives GROUP_M * BLOCK_M contiguous bytes at about the same time (whole lines to
    merge in L2) while each program still reads BLOCK_K-wide row runs."""
    pid = tl.program_id(0)
    if GROUP_M > 0:
        n_m = tl.cdiv(M, BLOCK_M)
        per_group = GROUP_M * tl.cdiv(K, BLOCK_K)
        first_m = (pid // per_group) * GROUP_M
        g_size = tl.minimum(n_m - first_m, GROUP_M)
        in_group = pid % per_group
        pid_m = first_m + in_group % g_size
        pid_k = in_group // g_size
    elif K_FAST:
        n_k = tl.cdiv(K, BLOCK_K)
        pid_m = pid // n_k
        pid_k = pid - pid_m * n_k
    else:
        n_m = tl.cdiv(M, BLOCK_M)
        pid_k = pid // n_m
        pid_m = pid - pid_k * n_m
    return pid_m, pid_k


@triton.jit
def _cols_kernel(x_ptr, q_ptr, s_ptr, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                 HW_CAST: tl.constexpr, IS_BF16: tl.constexpr, K_FAST: tl.constexpr):
    # x, q: [R, C] contiguous; s: [R/32, C]; blocks of 32 along R.
    pid_r, pid_c = _tile_ids(R, C, BLOCK_R, BLOCK_C, K_FAST)
    r = tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    base = pid_r.to(tl.int64) * BLOCK_R * C + pid_c * BLOCK_C
    mask = (pid_r * BLOCK_R + r < R)[:, None] & (pid_c * BLOCK_C + c < C)[None, :]
    offs = r[:, None] * C + c[None, :]
    x = _load_f32(x_ptr + base, offs, mask, IS_BF16)
    x3 = tl.reshape(x, [BLOCK_R // 32, 32, BLOCK_C])
    a = _amax_bits(x3, 1)  # [BLOCK_R/32, BLOCK_C]
    e = _exponent_from_amax_bits(a)
    code = _encode(x3 * _multiplier(a, e, HW_CAST)[:, None, :], (a >= 0x7F800000)[:, None, :], HW_CAST)
    tl.store(q_ptr + base + offs, tl.reshape(code, [BLOCK_R, BLOCK_C]), mask=mask)
    sr = tl.arange(0, BLOCK_R // 32)
    smask = (pid_r * (BLOCK_R // 32) + sr < R // 32)[:, None] & (pid_c * BLOCK_C + c < C)[None, :]
    tl.store(s_ptr + pid_r.to(tl.int64) * (BLOCK_R // 32) * C + pid_c * BLOCK_C + sr[:, None] * C + c[None, :],
             _scale_byte(a, e).to(tl.uint8), mask=smask)


@triton.jit
def _rowcol_kernel(x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, qr_desc, qc_desc, M, K, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr, COL_T: tl.constexpr, HW_CAST: tl.constexpr, IS_BF16: tl.constexpr,
                   K_FAST: tl.constexpr, GROUP_M: tl.constexpr = 0, TRANS_X: tl.constexpr = False,
                   TMA: tl.constexpr = False, STREAM: tl.constexpr = False, EVICT_FIRST: tl.constexpr = False):
    # x [M, K] contiguous. Row copy: qr [M, K], sr [M, K/32]. Column copy (blocks of 32 along M):
    # COL_T: qc [K, M]; else qc [M, K]. Either way sc is stored [M/32, K] (COL_T returns it as a [K, M/32] view).
    # Options (sweep: benchmarks/mxfp8_quant_sweep.py): GROUP_M tile order (see _tile_ids); TRANS_X (COL_T):
    # transpose the INPUT tile (16-bit, before widening) and quantize the column copy along the rows of the
    # transposed tile, so the [K, M] store needs no byte transpose (byte tiles transpose through shared memory
    # with 4-way bank sharing); TMA: the two data copies leave through TMA bulk stores (host tensor
    # descriptors qr_desc/qc_desc; the hardware writes whole boxes and clips the tails, no masks);
    # STREAM: .cs streaming stores; EVICT_FIRST: evict-first loads of x.
    pid_m, pid_k = _tile_ids(M, K, BLOCK_M, BLOCK_K, K_FAST, GROUP_M)
    m0 = pid_m.to(tl.int64) * BLOCK_M
    k0 = pid_k.to(tl.int64) * BLOCK_K
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_K)
    rmask = pid_m * BLOCK_M + r < M
    cmask = pid_k * BLOCK_K + c < K
    mask = rmask[:, None] & cmask[None, :]
    offs = r[:, None] * K + c[None, :]
    base = m0 * K + k0
    xraw = _load_raw(x_ptr + base, offs, mask, IS_BF16, EVICT_FIRST)
    x = _widen(xraw, IS_BF16)
    # row-wise (along K)
    xr = tl.reshape(x, [BLOCK_M, BLOCK_K // 32, 32])
    ar = _amax_bits(xr, 2)
    er = _exponent_from_amax_bits(ar)
    cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
    cr = tl.reshape(cr, [BLOCK_M, BLOCK_K])
    if TMA:
        qr_desc.store([pid_m * BLOCK_M, pid_k * BLOCK_K], cr)
    else:
        _store(qr_ptr + base + offs, cr, mask, STREAM)
    kb = tl.arange(0, BLOCK_K // 32)
    _store(sr_ptr + m0 * (K // 32) + pid_k * (BLOCK_K // 32) + r[:, None] * (K // 32) + kb[None, :],
           _scale_byte(ar, er).to(tl.uint8),
           rmask[:, None] & (pid_k * (BLOCK_K // 32) + kb < K // 32)[None, :], STREAM)
    # column-wise (along M)
    mb = tl.arange(0, BLOCK_M // 32)
    scmask = (pid_m * (BLOCK_M // 32) + mb < M // 32)[:, None] & cmask[None, :]
    if COL_T and TRANS_X:
        # quantize the transposed input tile along its rows: the codes come out already [BLOCK_K, BLOCK_M]
        xt = tl.reshape(_widen(tl.trans(xraw), IS_BF16), [BLOCK_K, BLOCK_M // 32, 32])
        ac = _amax_bits(xt, 2)  # [BLOCK_K, BLOCK_M/32]
        ec = _exponent_from_amax_bits(ac)
        ct = _encode(xt * _multiplier(ac, ec, HW_CAST)[:, :, None], (ac >= 0x7F800000)[:, :, None], HW_CAST)
        ct = tl.reshape(ct, [BLOCK_K, BLOCK_M])
        if TMA:
            qc_desc.store([pid_k * BLOCK_K, pid_m * BLOCK_M], ct)
        else:
            _store(qc_ptr + k0 * M + m0 + c[:, None] * M + r[None, :], ct, cmask[:, None] & rmask[None, :],
                   STREAM)
        _store(sc_ptr + pid_m.to(tl.int64) * (BLOCK_M // 32) * K + k0 + mb[:, None] * K + c[None, :],
               tl.trans(_scale_byte(ac, ec).to(tl.uint8)), scmask, STREAM)
    else:
        xc = tl.reshape(x, [BLOCK_M // 32, 32, BLOCK_K])
        ac = _amax_bits(xc, 1)
        ec = _exponent_from_amax_bits(ac)
        cc = _encode(xc * _multiplier(ac, ec, HW_CAST)[:, None, :], (ac >= 0x7F800000)[:, None, :], HW_CAST)
        cc = tl.reshape(cc, [BLOCK_M, BLOCK_K])
        sc = _scale_byte(ac, ec).to(tl.uint8)
        if COL_T:
            # [K, M]: store the transposed byte tile (the compiler transposes it through shared memory, so
            # each thread writes 16-byte runs along M)
            if TMA:
                qc_desc.store([pid_k * BLOCK_K, pid_m * BLOCK_M], tl.trans(cc))
            else:
                _store(qc_ptr + k0 * M + m0 + c[:, None] * M + r[None, :], tl.trans(cc),
                       cmask[:, None] & rmask[None, :], STREAM)
        else:
            if TMA:
                qc_desc.store([pid_m * BLOCK_M, pid_k * BLOCK_K], cc)
            else:
                _store(qc_ptr + base + offs, cc, mask, STREAM)
        # the scales of both layouts are stored [M/32, K] (COL_T: returned as a [K, M/32] view, to_mxfp8_rowcol)
        _store(sc_ptr + pid_m.to(tl.int64) * (BLOCK_M // 32) * K + k0 + mb[:, None] * K + c[None, :], sc,
               scmask, STREAM)


@triton.jit
def _tiles32_kernel(x_ptr, q_ptr, sk_ptr, sn_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    HW_CAST: tl.constexpr, IS_BF16: tl.constexpr, K_FAST: tl.constexpr):
    # x, q: [B, N, K] contiguous; one scale per 32x32 tile; sk [B, N, K/32], sn [B, N/32, K].
    pid_n, pid_k = _tile_ids(N, K, BLOCK_N, BLOCK_K, K_FAST)
    b = tl.program_id(1).to(tl.int64)
    n0 = pid_n * BLOCK_N
    k0 = pid_k * BLOCK_K
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_K)
    rmask = n0 + r < N
    cmask = k0 + c < K
    mask = rmask[:, None] & cmask[None, :]
    base = b * N * K + n0.to(tl.int64) * K + k0
    offs = r[:, None] * K + c[None, :]
    x = _load_f32(x_ptr + base, offs, mask, IS_BF16)
    x4 = tl.reshape(x, [BLOCK_N // 32, 32, BLOCK_K // 32, 32])
    a = _amax_bits(_amax_bits(x4, 3).to(tl.float32, bitcast=True), 1)  # [BN/32, BK/32]
    e = _exponent_from_amax_bits(a)
    code = _encode(x4 * _multiplier(a, e, HW_CAST)[:, None, :, None], (a >= 0x7F800000)[:, None, :, None],
                   HW_CAST)
    tl.store(q_ptr + base + offs, tl.reshape(code, [BLOCK_N, BLOCK_K]), mask=mask)
    s = _scale_byte(a, e).to(tl.uint8)  # [BN/32, BK/32]
    # along K: each of the tile's 32 rows gets the tile's byte for its K block
    sk = tl.reshape(tl.broadcast_to(s[:, None, :], [BLOCK_N // 32, 32, BLOCK_K // 32]), [BLOCK_N, BLOCK_K // 32])
    kb = tl.arange(0, BLOCK_K // 32)
    tl.store(sk_ptr + b * N * (K // 32) + n0.to(tl.int64) * (K // 32) + k0 // 32 + r[:, None] * (K // 32)
             + kb[None, :], sk, mask=rmask[:, None] & (k0 // 32 + kb < K // 32)[None, :])
    # along N: each of the tile's 32 columns gets the tile's byte for its N block
    sn = tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_N // 32, BLOCK_K // 32, 32]), [BLOCK_N // 32, BLOCK_K])
    nb = tl.arange(0, BLOCK_N // 32)
    tl.store(sn_ptr + b * (N // 32) * K + (n0 // 32).to(tl.int64) * K + k0 + nb[:, None] * K + c[None, :], sn,
             mask=(n0 // 32 + nb < N // 32)[:, None] & cmask[None, :])


# ----------------------------------------------------------------------------------------- configs
# (meta-parameters, num_warps). The interpreter gets one fixed config (tuning it would only cost time);
# CUDA autotunes over a few, keyed on the problem size. Candidates: the best of a sweep on H200 at
# M=131072, K=7168 bf16 (benchmarks/mxfp8_quant_sweep.py; results in benchmarks/results/
# mxfp8_quant_sweep-*.json). What it showed: K_FAST (neighbouring programs walk along K, so the programs in
# flight read whole row bands) beat walking down M by 10-20 points; 1-2 warps per 32-row strip beat 4-8
# (more warps split the 32-row reductions across warps: shared memory and barriers); loading the next tile
# before quantizing this one (a SPLIT loop) was slower; packing the [K, M] column bytes into 32-bit words
# before the transpose was not picked by the autotuner (both tried on H200, 2026-11-22).
# Row+col options (meta keys, all default off; see _rowcol_kernel): GROUP_M, TRANS_X, TMA, STREAM, EVICT_FIRST.
# A TMA config is dropped below sm_90 (_launch_rowcol); its descriptors get their box shape per config.
# The [K, M] column copy was stuck near 80% of copy on H100 with every one of those options (93 configs) and
# with a CUDA C++ version (shared-memory byte transpose, 16-byte stores along M: 80.9%, bit-exact, dropped).
# The limit was the column SCALES: stored [K, M/32], each tile wrote BLOCK_M/32 bytes per K row (partial
# sectors). Stored [M/32, K] (returned as a transposed view) the same config reaches 90% (H100,
# benchmarks/results/mxfp8_quant-nvidia-h100-*).
_ROWS_CONFIGS = [(dict(BLOCKS=128), 4), (dict(BLOCKS=256), 4), (dict(BLOCKS=256), 8), (dict(BLOCKS=512), 8),
                 (dict(BLOCKS=1024), 8)]
_COLS_CONFIGS = [(dict(BLOCK_R=32, BLOCK_C=128, K_FAST=True), 1), (dict(BLOCK_R=32, BLOCK_C=256, K_FAST=True), 2),
                 (dict(BLOCK_R=32, BLOCK_C=64, K_FAST=True), 1), (dict(BLOCK_R=32, BLOCK_C=512, K_FAST=True), 4)]
_ROWCOL_CONFIGS = [(dict(BLOCK_M=32, BLOCK_K=128, K_FAST=True), 2), (dict(BLOCK_M=32, BLOCK_K=256, K_FAST=True), 2),
                   (dict(BLOCK_M=32, BLOCK_K=128, K_FAST=True), 1), (dict(BLOCK_M=64, BLOCK_K=64, K_FAST=True), 1)]
_TILES_CONFIGS = [(dict(BLOCK_N=32, BLOCK_K=512, K_FAST=True), 4), (dict(BLOCK_N=32, BLOCK_K=256, K_FAST=True), 2),
                  (dict(BLOCK_N=64, BLOCK_K=256, K_FAST=True), 4), (dict(BLOCK_N=32, BLOCK_K=128, K_FAST=True), 1)]
_INTERP = dict(rows=(dict(BLOCKS=16), 4), cols=(dict(BLOCK_R=32, BLOCK_C=64, K_FAST=True), 4),
               rowcol=(dict(BLOCK_M=64, BLOCK_K=64, K_FAST=False), 4),
               rowcol_t=(dict(BLOCK_M=32, BLOCK_K=64, K_FAST=True), 4),
               tiles=(dict(BLOCK_N=64, BLOCK_K=64, K_FAST=False), 4))

_TUNED = {}
# Host-side fast path: (kernel name, autotune key values, input dtype, HW_CAST, extra constexprs) ->
# (meta, num_warps, num_stages) the autotuner picked. After the first call of a key the launch skips the
# Autotuner's __call__ (argument dict, key tuple, config lookup, hooks) and runs the plain JIT kernel. These
# kernels run ~0.1 ms at expert-weight sizes, less than the Python it took to launch them through the
# autotuner, so in eager loops (and triton.testing.do_bench) the GPU waited on the host.
_BEST = {}


def _tuned(name, kernel, configs, key, pre_hook=None):
    if name not in _TUNED:
        _TUNED[name] = triton.autotune(configs=[triton.Config(m, num_warps=w, pre_hook=pre_hook) for m, w in configs],
                                       key=key)(kernel)
    return _TUNED[name]


def _as_kernel_input(x):
    """(tensor to hand the kernel, IS_BF16): under the interpreter bf16 goes in as its int16 bits (see
    _load_f32); compiled, the hardware bf16 -> fp32 conversion is exact and cheaper."""
    if x.dtype == torch.bfloat16 and _INTERPRET:
        return x.view(torch.int16), True
    return x, False


def _launch(name, kernel, configs, key, key_vals, grid_fn, args, hw_cast, config=None, args_for=None,
            pre_hook=None, **extra):
    """Run `kernel` with a fixed config (interpreter, or `config` given as (meta, num_warps)) or autotuned
    (key: the autotune key's argument names, key_vals their values here). args[0] is the input tensor.
    args_for(meta, tuning): optional, returns the full argument tuple for a config (tensor descriptors need the
    config's block shape; tuning=True: a placeholder the configs' pre_hook fixes per config)."""
    xin, is_bf16 = _as_kernel_input(args[0])
    args = (xin,) + tuple(args[1:])
    if _INTERPRET or config is not None:
        meta, warps = config if config is not None else _INTERP[name]
        full = args_for(meta, False, args) if args_for else args
        kernel[grid_fn(meta)](*full, HW_CAST=hw_cast, IS_BF16=is_bf16, num_warps=warps, **meta, **extra)
        return
    ck = (name, key_vals, xin.dtype, hw_cast, tuple(extra.items()))
    best = _BEST.get(ck)
    if best is None:
        full = args_for(None, True, args) if args_for else args
        tuned = _tuned(name, kernel, configs, key, pre_hook)
        tuned[grid_fn](*full, HW_CAST=hw_cast, IS_BF16=is_bf16, **extra)
        cfg = tuned.best_config
        best = _BEST[ck] = (dict(cfg.kwargs), cfg.num_warps, cfg.num_stages)
        # fall through: launch once more exactly as later calls will (same outputs again), so the plain-JIT
        # specialization is compiled now and never inside a later CUDA-graph capture
    meta, warps, stages = best
    full = args_for(meta, False, args) if args_for else args
    kernel[grid_fn(meta)](*full, HW_CAST=hw_cast, IS_BF16=is_bf16, num_warps=warps, num_stages=stages, **meta,
                          **extra)


def default_hw_cast(device: torch.device) -> bool:
    """Use the hardware fp32->e4m3 cvt where it is known exact (compiled, sm_90+; FACTS.md). The interpreter and
    older GPUs (sm_89's Triton lowering double-rounds) take the integer rounding path. Env override:
    TITAN_FP8_MXFP8_INT_ROUND=1 forces the integer path."""
    if _INTERPRET or os.environ.get("TITAN_FP8_MXFP8_INT_ROUND", "0") == "1" or device.type != "cuda":
        return False
    return _capability(device.index) >= (9, 0)


_CAPABILITY = {}


def _capability(index):
    """torch.cuda.get_device_capability, cached per device index (it is asked on every launch)."""
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index]


def _check_device(x, who):
    if not (x.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: x is on {x.device}; the Triton kernels need a CUDA tensor, or "
                           f"TRITON_INTERPRET=1 set before kernels.mxfp8.triton is imported (CPU interpreter)")


# ----------------------------------------------------------------------------------------- launchers
def _rows(x2: torch.Tensor, hw_cast, config=None):
    """x2 contiguous, numel % 32 == 0 -> (q uint8 same shape, s uint8 [numel/32])."""
    q = torch.empty(x2.shape, dtype=torch.uint8, device=x2.device)
    n_blocks = x2.numel() // BLOCK
    s = torch.empty(n_blocks, dtype=torch.uint8, device=x2.device)
    if n_blocks:
        _launch("rows", _rows_kernel, _ROWS_CONFIGS, ["n_blocks"], (n_blocks,),
                lambda m: (triton.cdiv(n_blocks, m["BLOCKS"]),), (x2, q, s, n_blocks), hw_cast, config)
    return q, s


def _cols(x2: torch.Tensor, hw_cast, config=None):
    """x2 contiguous [R, C], R % 32 == 0 -> (q uint8 [R, C], s uint8 [R/32, C])."""
    R, C = x2.shape
    q = torch.empty((R, C), dtype=torch.uint8, device=x2.device)
    s = torch.empty((R // BLOCK, C), dtype=torch.uint8, device=x2.device)
    if R and C:
        _launch("cols", _cols_kernel, _COLS_CONFIGS, ["R", "C"], (R, C),
                lambda m: (triton.cdiv(R, m["BLOCK_R"]) * triton.cdiv(C, m["BLOCK_C"]),),
                (x2, q, s, R, C), hw_cast, config)
    return q, s


def to_mxfp8_triton(x: torch.Tensor, dim: int = -1, hw_cast=None, config=None):
    """Triton twin of to_mxfp8_reference (any rank, any dim). Non-contiguous x is made contiguous first."""
    d = check_input(x, dim, "to_mxfp8_triton")
    _check_device(x, "to_mxfp8_triton")
    hw = default_hw_cast(x.device) if hw_cast is None else hw_cast
    xc = x.contiguous()
    if d == x.ndim - 1:
        q, s = _rows(xc, hw, config)
    else:
        inner = 1
        for n in x.shape[d + 1:]:
            inner *= n
        q, s = _cols(xc.view(-1, inner), hw, config)
    return q.view(x.shape).view(torch.float8_e4m3fn), s.view(scale_shape(x.shape, d))


def to_mxfp8_rowcol(x: torch.Tensor, col_transposed: bool = True, hw_cast=None, config=None):
    """x [M, K] -> (data_row [M, K], scale_row [M, K/32], data_col, scale_col) from ONE read of x.
    col_transposed=True: data_col [K, M] row-major, scale_col [K, M/32] (== to_mxfp8(x.t(), -1));
    False: data_col [M, K], scale_col [M/32, K] (== to_mxfp8(x, 0))."""
    if x.ndim != 2:
        raise ValueError(f"to_mxfp8_rowcol: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    check_input(x, 0, "to_mxfp8_rowcol")
    check_input(x, 1, "to_mxfp8_rowcol")
    _check_device(x, "to_mxfp8_rowcol")
    hw = default_hw_cast(x.device) if hw_cast is None else hw_cast
    x = x.contiguous()
    M, K = x.shape
    dev = x.device
    qr = torch.empty((M, K), dtype=torch.uint8, device=dev)
    sr = torch.empty((M, K // BLOCK), dtype=torch.uint8, device=dev)
    if col_transposed:
        qc = torch.empty((K, M), dtype=torch.uint8, device=dev)
        # scale_col is [K, M/32] as a transposed VIEW of a row-major [M/32, K] buffer: the kernel then stores
        # BLOCK_K contiguous scale bytes per row (whole sectors) instead of BLOCK_M/32 bytes per K row (partial
        # sectors), 77% -> 90% of copy bandwidth on H100 (benchmarks/results/mxfp8_quant-*). Same values;
        # .contiguous() gives the row-major copy (29 MB at M=131072, K=7168) where a consumer needs it.
        sc = torch.empty((M // BLOCK, K), dtype=torch.uint8, device=dev)
    else:
        qc = torch.empty((M, K), dtype=torch.uint8, device=dev)
        sc = torch.empty((M // BLOCK, K), dtype=torch.uint8, device=dev)
    if M and K:
        _launch_rowcol(x, qr, sr, qc, sc, M, K, dict(COL_T=bool(col_transposed)), hw, config)
    f8 = torch.float8_e4m3fn
    return qr.view(f8), sr, qc.view(f8), (sc.t() if col_transposed else sc)


def _desc_blocks(meta):
    """TMA box shapes (row copy, column copy) for a rowcol config."""
    bm, bk = meta["BLOCK_M"], meta["BLOCK_K"]
    return [bm, bk], ([bk, bm] if meta["COL_T"] else [bm, bk])


def _rowcol_desc_hook(nargs):
    """Autotune pre_hook: give the tensor descriptors the box shape of the config about to run."""
    if nargs.get("qr_desc") is not None:
        nargs["qr_desc"].block_shape, nargs["qc_desc"].block_shape = _desc_blocks(nargs)


def _launch_rowcol(x, qr, sr, qc, sc, M, K, meta_args, hw, config):
    name = "rowcol_t" if meta_args["COL_T"] else "rowcol"
    configs = _ROWCOL_CONFIGS
    if not _INTERPRET and _capability(x.device.index) < (9, 0):  # TMA needs sm_90
        configs = [c for c in configs if not c[0].get("TMA")] or [(dict(BLOCK_M=32, BLOCK_K=128, K_FAST=True), 2)]
    tma_configs = [m for m, _ in configs if m.get("TMA")]

    def args_for(meta, tuning, args):
        # descriptors only where a config stores through TMA (building one costs host time; None is a
        # constexpr the kernel never touches); while tuning, every config gets them (one argument list)
        if tuning and not tma_configs or not tuning and not meta.get("TMA"):
            return args[:5] + (None, None) + args[5:]
        rb, cb = _desc_blocks(dict(tma_configs[0] if tuning else meta, **meta_args))
        return args[:5] + (TensorDescriptor.from_tensor(qr, rb), TensorDescriptor.from_tensor(qc, cb)) + args[5:]

    _launch(name, _rowcol_kernel, configs, ["M", "K"], (M, K),
            lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(K, m["BLOCK_K"]),),
            (x, qr, sr, qc, sc, M, K), hw, config, args_for=args_for,
            pre_hook=_rowcol_desc_hook if tma_configs else None, **meta_args)


def to_mxfp8_expert_weights(w: torch.Tensor, dim: int = -1, hw_cast=None, config=None):
    """w [E, N, K] along K (dim -1/2: scale [E, N, K/32]) or along N (dim -2/1: scale [E, N/32, K])."""
    if w.ndim != 3:
        raise ValueError(f"to_mxfp8_expert_weights: w must be 3-D [E, N, K], got shape {tuple(w.shape)}")
    d = check_input(w, dim, "to_mxfp8_expert_weights", "w")
    if d == 0:
        raise ValueError("to_mxfp8_expert_weights: dim=0 would scale across experts; use dim=-1 (K) or -2 (N)")
    return to_mxfp8_triton(w, d, hw_cast, config)


def to_mxfp8_tiles32_triton(w: torch.Tensor, hw_cast=None, config=None):
    """w [..., N, K] -> (data, scale_k [..., N, K/32], scale_n [..., N/32, K]); one scale per 32x32 tile."""
    if w.ndim < 2:
        raise ValueError(f"to_mxfp8_tiles32: w must be [..., N, K], got shape {tuple(w.shape)}")
    check_input(w, -2, "to_mxfp8_tiles32", "w")
    check_input(w, -1, "to_mxfp8_tiles32", "w")
    _check_device(w, "to_mxfp8_tiles32")
    hw = default_hw_cast(w.device) if hw_cast is None else hw_cast
    *lead, N, K = w.shape
    B = 1
    for n in lead:
        B *= n
    x = w.contiguous().view(B, N, K)
    dev = w.device
    q = torch.empty((B, N, K), dtype=torch.uint8, device=dev)
    sk = torch.empty((B, N, K // BLOCK), dtype=torch.uint8, device=dev)
    sn = torch.empty((B, N // BLOCK, K), dtype=torch.uint8, device=dev)
    if B and N and K:
        _launch("tiles", _tiles32_kernel, _TILES_CONFIGS, ["N", "K"], (N, K),
                lambda m: (triton.cdiv(N, m["BLOCK_N"]) * triton.cdiv(K, m["BLOCK_K"]), B),
                (x, q, sk, sn, N, K), hw, config)
    return (q.view(w.shape).view(torch.float8_e4m3fn), sk.view(scale_shape(w.shape, w.ndim - 1)),
            sn.view(scale_shape(w.shape, w.ndim - 2)))
