"""MXFP8 quantization in Triton: bit-identical to kernels/mxfp8/reference.py.

Kernels (one pass over the input each):
  _rows_kernel    blocks of 32 contiguous elements (quantize along the last dim of a contiguous tensor: the
                  tensor is just a run of blocks, scale i belongs to block i)
  _cols_kernel    [R, C] along R (dim 0); also every non-last dim of an N-D tensor, viewed [outer*D, inner]
  _rowcol_kernel  [M, K] along K AND along M from one read of x; the column copy is stored either [K, M]
                  row-major (COL_T, what wgrad reads) or [M, K]
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
def _load_f32(ptr, offs, mask, IS_BF16: tl.constexpr):
    """Load x as fp32. IS_BF16 (interpreter only): bf16 arrives as its int16 bits and is widened by a shift,
    because the Triton interpreter's bf16 -> fp32 conversion gets bf16 subnormals wrong (triton 3.6:
    5.23e-39 -> 9.18e-39, 1e-40 -> 0)."""
    if IS_BF16:
        x = (tl.load(ptr + offs, mask=mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return x


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
def _tile_ids(M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, K_FAST: tl.constexpr):
    """1-D grid -> (pid_m, pid_k). K_FAST: neighbouring programs walk along K, so the programs in flight read
    whole row bands (long contiguous runs); else they walk down M (one BLOCK_K-wide strip of many rows)."""
    pid = tl.program_id(0)
    if K_FAST:
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
def _rowcol_kernel(x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   COL_T: tl.constexpr, HW_CAST: tl.constexpr, IS_BF16: tl.constexpr, K_FAST: tl.constexpr):
    # x [M, K] contiguous. Row copy: qr [M, K], sr [M, K/32]. Column copy (blocks of 32 along M):
    # COL_T: qc [K, M], sc [K, M/32]; else qc [M, K], sc [M/32, K].
    pid_m, pid_k = _tile_ids(M, K, BLOCK_M, BLOCK_K, K_FAST)
    m0 = pid_m.to(tl.int64) * BLOCK_M
    k0 = pid_k.to(tl.int64) * BLOCK_K
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_K)
    rmask = pid_m * BLOCK_M + r < M
    cmask = pid_k * BLOCK_K + c < K
    mask = rmask[:, None] & cmask[None, :]
    offs = r[:, None] * K + c[None, :]
    base = m0 * K + k0
    x = _load_f32(x_ptr + base, offs, mask, IS_BF16)
    # row-wise (along K)
    xr = tl.reshape(x, [BLOCK_M, BLOCK_K // 32, 32])
    ar = _amax_bits(xr, 2)
    er = _exponent_from_amax_bits(ar)
    cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
    tl.store(qr_ptr + base + offs, tl.reshape(cr, [BLOCK_M, BLOCK_K]), mask=mask)
    kb = tl.arange(0, BLOCK_K // 32)
    tl.store(sr_ptr + m0 * (K // 32) + pid_k * (BLOCK_K // 32) + r[:, None] * (K // 32) + kb[None, :],
             _scale_byte(ar, er).to(tl.uint8),
             mask=rmask[:, None] & (pid_k * (BLOCK_K // 32) + kb < K // 32)[None, :])
    # column-wise (along M)
    xc = tl.reshape(x, [BLOCK_M // 32, 32, BLOCK_K])
    ac = _amax_bits(xc, 1)
    ec = _exponent_from_amax_bits(ac)
    cc = _encode(xc * _multiplier(ac, ec, HW_CAST)[:, None, :], (ac >= 0x7F800000)[:, None, :], HW_CAST)
    cc = tl.reshape(cc, [BLOCK_M, BLOCK_K])
    sc = _scale_byte(ac, ec).to(tl.uint8)
    mb = tl.arange(0, BLOCK_M // 32)
    scmask = (pid_m * (BLOCK_M // 32) + mb < M // 32)[:, None] & cmask[None, :]
    if COL_T:
        # [K, M]: store the transposed byte tile (the compiler transposes it through shared memory, so each
        # thread writes 16-byte runs along M)
        tl.store(qc_ptr + k0 * M + m0 + c[:, None] * M + r[None, :], tl.trans(cc),
                 mask=cmask[:, None] & rmask[None, :])
        tl.store(sc_ptr + k0 * (M // 32) + pid_m * (BLOCK_M // 32) + c[:, None] * (M // 32) + mb[None, :],
                 tl.trans(sc), mask=tl.trans(scmask))
    else:
        tl.store(qc_ptr + base + offs, cc, mask=mask)
        tl.store(sc_ptr + pid_m.to(tl.int64) * (BLOCK_M // 32) * K + k0 + mb[:, None] * K + c[None, :], sc,
                 mask=scmask)


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


def _tuned(name, kernel, configs, key):
    if name not in _TUNED:
        _TUNED[name] = triton.autotune(configs=[triton.Config(m, num_warps=w) for m, w in configs], key=key)(kernel)
    return _TUNED[name]


def _as_kernel_input(x):
    """(tensor to hand the kernel, IS_BF16): under the interpreter bf16 goes in as its int16 bits (see
    _load_f32); compiled, the hardware bf16 -> fp32 conversion is exact and cheaper."""
    if x.dtype == torch.bfloat16 and _INTERPRET:
        return x.view(torch.int16), True
    return x, False


def _launch(name, kernel, configs, key, grid_fn, args, hw_cast, config=None, **extra):
    """Run `kernel` with a fixed config (interpreter, or `config` given as (meta, num_warps)) or autotuned.
    args[0] is the input tensor."""
    xin, is_bf16 = _as_kernel_input(args[0])
    args = (xin,) + tuple(args[1:])
    if _INTERPRET or config is not None:
        meta, warps = config if config is not None else _INTERP[name]
        kernel[grid_fn(meta)](*args, HW_CAST=hw_cast, IS_BF16=is_bf16, num_warps=warps, **meta, **extra)
    else:
        _tuned(name, kernel, configs, key)[grid_fn](*args, HW_CAST=hw_cast, IS_BF16=is_bf16, **extra)


def default_hw_cast(device: torch.device) -> bool:
    """Use the hardware fp32->e4m3 cvt where it is known exact (compiled, sm_90+; FACTS.md). The interpreter and
    older GPUs (sm_89's Triton lowering double-rounds) take the integer rounding path. Env override:
    TITAN_FP8_MXFP8_INT_ROUND=1 forces the integer path."""
    if _INTERPRET or os.environ.get("TITAN_FP8_MXFP8_INT_ROUND", "0") == "1" or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


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
        _launch("rows", _rows_kernel, _ROWS_CONFIGS, ["n_blocks"],
                lambda m: (triton.cdiv(n_blocks, m["BLOCKS"]),), (x2, q, s, n_blocks), hw_cast, config)
    return q, s


def _cols(x2: torch.Tensor, hw_cast, config=None):
    """x2 contiguous [R, C], R % 32 == 0 -> (q uint8 [R, C], s uint8 [R/32, C])."""
    R, C = x2.shape
    q = torch.empty((R, C), dtype=torch.uint8, device=x2.device)
    s = torch.empty((R // BLOCK, C), dtype=torch.uint8, device=x2.device)
    if R and C:
        _launch("cols", _cols_kernel, _COLS_CONFIGS, ["R", "C"],
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
        sc = torch.empty((K, M // BLOCK), dtype=torch.uint8, device=dev)
    else:
        qc = torch.empty((M, K), dtype=torch.uint8, device=dev)
        sc = torch.empty((M // BLOCK, K), dtype=torch.uint8, device=dev)
    if M and K:
        _launch_rowcol(x, qr, sr, qc, sc, M, K, dict(COL_T=bool(col_transposed)), hw, config)
    f8 = torch.float8_e4m3fn
    return qr.view(f8), sr, qc.view(f8), sc


def _launch_rowcol(x, qr, sr, qc, sc, M, K, meta_args, hw, config):
    name = "rowcol_t" if meta_args["COL_T"] else "rowcol"
    _launch(name, _rowcol_kernel, _ROWCOL_CONFIGS, ["M", "K"],
            lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(K, m["BLOCK_K"]),),
            (x, qr, sr, qc, sc, M, K), hw, config, **meta_args)


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
        _launch("tiles", _tiles32_kernel, _TILES_CONFIGS, ["N", "K"],
                lambda m: (triton.cdiv(N, m["BLOCK_N"]) * triton.cdiv(K, m["BLOCK_K"]), B),
                (x, q, sk, sn, N, K), hw, config)
    return (q.view(w.shape).view(torch.float8_e4m3fn), sk.view(scale_shape(w.shape, w.ndim - 1)),
            sn.view(scale_shape(w.shape, w.ndim - 2)))
