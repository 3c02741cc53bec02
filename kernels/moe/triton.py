"""Triton kernels of the fused MoE expert path: bit-identical to kernels/moe/reference.py (dweights aside; and
SwiGLU under SIGMOID = "fast", the compiled default, which is within the reference's error bound instead).

One prologue (_values) makes the fp32 tile a kernel quantizes, by MODE:
  0 dispatch        x[src[r]] (0 where src[r] == N)                          x [N, D], src [P]
  1 combine bwd     weights[t, slot] * dout[t], t = src[r], slot: pos[t*k + slot] == r (0 on padding rows);
                    also the partial dot <dout[t], y[r]> over the tile's columns (dweights)
  2 SwiGLU fwd      silu(h1) * h3                                              h13 [P, 2H]
  3 SwiGLU bwd      [dh1 | dh3] (reference.swiglu_grad_values)                da [P, H], h13 [P, 2H]
and two ways to quantize it:
  _mx_kernel        mxfp8, ONE pass: a BM x BD tile -> row copy (blocks of `block` along the features) AND the
                    token-major copy (blocks of `block` tokens, stored transposed [C, P]; its scales [P/32, C]).
  _f8_amax_kernel   fp8_rowwise pass 1: each program walks SUB row tiles down one strip of columns; the row amax
                    and the per-(expert group, column) amax as int32 magnitude bits by relaxed atomic max (max is
                    order-free: deterministic); the column maxima stay in registers while the rows stay in one
                    group, so the atomics are ~P*C/BD + C*programs-per-strip, not one per row and column per tile.
  _f8_quant_kernel  fp8_rowwise pass 2: the row copy and the token-major copy (stored transposed [C, P]) with the
                    now known scales (one [BD] vector of column scales per tile and group).
                    A per-row or per-group scale needs its amax before any byte is written and a row / group does
                    not fit on chip, so fp8_rowwise reads its inputs twice: the floor is 2 reads + 2 fp8 writes
                    (a first version held whole rows in registers, one row per iteration: 230 registers, one
                    program per SM, 11-25% of copy on H100).
  MODE 3 under fp8_rowwise takes a column of [0, H) per program column and produces dh1 AND dh3 from one
  sigmoid and one read of da / h1 / h3 (the mx kernel computes both halves per output column).
The quantization arithmetic is kernels/mxfp8/triton.py's (_encode, _exponent_from_amax_bits, ...); the
fp8_rowwise scales follow kernels/float8_cast's amax_to_scale, computed in pass 2 from the amax bits pass 1
found by the integer form _pow2_scale (tested against amax_to_scale on every binade): eager scale ops between
the passes cost ~15 kernel launches of host time per call, which left the layer host-bound at llama_moe.

Floating-point order: products and sums that the reference rounds one at a time (combine's weighted sum, the
weighting of dy, SwiGLU) are inline PTX mul.rn / add.rn / rcp.rn.f32 when compiled: the explicit rounding mode
keeps ptxas from contracting them into FMAs, and, unlike libdevice's __nv_fmul_rn (which Triton links as
mul.rn.ftz), they keep subnormals as torch does. Under the interpreter plain numpy fp32 ops round the same way.
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from kernels.float8_cast.reference import E4M3, amax_to_scale
from kernels.grouped_gemm.triton_mx import _fix_interpreter_scalar_index
from kernels.mxfp8.triton import (
    _INTERPRET,
    _amax_bits,
    _as_kernel_input,
    _encode,
    _exponent_from_amax_bits,
    _load_raw,
    _multiplier,
    _scale_byte,
    _tile_ids,
    _widen,
    default_hw_cast,
)

from .reference import BOTH, EXP2_COEFFS, EXP2_HI, EXP2_LO, NEG_LOG2E, ROWS, TOKEN_MAJOR

if _INTERPRET:
    _fix_interpreter_scalar_index()  # run-time loop bounds (persistent row kernel)

_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (tl.constexpr(c) for c in EXP2_COEFFS)
_NEG_LOG2E = tl.constexpr(NEG_LOG2E)
_LO = tl.constexpr(EXP2_LO)
_HI = tl.constexpr(EXP2_HI)
_RN = tl.constexpr(not _INTERPRET)  # inline PTX *.rn.f32 when compiled


# ----------------------------------------------------------------------------------------- rounded ops
_MUL = tl.constexpr("mul.rn.f32 $0, $1, $2;")
_ADD = tl.constexpr("add.rn.f32 $0, $1, $2;")


@triton.jit
def _rounded(a, b, ASM: tl.constexpr):
    """One correctly rounded fp32 op (see the module docstring): inline PTX when compiled, numpy when interpreted."""
    a, b = tl.broadcast(a, b)
    if _RN:
        r = tl.inline_asm_elementwise(ASM, "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)
    elif ASM == _MUL:
        r = a * b
    else:
        r = a + b
    return r


@triton.jit
def _mul(a, b):
    return _rounded(a, b, _MUL)


@triton.jit
def _add(a, b):
    return _rounded(a, b, _ADD)


@triton.jit
def _rcp(x):
    """1 / x correctly rounded (IEEE, as torch.reciprocal / div.rn): rcp.rn.f32 is shorter than div.rn.f32."""
    if _RN:
        r = tl.inline_asm_elementwise("rcp.rn.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = 1.0 / x
    return r


@triton.jit
def _k(x, c):
    """The constant c as an fp32 tensor shaped like x (the *_rn helpers take tensors)."""
    return tl.full(x.shape, c, tl.float32)


@triton.jit
def _sigmoid(x, FAST: tl.constexpr = False):
    """reference._sigmoid, op for op; FAST (compiled only, see SIGMOID): 1 / (1 + 2^t), t = min(x * -log2 e, 126),
    by the GPU's special-function unit, ex2.approx.ftz + rcp.approx.ftz: 5 instructions instead of ~35. The cap
    keeps 1 / (1 + 2^t) normal (ftz would flush it to 0), so silu(-inf) is -inf as in the exact form, not NaN;
    a NaN passes the cap (min.NaN), so sigmoid(NaN) is NaN as there."""
    if FAST and _RN:
        t = tl.minimum(x * _NEG_LOG2E, 126.0, propagate_nan=tl.PropagateNan.ALL)
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [t], dtype=tl.float32, is_pure=True,
                                      pack=1)
        s = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [e + 1.0], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        s = _exact_sigmoid(x)
    return s


@triton.jit
def _exact_sigmoid(x):
    """reference._sigmoid, op for op."""
    xs = tl.where(x != x, 0.0, x)  # NaN handled at the end (keeps the integer cast below defined)
    t = _mul(xs, _k(x, _NEG_LOG2E))
    t = tl.minimum(tl.maximum(t, _LO), _HI)
    n = tl.floor(_add(t, _k(x, 0.5)))
    f = _add(t, -n)
    p = _k(x, _C7)
    p = _add(_mul(p, f), _k(x, _C6))
    p = _add(_mul(p, f), _k(x, _C5))
    p = _add(_mul(p, f), _k(x, _C4))
    p = _add(_mul(p, f), _k(x, _C3))
    p = _add(_mul(p, f), _k(x, _C2))
    p = _add(_mul(p, f), _k(x, _C1))
    p = _add(_mul(p, f), _k(x, _C0))
    two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    s = _rcp(_add(_mul(p, two_n), _k(x, 1.0)))
    return tl.where(x != x, x, s)


# ----------------------------------------------------------------------------------------- prologue
@triton.jit
def _gather_src(src_ptr, rows, rmask, N):
    t = tl.load(src_ptr + rows, mask=rmask, other=N)
    real = rmask & (t < N)
    return tl.where(real, t, 0), real


@triton.jit
def _swiglu_grads(da_ptr, h13_ptr, rows, cc, m, H, IS_BF16: tl.constexpr, FAST: tl.constexpr):
    """(dh1, dh3) at columns cc of [0, H) (reference.swiglu_grad_values, op for op) from da [P, H], h13 [P, 2H]."""
    base = rows[:, None] * (2 * H) + cc[None, :]
    g = _widen(_load_raw(da_ptr, rows[:, None] * H + cc[None, :], m, IS_BF16), IS_BF16)
    h1 = _widen(_load_raw(h13_ptr, base, m, IS_BF16), IS_BF16)
    h3 = _widen(_load_raw(h13_ptr, base + H, m, IS_BF16), IS_BF16)
    s = _sigmoid(h1, FAST)
    one = _k(s, 1.0)
    dsilu = _mul(s, _add(_mul(h1, _add(-s, one)), one))
    return _mul(_mul(g, h3), dsilu), _mul(g, _mul(h1, s))


@triton.jit
def _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE: tl.constexpr,
            K: tl.constexpr, WANT_DOT: tl.constexpr, IS_BF16: tl.constexpr, HALVES: tl.constexpr = False,
            FAST_SIGMOID: tl.constexpr = False):
    """(v, v2, dot): the fp32 tile [BM, BC] to quantize (rows int64 buffer rows, cols int32 output columns), and,
    MODE 1 with WANT_DOT, the per-row partial dot <dout, y> over these columns (else zeros). HALVES (MODE 3
    only): cols are in [0, H) and v / v2 are dh1 (output columns cols) / dh3 (cols + H) from ONE sigmoid of h1
    and one read of da, h1, h3; otherwise v2 is v."""
    dot = tl.zeros(rows.shape, dtype=tl.float32)
    if MODE == 0:  # dispatch: a = x [N, C], b = src
        t, real = _gather_src(b_ptr, rows, rmask, N)
        m = real[:, None] & cmask[None, :]
        v = _widen(_load_raw(a_ptr, t[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
    elif MODE == 1:  # combine backward: a = dout [N, C], b = src, c = pos [N*K], d = weights fp32 [N, K], e = y
        t, real = _gather_src(b_ptr, rows, rmask, N)
        w = tl.zeros(rows.shape, dtype=tl.float32)
        for j in tl.static_range(K):
            p = tl.load(c_ptr + t * K + j, mask=real, other=-1)
            wj = tl.load(d_ptr + t * K + j, mask=real, other=0.0)
            w = tl.where(p == rows, wj, w)
        m = real[:, None] & cmask[None, :]
        g = _widen(_load_raw(a_ptr, t[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
        v = _mul(w[:, None], g)
        if WANT_DOT:
            yv = _widen(_load_raw(e_ptr, rows[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
            dot = tl.sum(g * yv, 1)
    elif MODE == 2:  # SwiGLU: a = h13 [P, 2H]; C == H
        m = rmask[:, None] & cmask[None, :]
        base = rows[:, None] * (2 * H) + cols[None, :]
        h1 = _widen(_load_raw(a_ptr, base, m, IS_BF16), IS_BF16)
        h3 = _widen(_load_raw(a_ptr, base + H, m, IS_BF16), IS_BF16)
        v = _mul(_mul(h1, _sigmoid(h1, FAST_SIGMOID)), h3)
    elif HALVES:  # SwiGLU backward, both halves: a = da [P, H], b = h13 [P, 2H]; cols in [0, H)
        v, v2 = _swiglu_grads(a_ptr, b_ptr, rows, cols, rmask[:, None] & cmask[None, :], H, IS_BF16, FAST_SIGMOID)
    else:  # SwiGLU backward: a = da [P, H], b = h13 [P, 2H]; C == 2H, column c < H: dh1, else dh3
        hi = cols >= H
        dh1, dh3 = _swiglu_grads(a_ptr, b_ptr, rows, tl.where(hi, cols - H, cols), rmask[:, None] & cmask[None, :],
                                 H, IS_BF16, FAST_SIGMOID)
        v = tl.where(hi[None, :], dh3, dh1)
    if not HALVES:
        v2 = v
    return v, v2, dot


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile(P, CL, BM: tl.constexpr, BD: tl.constexpr):
    """This program's BM x BD tile of a [P, CL] walk (neighbouring programs walk along the columns). Only scalars
    go in: torch.compile's analysis of which tensors a kernel writes (triton_op launches) follows every argument
    of a call whose result feeds a store address, so addresses must not come out of a call that reads a tensor."""
    pid_m, pid_d = _tile_ids(P, CL, BM, BD, True)
    rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    cols = pid_d * BD + tl.arange(0, BD)
    return pid_m, pid_d, rows, cols, rows < P, cols < CL


@triton.jit
def _mx_store(v, pid_m, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C,
              QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr, COL_TILE: tl.constexpr,
              AMAX_FIRST: tl.constexpr, ROWS: tl.constexpr = True, COLS: tl.constexpr = True):
    """Quantize the tile v [BM, BD] (output columns cols; their 32-blocks kb) both ways and store it: the row copy,
    then the token-major copy (ROWS / COLS: only that copy). AMAX_FIRST: both amaxes are taken before the row copy
    is encoded (no other difference: same values, same bytes); for MODE 1 at 128 x 128 / 8 warps ptxas then needs
    128 registers instead of 143 (sm_90a), i.e. two programs per SM instead of one."""
    xr = tl.reshape(v, [BM, BD // QB, QB])
    ar = _amax_bits(xr, 2)
    xc = tl.reshape(v, [BM // QB, QB, BD])
    if AMAX_FIRST and COLS:
        ac = _col_amax(xc, ar, BM, BD, QB, COL_TILE)
    if ROWS:
        _mx_store_rows(xr, ar, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, C, QB, BM, BD, HW_CAST)
    if COLS:
        if not AMAX_FIRST:
            ac = _col_amax(xc, ar, BM, BD, QB, COL_TILE)
        _mx_store_cols(xc, ac, pid_m, rows, rmask, cols, cmask, qc_ptr, sc_ptr, P, C, QB, BM, BD, HW_CAST)


@triton.jit
def _col_amax(xc, ar, BM: tl.constexpr, BD: tl.constexpr, QB: tl.constexpr, COL_TILE: tl.constexpr):
    """Amax bits [BM // QB, BD] of the token-major blocks (QB tokens of one column; COL_TILE == BD: of all the
    tile's columns, i.e. the max of those rows' amaxes ar, no second pass over the values)."""
    if COL_TILE > 1:
        ac = tl.max(tl.reshape(tl.max(ar, axis=1), [BM // QB, QB]), axis=1)
        ac = tl.broadcast_to(ac[:, None], [BM // QB, BD])
    else:
        ac = _amax_bits(xc, 1)
    return ac


@triton.jit
def _mx_store_rows(xr, ar, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, C, QB: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr):
    """The row copy (blocks of QB along the features) of xr [BM, BD // QB, QB] with amax bits ar."""
    er = _exponent_from_amax_bits(ar)
    cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
    tl.store(qr_ptr + rows[:, None] * C + cols[None, :], tl.reshape(cr, [BM, BD]),
             mask=rmask[:, None] & cmask[None, :])
    sb = _scale_byte(ar, er).to(tl.uint8)
    sb = tl.reshape(tl.broadcast_to(sb[:, :, None], [BM, BD // QB, QB // 32]), [BM, BD // 32])
    tl.store(sr_ptr + rows[:, None] * (C // 32) + kb[None, :], sb, mask=rmask[:, None] & kmask[None, :])


@triton.jit
def _mx_store_cols(xc, ac, pid_m, rows, rmask, cols, cmask, qc_ptr, sc_ptr, P, C, QB: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr):
    """The token-major copy (blocks of QB tokens, stored transposed) of xc [BM // QB, QB, BD] with amax bits ac."""
    ec = _exponent_from_amax_bits(ac)
    cc = _encode(xc * _multiplier(ac, ec, HW_CAST)[:, None, :], (ac >= 0x7F800000)[:, None, :], HW_CAST)
    cc = tl.reshape(cc, [BM, BD])
    tl.store(qc_ptr + cols[:, None].to(tl.int64) * P + rows[None, :], tl.trans(cc),
             mask=cmask[:, None] & rmask[None, :])
    sc = _scale_byte(ac, ec).to(tl.uint8)
    sc = tl.reshape(tl.broadcast_to(sc[:, None, :], [BM // QB, QB // 32, BD]), [BM // 32, BD])
    mb = pid_m.to(tl.int64) * (BM // 32) + tl.arange(0, BM // 32)
    tl.store(sc_ptr + mb[:, None] * C + cols[None, :], sc, mask=(mb < P // 32)[:, None] & cmask[None, :])


@triton.jit
def _mx_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, dot_ptr, N, P, C, H,
               MODE: tl.constexpr, K: tl.constexpr, QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
               HW_CAST: tl.constexpr, IS_BF16: tl.constexpr, COL_TILE: tl.constexpr = 1, HALVES: tl.constexpr = False,
               AMAX_FIRST: tl.constexpr = False, ROWS: tl.constexpr = True, COLS: tl.constexpr = True,
               FAST_SIGMOID: tl.constexpr = False):
    # qr [P, C], sr [P, C/32]; qc [C, P], sc [P/32, C]; dot [C/BD, P] (MODE 1). QB: the scale block (32 or 128).
    # COL_TILE == BD (128): the token-major copy shares one scale per QB tokens x BD features (the max of the row
    # amaxes of those QB rows: no second reduction over the values).
    # HALVES (MODE 3): the tile's columns are in [0, H) and it writes dh1's (cols) and dh3's (cols + H) from one
    # sigmoid and one read of da / h1 / h3. AMAX_FIRST, ROWS, COLS: see _mx_store.
    CL = H if HALVES else C
    pid_m, pid_d, rows, cols, rmask, cmask = _tile(P, CL, BM, BD)
    v, v2, dot = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, True, IS_BF16,
                         HALVES, FAST_SIGMOID)
    if MODE == 1:
        tl.store(dot_ptr + pid_d * P + rows, dot, mask=rmask)
    kb = pid_d * (BD // 32) + tl.arange(0, BD // 32)
    kmask = kb < CL // 32
    _mx_store(v, pid_m, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C, QB, BM, BD,
              HW_CAST, COL_TILE, AMAX_FIRST, ROWS, COLS)
    if HALVES:
        _mx_store(v2, pid_m, rows, rmask, cols + H, cmask, kb + H // 32, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C,
                  QB, BM, BD, HW_CAST, COL_TILE, AMAX_FIRST, ROWS, COLS)


# The group ends, offs as int64 [E_PAD] padded with a huge end (a row's group = how many ends it is at or past), are
# loaded in each kernel's body, not by a helper: an atomic's address depends on them, and torch.compile's write
# analysis (see _tile) would take a helper's tensor argument, offs, for a written tensor.
_BIG_END = tl.constexpr(2147483647)


@triton.jit
def _group_of(ends, rows):
    """Expert group of each row (E for rows at or past offs[-1])."""
    return tl.sum((rows[:, None] >= ends[None, :]).to(tl.int32), 1)


@triton.jit
def _mag_bits(v):
    """int32 bits of |v| with NaN as inf (integer max == float max on them; NaN/inf -> a NaN scale)."""
    return tl.minimum(v.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 0x7F800000)


@triton.jit
def _col_max(ab, sel):
    return tl.max(tl.where(sel[:, None], ab, 0), 0)


@triton.jit
def _f8_amax_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, ramax_ptr, gamax_ptr, dot_ptr, offs_ptr, N, P, C, H, E,
                    MODE: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, SUB: tl.constexpr,
                    E_PAD: tl.constexpr, IS_BF16: tl.constexpr, FAST_SIGMOID: tl.constexpr = False):
    # fp8_rowwise pass 1: int32 bits of max |value| (NaN as inf) per row (ramax [P]) and per (expert group, column)
    # (gamax [E + 1, C]; row E: rows past offs[-1]); dot [n_strips, P] partial dots (MODE 1). A program walks
    # SUB row tiles of BM rows down one strip of BD columns (MODE 3: BD columns of [0, H), i.e. dh1's and dh3's):
    # the row maxima go out by one relaxed atomic max per row and tile, the column maxima stay in registers while
    # the rows belong to one group and go out once per group seen (max is order-free: deterministic). Atomics:
    # P * C / BD + C * (programs down a strip + group boundaries), instead of one per row and column per tile.
    HALVES: tl.constexpr = MODE == 3
    CL = H if HALVES else C  # columns this kernel walks
    n_d = tl.cdiv(CL, BD)
    pid = tl.program_id(0)
    pid_m = pid // n_d
    pid_d = pid - pid_m * n_d
    cols = pid_d * BD + tl.arange(0, BD)
    cmask = cols < CL
    ev = tl.arange(0, E_PAD)
    ends = tl.load(offs_ptr + ev, mask=ev < E, other=_BIG_END).to(tl.int64)
    row0 = pid_m.to(tl.int64) * (SUB * BM)
    cur = tl.sum((row0 >= ends).to(tl.int32), 0)  # the group whose column maxima the registers hold
    acc = tl.zeros([BD], dtype=tl.int32)
    acc2 = tl.zeros([BD], dtype=tl.int32)
    for i in range(SUB):
        rows = row0 + i * BM + tl.arange(0, BM)
        rmask = rows < P
        v, v2, dot = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, True,
                             IS_BF16, HALVES, FAST_SIGMOID)
        ab = _mag_bits(v)
        rmax = tl.max(ab, 1)
        ab2 = ab
        if HALVES:
            ab2 = _mag_bits(v2)
            rmax = tl.maximum(rmax, tl.max(ab2, 1))
        tl.atomic_max(ramax_ptr + rows, rmax, mask=rmask, sem="relaxed")
        if MODE == 1:
            tl.store(dot_ptr + pid_d * P + rows, dot, mask=rmask)
        g = _group_of(ends, rows)
        g1 = tl.max(tl.where(rmask, g, cur), 0)  # groups grow with the row: the last group of this tile
        if g1 != cur:  # a group boundary: flush the registers, write every group but the last, go on with it
            tl.atomic_max(gamax_ptr + cur * C + cols, acc, mask=cmask, sem="relaxed")
            if HALVES:
                tl.atomic_max(gamax_ptr + cur * C + H + cols, acc2, mask=cmask, sem="relaxed")
            for gg in range(cur, g1):
                sel = rmask & (g == gg)
                tl.atomic_max(gamax_ptr + gg * C + cols, _col_max(ab, sel), mask=cmask, sem="relaxed")
                if HALVES:
                    tl.atomic_max(gamax_ptr + gg * C + H + cols, _col_max(ab2, sel), mask=cmask, sem="relaxed")
            acc = tl.zeros([BD], dtype=tl.int32)
            acc2 = tl.zeros([BD], dtype=tl.int32)
            cur = g1
        sel = rmask & (g == cur)
        acc = tl.maximum(acc, _col_max(ab, sel))
        if HALVES:
            acc2 = tl.maximum(acc2, _col_max(ab2, sel))
    tl.atomic_max(gamax_ptr + cur * C + cols, acc, mask=cmask, sem="relaxed")
    if HALVES:
        tl.atomic_max(gamax_ptr + cur * C + H + cols, acc2, mask=cmask, sem="relaxed")


@triton.jit
def _pow2_scale(amax_bits):
    """kernels.float8_cast's amax_to_scale(amax, E4M3, round_to_pow2=True) from the int32 bits of amax (sign
    cleared, NaN as inf), in integers: 448 / a = 2^(6-E) * 7/m for a = m * 2^E, so the scale floored to a power
    of two is 2^(8-E), or 2^(7-E) where m > 1.75 (mantissa bits > 0x600000): 2^-e with e the MX exponent of
    kernels.mxfp8 (_exponent_from_amax_bits). amax below EPS = 1e-12 (zeros, subnormals) gives 448 / EPS floored,
    2^48, which caps the power; a non-finite amax gives NaN. tests/cpu/test_moe_kernels.py checks it against
    amax_to_scale on every binade and the edges."""
    e = (amax_bits >> 23) - 135 + ((amax_bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    k = tl.minimum(-e, 48)
    return tl.where(amax_bits >= 0x7F800000, float("nan"), ((k + 127) << 23).to(tl.float32, bitcast=True))


@triton.jit
def _f8_quant_store(v, rows, rmask, ocols, cmask, g, g0, g1, rs, q_ptr, qc_ptr, gamax_ptr, P, C, E,
                    HW_CAST: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """q[rows, ocols] = v with its row scales rs; qc[ocols, rows] = v with the scale of gamax[group(row), ocol]
    (zero bytes for rows past offs[-1]). The first group's scales are one [BD] vector; rows of further groups in
    the tile (rare) are re-encoded with theirs. (A store masked per group would lose the 16-byte stores.)
    ROWS / COLS: only that copy."""
    if ROWS:
        code = _encode(v * rs[:, None], (rs != rs)[:, None], HW_CAST)
        tl.store(q_ptr + rows[:, None] * C + ocols[None, :], code, mask=rmask[:, None] & cmask[None, :])
    if COLS:
        ga = tl.minimum(g0, E - 1)
        sc = _pow2_scale(tl.load(gamax_ptr + ga * C + ocols, mask=cmask, other=0))
        ct = _encode(v * sc[None, :], (sc != sc)[None, :], HW_CAST)
        for gg in range(ga + 1, tl.minimum(g1, E - 1) + 1):
            sg = _pow2_scale(tl.load(gamax_ptr + gg * C + ocols, mask=cmask, other=0))
            ct = tl.where((g == gg)[:, None], _encode(v * sg[None, :], (sg != sg)[None, :], HW_CAST), ct)
        ct = tl.where((g < E)[:, None], ct, 0).to(tl.uint8)
        tl.store(qc_ptr + ocols[:, None].to(tl.int64) * P + rows[None, :], tl.trans(ct),
                 mask=cmask[:, None] & rmask[None, :])


@triton.jit
def _f8_quant_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, q_ptr, s_ptr, qc_ptr, scale_ptr, ramax_ptr, gamax_ptr,
                     offs_ptr, N, P, C, H, E, MODE: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
                     BD: tl.constexpr, E_PAD: tl.constexpr, HW_CAST: tl.constexpr, IS_BF16: tl.constexpr,
                     ROWS: tl.constexpr = True, COLS: tl.constexpr = True, FAST_SIGMOID: tl.constexpr = False):
    # fp8_rowwise pass 2: q [P, C] with the row scales s [P] and qc [C, P] with scale[group(r), c] (scale fp32
    # [E, C]; zero bytes for rows past offs[-1]), every scale made here from pass 1's amax bits (_pow2_scale; the
    # first column strip writes s, the first row tile writes scale: no eager scale ops between the passes).
    # MODE 3: a tile of BD columns of [0, H) writes dh1's columns and dh3's (+H) from one sigmoid.
    # ROWS / COLS: only that copy (and its scales).
    HALVES: tl.constexpr = MODE == 3
    pid_m, pid_d, rows, cols, rmask, cmask = _tile(P, H if HALVES else C, BM, BD)
    v, v2, _ = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, False, IS_BF16,
                       HALVES, FAST_SIGMOID)
    rs = _pow2_scale(tl.load(ramax_ptr + rows, mask=rmask, other=0))
    if ROWS and pid_d == 0:
        tl.store(s_ptr + rows, rs, mask=rmask)
    if COLS and pid_m == 0:
        for gg in range(0, E):
            tl.store(scale_ptr + gg * C + cols, _pow2_scale(tl.load(gamax_ptr + gg * C + cols, mask=cmask)),
                     mask=cmask)
            if HALVES:
                tl.store(scale_ptr + gg * C + H + cols,
                         _pow2_scale(tl.load(gamax_ptr + gg * C + H + cols, mask=cmask)), mask=cmask)
    ev = tl.arange(0, E_PAD)
    g = _group_of(tl.load(offs_ptr + ev, mask=ev < E, other=_BIG_END).to(tl.int64), rows)
    g0 = tl.min(tl.where(rmask, g, E), 0)
    g1 = tl.max(tl.where(rmask, g, 0), 0)
    _f8_quant_store(v, rows, rmask, cols, cmask, g, g0, g1, rs, q_ptr, qc_ptr, gamax_ptr, P, C, E, HW_CAST, ROWS,
                    COLS)
    if HALVES:
        _f8_quant_store(v2, rows, rmask, cols + H, cmask, g, g0, g1, rs, q_ptr, qc_ptr, gamax_ptr, P, C, E, HW_CAST,
                        ROWS, COLS)


@triton.jit
def _combine_kernel(y_ptr, pos_ptr, w_ptr, out_ptr, N, D, K: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                    IS_BF16: tl.constexpr, OUT_BITS: tl.constexpr):
    # out [N, D] = sum_j w[t, j] * y[pos[t*K + j]] in slot order (fp32, each product and sum rounded once).
    # OUT_BITS (interpreter, bf16 out): round to bf16 on the bits (nearest even) and store int16.
    pid_n, pid_d = _tile_ids(N, D, BN, BD, True)
    t = pid_n.to(tl.int64) * BN + tl.arange(0, BN)
    cols = pid_d * BD + tl.arange(0, BD)
    tmask = t < N
    m = tmask[:, None] & (cols < D)[None, :]
    acc = tl.zeros([BN, BD], dtype=tl.float32)
    for j in tl.static_range(K):
        p = tl.load(pos_ptr + t * K + j, mask=tmask, other=0)
        w = tl.load(w_ptr + t * K + j, mask=tmask, other=0.0)
        yv = _widen(_load_raw(y_ptr, p[:, None] * D + cols[None, :], m, IS_BF16), IS_BF16)
        acc = _add(acc, _mul(w[:, None], yv))
    if OUT_BITS:
        b = acc.to(tl.int32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(acc != acc, 0x7FC0, r)
        out = r.to(tl.int16)
    else:
        out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t[:, None] * D + cols[None, :], out, mask=m)


# ----------------------------------------------------------------------------------------- launchers
# Fixed launch configs (block / mode -> BM, BD, num_warps), from ptxas -v for sm_90a (offline) and the first H100
# run: mxfp8 block 32 MODE 0/1 keep kernels/mxfp8/triton.py's best row+col tile (32 x 128, 2 warps: 109% / 94% of
# copy although ptxas reports small spills); SwiGLU modes take 32 x 64 / 4 warps (no spills; 32 x 128 / 2 warps
# spilled up to 1.7 KB; +3-7% measured). Block 128 needs 128 x 128 tiles (scale runs along both axes): MODE 3 takes
# 16 warps (0.765 -> 0.675 ms at dsv3_layer); MODE 1 stays at 8 warps (it spills 4.8 KB there, 69% of copy, but
# 16 warps measured slower: 0.718 -> 0.788 ms). fp8_rowwise: 32 x 64 / 4 warps, no spills.
# (H100 runs: benchmarks/results/moe_kernels-nvidia-h100-*-run{1,2}.json.) Block 128 MODE 3 with HALVES (one sigmoid
# for dh1 and dh3, 128 columns of [0, H) per tile): 0.679 -> 0.580 ms at dsv3_layer, 0.491 -> 0.417 at llama_moe,
# bit-identical (moe_kernels_mx128-*.json, 2026-11-23; row-chunked tiles with 2-4 programs per SM, tried in the same
# run, were 1.5-3x slower for every mode).
# (block, mode) -> (BM, BD, num_warps, HALVES); HALVES (MODE 3): a tile of BD columns of [0, H) writes dh1's and
# dh3's columns from one sigmoid (else each output column computes both halves and keeps one).
# 2026-11-25 (benchmarks/results/moe_kernels-nvidia-h100-2026-11-25.md, H100, CUDA-graph ms at dsv3_layer, every
# candidate byte-identical to the previous kernel): ptxas -v had been read WITHOUT the divisibility hints a real
# launch specializes on (16 | every size and pointer), which is where "MODE 1 spills 4.8 KB" came from; with them
# block-128 MODE 1 at 8 warps takes 143 registers, no spills: ONE program of 8 warps per SM. Taking both amaxes
# before encoding (AMAX_FIRST, MX_AMAX_FIRST below) brings it to 128, two programs per SM: 0.700 -> 0.570 ms
# (71 -> 87% of copy). MODE 0 (col_tile 128) with AMAX_FIRST 0.394 -> 0.366 ms. MODE 3 with HALVES at 8 warps
# (255 registers, 216 B of spills, yet faster than 16): 0.577 -> 0.520 ms. MODE 2 (col_tile 128: the tile scale
# from the row amaxes) 0.310 -> 0.240 ms at 16 warps (AMAX_FIRST there: 0.244). A persistent, software-pipelined
# walk (one program per SM, tl.range num_stages 2-3: the next tile's loads as cp.async into shared memory) was
# 1.5-6x SLOWER for every mode (moe_kernels_mx_ab-*-call1.json): do not retry it.
# 2026-11-27 (benchmarks/results/issue9_s21/, H100), with the fast sigmoid (SIGMOID below): block-128 MODE 3
# without HALVES (8 warps; HALVES had 249 registers, one program per SM) 0.402 -> 0.318 ms at dsv3_layer, 0.292 ->
# 0.234 at llama_moe, the same bytes; the exact sigmoid had made HALVES (one sigmoid per two outputs) the faster.
# Block 32 stays without: HALVES there 0.407 vs 0.394 ms.
MX_CONFIGS = {(32, 0): (32, 128, 2, False), (32, 1): (32, 128, 2, False), (32, 2): (32, 64, 4, False),
              (32, 3): (32, 64, 4, False), (128, 0): (128, 128, 8, False), (128, 1): (128, 128, 8, False),
              (128, 2): (128, 128, 8, False), (128, 3): (128, 128, 8, False)}
# (block, mode) whose _mx_kernel takes both amaxes before encoding (AMAX_FIRST: the same bytes, fewer registers)
MX_AMAX_FIRST = {(128, 0), (128, 1)}
# col_tile=128 (the tile spans the 128 features of a token-major scale): (block, mode) -> (BM, BD, num_warps)
# (ptxas sm_90a: (32, 2) at 2 warps spills 72 B, at 4 none; (128, 2) at 8 warps spills 44 B, at 16 none)
MX_COL_TILE_CONFIGS = {(32, 0): (32, 128, 2), (32, 2): (32, 128, 4), (128, 0): (128, 128, 8), (128, 2): (128, 128, 16)}
_MX_INTERP = {32: (32, 32, 4, True), 128: (128, 128, 4, True)}
# SwiGLU's sigmoid in the compiled kernels (MODE 2 and 3, both recipes): "fast" = the special-function unit's
# ex2.approx.ftz + rcp.approx.ftz; "exact" = reference._sigmoid op for op, the CPU reference's bits. The exact
# form's ~35 instructions per element (ptxas, sm_90a: MODE 2 at 16 warps 2416 SASS instructions, 128 registers;
# fast 944 and 64) made SwiGLU's kernels issue-bound: fast, MODE 2 runs at 94% of copy speed instead of 59%
# (benchmarks/results/issue9_s21/, H100). Its error is the exact form's bound (a few fp32 ulp); ~2e-6 of the fp8
# bytes differ from the exact form's, each by one e4m3 step (tests/gpu/test_moe_kernels_gpu.py). Under the
# interpreter (no GPU) both run the exact form. The value is a launch constexpr: a process that changes it after
# compiling must turn inductor's FX graph and AOTAutograd caches off (torch 2.11 served the graph compiled under
# the other value).
SIGMOID = "fast"
# fp8_rowwise (mode -> config; MODE 3's BD counts columns of [0, H), each worth a dh1 and a dh3 column):
#   pass 1 (BM, BD, SUB, num_warps): SUB row tiles per program down one column strip
#   pass 2 (BM, BD, num_warps)
F8_AMAX_CONFIGS = {0: (32, 256, 8, 4), 1: (32, 128, 8, 4), 2: (32, 128, 8, 4), 3: (32, 64, 8, 4)}
F8_QUANT_CONFIGS = {0: (32, 128, 4), 1: (32, 128, 4), 2: (32, 64, 4), 3: (32, 64, 4)}
_F8_AMAX_INTERP = (16, 32, 2, 4)
_F8_QUANT_INTERP = (16, 32, 4)
_COMBINE = (4, 512, 4)  # BN, BD, num_warps
_COMBINE_INTERP = (4, 32, 4)


def _check_device(t, who):
    if not (t.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: tensors are on {t.device}; the Triton kernels need CUDA tensors, or "
                           f"TRITON_INTERPRET=1 set before kernels.moe.triton is imported (CPU interpreter)")


def _launcher(kernel, traced: bool):
    """traced: the launch goes through torch.library.wrap_triton, so that inside a torch.library.triton_op
    torch.compile puts it into its generated code (kernels/moe/__init__.py's TRACED_LAUNCH); else the plain
    Python launcher (opaque custom ops, the interpreter)."""
    return wrap_triton(kernel) if traced else kernel


def _slots(made: bool, data: torch.Tensor, scale: torch.Tensor):
    """The (data, scale) pointer arguments of one copy: the copy's own tensors, or for a copy left out (never
    stored through: ROWS / COLS) a 16-byte spare each. Not another output: under torch.compile a traced launch is
    functionalized per argument, and one tensor in two argument slots would be cloned twice."""
    if made:
        return data, scale
    return (torch.empty(16, dtype=torch.uint8, device=data.device) for _ in range(2))


def quantize_values(mode, a, b=None, c=None, d=None, e=None, *, N, P, C, H, K, offs, recipe, block, who,
                    hw_cast=None, col_tile=1, traced=False, outputs=BOTH):
    """Make the MODE prologue's values (module docstring; a, b, c, d, e as _values reads them) and quantize them
    both ways. Returns (q [P, C], s, qt [C, P], st, dots) in reference.quantize_both's layouts; dots: the per-row
    partial dots <dout, y> [column tiles, P] for MODE 1, else None. outputs (reference.ROWS / TOKEN_MAJOR / BOTH):
    the copies made; one left out is returned as reference.unmade_rows / unmade_token_major and never written."""
    rows_on, cols_on = bool(outputs & ROWS), bool(outputs & TOKEN_MAJOR)
    if not (rows_on or cols_on) or (mode == 1 and outputs != BOTH):
        raise ValueError(f"{who}: outputs={outputs!r}; expected ROWS (1), TOKEN_MAJOR (2) or BOTH (3) "
                         f"(combine_backward makes both)")
    P_rows, P_cols = (P if rows_on else 0), (P if cols_on else 0)
    _check_device(a, who)
    dev = a.device
    hw = default_hw_cast(dev) if hw_cast is None else hw_cast
    if SIGMOID not in ("fast", "exact"):
        raise ValueError(f"{who}: kernels.moe.triton.SIGMOID = {SIGMOID!r}; expected 'fast' or 'exact'")
    fast = SIGMOID == "fast"
    a, is_bf16 = _as_kernel_input(a)
    if mode == 1:
        e, _ = _as_kernel_input(e)
    if mode == 3:
        b, _ = _as_kernel_input(b)
    args = [t if t is not None else a for t in (a, b, c, d, e)]  # unused pointer slots: any tensor
    u8, f32, f8 = torch.uint8, torch.float32, torch.float8_e4m3fn
    want_dot = mode == 1
    if recipe == "mxfp8":
        bm, bd, warps, halves = _MX_INTERP[block] if _INTERPRET else MX_CONFIGS[block, mode]
        if col_tile > 1:  # the tile must span the 128 features of a token-major scale
            bm, bd, warps = (bm, 128, warps) if _INTERPRET else MX_COL_TILE_CONFIGS[block, mode]
        halves = halves and mode == 3
        walked = C // 2 if halves else C
        n_d = triton.cdiv(walked, bd)
        q = torch.empty((P_rows, C), dtype=u8, device=dev)
        s = torch.empty((P_rows, C // 32), dtype=u8, device=dev)
        qt = torch.empty((C, P_cols), dtype=u8, device=dev)
        st = torch.empty((P_cols // 32, C), dtype=u8, device=dev)
        dots = torch.empty((n_d, P), dtype=f32, device=dev) if want_dot else None
        if P and C:
            grid = (triton.cdiv(P, bm) * n_d,)
            _launcher(_mx_kernel, traced)[grid](*args, *_slots(rows_on, q, s), *_slots(cols_on, qt, st),
                                                dots if want_dot else s, N, P, C, H, MODE=mode,
                                                K=K, QB=block, BM=bm, BD=bd, HW_CAST=hw, IS_BF16=is_bf16,
                                                COL_TILE=col_tile, HALVES=halves,
                                                AMAX_FIRST=(block, mode) in MX_AMAX_FIRST, ROWS=rows_on, COLS=cols_on,
                                                FAST_SIGMOID=fast, num_warps=warps)
        return q.view(f8), s, qt.view(f8), st.t(), dots
    # fp8_rowwise: pass 1 (row and group amax), the scales, pass 2 (both copies)
    E = offs.shape[0]
    q = torch.empty((P_rows, C), dtype=u8, device=dev)
    qt = torch.empty((C, P_cols), dtype=u8, device=dev)
    amax = torch.zeros((P + (E + 1) * C,), dtype=torch.int32, device=dev)  # one memset for both
    ramax, gamax = amax[:P], amax[P:].view(E + 1, C)
    am, ad, sub, aw = _F8_AMAX_INTERP if _INTERPRET else F8_AMAX_CONFIGS[mode]
    qm, qd, qw = _F8_QUANT_INTERP if _INTERPRET else F8_QUANT_CONFIGS[mode]
    walked = C // 2 if mode == 3 else C  # MODE 3: one program column covers dh1's and dh3's
    n_strips = triton.cdiv(walked, ad)
    dots = torch.empty((n_strips, P), dtype=f32, device=dev) if want_dot else None
    e_pad = triton.next_power_of_2(max(E, 2))
    if P and C:
        _launcher(_f8_amax_kernel, traced)[(triton.cdiv(P, am * sub) * n_strips,)](
            *args, ramax, gamax, dots if want_dot else gamax, offs, N, P, C, H, E, MODE=mode, K=K, BM=am, BD=ad,
            SUB=sub,
            E_PAD=e_pad, IS_BF16=is_bf16, FAST_SIGMOID=fast, num_warps=aw)
    if not (P and C):  # nothing to quantize: the scales of empty rows / groups by kernels.float8_cast's rule
        s = amax_to_scale(ramax[:P_rows].view(f32), E4M3, round_to_pow2=True)  # [P]
        scale = amax_to_scale(gamax[:E if cols_on else 0].view(f32), E4M3, round_to_pow2=True)
        return q.view(f8), s, qt.view(f8), scale, dots
    # pass 2 makes the scales (the same rule, from the amax bits) as it writes the copies
    s = torch.empty((P_rows,), dtype=f32, device=dev)
    scale = torch.empty((E if cols_on else 0, C), dtype=f32, device=dev)
    _launcher(_f8_quant_kernel, traced)[(triton.cdiv(P, qm) * triton.cdiv(walked, qd),)](
        *args, *_slots(rows_on, q, s), *_slots(cols_on, qt, scale), ramax, gamax, offs, N, P, C, H, E, MODE=mode,
        K=K, BM=qm, BD=qd, E_PAD=e_pad, HW_CAST=hw, IS_BF16=is_bf16, ROWS=rows_on, COLS=cols_on, FAST_SIGMOID=fast,
        num_warps=qw)
    return q.view(f8), s, qt.view(f8), scale, dots


def combine_triton(y, pos, weights, traced=False):
    """out [N, D] = sum_j weights[t, j] * y[pos[t*k + j]] (reference.combine_reference, bit for bit)."""
    _check_device(y, "combine")
    n, k = weights.shape
    D = y.shape[1]
    out = torch.empty((n, D), dtype=y.dtype, device=y.device)
    if n and D:
        yh, is_bf16 = _as_kernel_input(y)
        out_bits = _INTERPRET and y.dtype == torch.bfloat16
        bn, bd, warps = _COMBINE_INTERP if _INTERPRET else _COMBINE
        grid = (triton.cdiv(n, bn) * triton.cdiv(D, bd),)
        _launcher(_combine_kernel, traced)[grid](yh, pos, weights, out.view(torch.int16) if out_bits else out, n, D,
                                                 K=k, BN=bn, BD=bd, IS_BF16=is_bf16, OUT_BITS=out_bits,
                                                 num_warps=warps)
    return out
