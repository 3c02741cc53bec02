"""Triton kernels of the fused MoE expert path: bit-identical to kernels/moe/reference.py (dweights aside).

One prologue (_values) makes the fp32 tile a kernel quantizes, by MODE:
  0 dispatch        x[src[r]] (0 where src[r] == N)                          x [N, D], src [P]
  1 combine bwd     weights[t, slot] * dout[t], t = src[r], slot: pos[t*k + slot] == r (0 on padding rows);
                    also the partial dot <dout[t], y[r]> over the tile's columns (dweights)
  2 SwiGLU fwd      silu(h1) * h3                                              h13 [P, 2H]
  3 SwiGLU bwd      [dh1 | dh3] (reference.swiglu_grad_values)                da [P, H], h13 [P, 2H]
and two ways to quantize it:
  _mx_kernel        mxfp8, ONE pass: a BM x BD tile -> row copy (blocks of `block` along the features) AND the
                    token-major copy (blocks of `block` tokens, stored transposed [C, P]; its scales [P/32, C]).
  _f8_rows_kernel   fp8_rowwise rows: whole rows per iteration (scale per row), persistent programs; also the
                    per-(expert group, column) amax of the token-major copy: a running column max per program,
                    flushed with one int32 atomic max per column whenever the group changes (max is order-free:
                    deterministic).
  _f8_cols_kernel   fp8_rowwise token-major copy: a second read of the inputs once the group scales are known
                    (a per-group column scale needs the whole group's amax first; holding a group on chip does
                    not fit), stored transposed [C, P].
The quantization arithmetic is kernels/mxfp8/triton.py's (_encode, _exponent_from_amax_bits, ...) and
kernels/float8_cast/triton.py's (_pow2_scale); nothing is re-derived here.

Floating-point order: products and sums that the reference rounds one at a time (combine's weighted sum, the
weighting of dy, SwiGLU) use libdevice mul_rn / add_rn / div_rn when compiled, so ptxas cannot contract them
into FMAs; under the interpreter plain numpy fp32 ops round the same way.
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton
from triton.language.extra.cuda import libdevice

from kernels.float8_cast.reference import E4M3, amax_to_scale
from kernels.float8_cast.triton import _pow2_scale, _sm_count
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

from .reference import EXP2_COEFFS, EXP2_HI, EXP2_LO, NEG_LOG2E

if _INTERPRET:
    _fix_interpreter_scalar_index()  # run-time loop bounds (persistent row kernel)

MAX_ROW = 16384  # widest fp8_rowwise row one program holds (elements)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (tl.constexpr(c) for c in EXP2_COEFFS)
_NEG_LOG2E = tl.constexpr(NEG_LOG2E)
_LO = tl.constexpr(EXP2_LO)
_HI = tl.constexpr(EXP2_HI)
_RN = tl.constexpr(not _INTERPRET)  # libdevice *_rn when compiled


# ----------------------------------------------------------------------------------------- rounded ops
@triton.jit
def _mul(a, b):
    a, b = tl.broadcast(a, b)
    if _RN:
        r = libdevice.mul_rn(a, b)
    else:
        r = a * b
    return r


@triton.jit
def _add(a, b):
    a, b = tl.broadcast(a, b)
    if _RN:
        r = libdevice.add_rn(a, b)
    else:
        r = a + b
    return r


@triton.jit
def _div(a, b):
    a, b = tl.broadcast(a, b)
    if _RN:
        r = libdevice.div_rn(a, b)
    else:
        r = a / b
    return r


@triton.jit
def _k(x, c):
    """The constant c as an fp32 tensor shaped like x (the *_rn helpers take tensors)."""
    return tl.full(x.shape, c, tl.float32)


@triton.jit
def _sigmoid(x):
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
    one = _k(x, 1.0)
    s = _div(one, _add(_mul(p, two_n), one))
    return tl.where(x != x, x, s)


# ----------------------------------------------------------------------------------------- prologue
@triton.jit
def _gather_src(src_ptr, rows, rmask, N):
    t = tl.load(src_ptr + rows, mask=rmask, other=N)
    real = rmask & (t < N)
    return tl.where(real, t, 0), real


@triton.jit
def _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE: tl.constexpr,
            K: tl.constexpr, WANT_DOT: tl.constexpr, IS_BF16: tl.constexpr):
    """The fp32 tile [BM, BC] to quantize (rows int64 buffer rows, cols int32 output columns) and, MODE 1 with
    WANT_DOT, the per-row partial dot <dout, y> over these columns (else zeros)."""
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
        v = _mul(_mul(h1, _sigmoid(h1)), h3)
    else:  # SwiGLU backward: a = da [P, H], b = h13 [P, 2H]; C == 2H, column c < H: dh1, else dh3
        m = rmask[:, None] & cmask[None, :]
        hi = cols >= H
        cc = tl.where(hi, cols - H, cols)
        base = rows[:, None] * (2 * H) + cc[None, :]
        g = _widen(_load_raw(a_ptr, rows[:, None] * H + cc[None, :], m, IS_BF16), IS_BF16)
        h1 = _widen(_load_raw(b_ptr, base, m, IS_BF16), IS_BF16)
        h3 = _widen(_load_raw(b_ptr, base + H, m, IS_BF16), IS_BF16)
        s = _sigmoid(h1)
        one = _k(s, 1.0)
        dsilu = _mul(s, _add(_mul(h1, _add(-s, one)), one))
        dh1 = _mul(_mul(g, h3), dsilu)
        dh3 = _mul(g, _mul(h1, s))
        v = tl.where(hi[None, :], dh3, dh1)
    return v, dot


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _mx_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, dot_ptr, N, P, C, H,
               MODE: tl.constexpr, K: tl.constexpr, QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
               HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # qr [P, C], sr [P, C/32]; qc [C, P], sc [P/32, C]; dot [C/BD, P] (MODE 1). QB: the scale block (32 or 128)
    pid_m, pid_d = _tile_ids(P, C, BM, BD, True)
    rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    cols = pid_d * BD + tl.arange(0, BD)
    rmask = rows < P
    cmask = cols < C
    v, dot = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, True, IS_BF16)
    if MODE == 1:
        tl.store(dot_ptr + pid_d * P + rows, dot, mask=rmask)
    mask = rmask[:, None] & cmask[None, :]
    # rows: blocks of QB along the features
    xr = tl.reshape(v, [BM, BD // QB, QB])
    ar = _amax_bits(xr, 2)
    er = _exponent_from_amax_bits(ar)
    cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
    tl.store(qr_ptr + rows[:, None] * C + cols[None, :], tl.reshape(cr, [BM, BD]), mask=mask)
    sb = _scale_byte(ar, er).to(tl.uint8)
    sb = tl.reshape(tl.broadcast_to(sb[:, :, None], [BM, BD // QB, QB // 32]), [BM, BD // 32])
    kb = pid_d * (BD // 32) + tl.arange(0, BD // 32)
    tl.store(sr_ptr + rows[:, None] * (C // 32) + kb[None, :], sb, mask=rmask[:, None] & (kb < C // 32)[None, :])
    # token-major: blocks of QB tokens, stored transposed
    xc = tl.reshape(v, [BM // QB, QB, BD])
    ac = _amax_bits(xc, 1)
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
def _group_of(offs_ptr, E, rows, E_PAD: tl.constexpr):
    """Expert group of each row (E for rows at or past offs[-1])."""
    ev = tl.arange(0, E_PAD)
    ends = tl.load(offs_ptr + ev, mask=ev < E, other=2147483647).to(tl.int64)
    return tl.sum((rows[:, None] >= ends[None, :]).to(tl.int32), 1)


@triton.jit
def _f8_rows_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, q_ptr, s_ptr, amax_ptr, dot_ptr, offs_ptr, N, P, C, H, E,
                    n_iters, MODE: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, E_PAD: tl.constexpr,
                    HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # One row per iteration, rows pid, pid + programs, ...: q [P, C] e4m3, s [P] fp32, dot [1, P] (MODE 1),
    # amax int32 [E + 1, C]: bits of max |value| (NaN as inf) per (group, column), row E for rows past offs[-1].
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BC)
    cmask = cols < C
    cur = pid * 0 - 1
    cmax = tl.zeros([BC], dtype=tl.int32)
    for i in range(n_iters):
        row = pid + i * n_prog
        rows = row.to(tl.int64) + tl.arange(0, 1)
        rmask = rows < P
        v, dot = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, True,
                         IS_BF16)
        ab = tl.minimum(v.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 0x7F800000)  # |v| bits, NaN -> inf
        scale = _pow2_scale(tl.max(ab, 1).to(tl.float32, bitcast=True))
        code = _encode(v * scale[:, None], (scale != scale)[:, None], HW_CAST)
        tl.store(q_ptr + rows[:, None] * C + cols[None, :], code, mask=rmask[:, None] & cmask[None, :])
        tl.store(s_ptr + rows, scale, mask=rmask)
        if MODE == 1:
            tl.store(dot_ptr + rows, dot, mask=rmask)
        g = tl.max(_group_of(offs_ptr, E, rows, E_PAD), 0)
        flush = g != cur
        tl.atomic_max(amax_ptr + tl.maximum(cur, 0) * C + cols, cmax, mask=cmask & flush & (cur >= 0))
        cmax = tl.where(flush, 0, cmax)
        cur = g
        cmax = tl.maximum(cmax, tl.max(ab, 0))
    tl.atomic_max(amax_ptr + tl.maximum(cur, 0) * C + cols, cmax, mask=cmask & (cur >= 0))


@triton.jit
def _f8_cols_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, qc_ptr, scale_ptr, offs_ptr, N, P, C, H, E,
                    MODE: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, E_PAD: tl.constexpr,
                    HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # qc [C, P] e4m3: value[r, c] * scale[group(r), c] (scale fp32 [E, C]); zero bytes for rows past offs[-1]
    pid_m, pid_d = _tile_ids(P, C, BM, BD, True)
    rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    cols = pid_d * BD + tl.arange(0, BD)
    rmask = rows < P
    cmask = cols < C
    v, _ = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, False, IS_BF16)
    g = _group_of(offs_ptr, E, rows, E_PAD)
    in_group = g < E
    sc = tl.load(scale_ptr + tl.minimum(g, E - 1)[:, None] * C + cols[None, :], mask=rmask[:, None] & cmask[None, :],
                 other=0.0)
    code = _encode(v * sc, sc != sc, HW_CAST)
    code = tl.where(in_group[:, None], code, 0).to(tl.uint8)
    tl.store(qc_ptr + cols[:, None].to(tl.int64) * P + rows[None, :], tl.trans(code),
             mask=cmask[:, None] & rmask[None, :])


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
# Fixed launch configs (traceable by torch.compile as triton ops). mxfp8: the tile of
# kernels/mxfp8/triton.py's best row+col config on H100/H200 (32 x 128, 2 warps) for block 32; one 128 x 128
# tile (8 warps, as kernels/grouped_gemm/quant_triton.py) for block 128.
_MX_CONFIGS = {32: (32, 128, 2), 128: (128, 128, 8)}  # block -> (BM, BD, num_warps)
_MX_INTERP = {32: (32, 32, 4), 128: (128, 128, 4)}
_F8_COLS = (64, 128, 4)  # BM, BD, num_warps (float8_cast's transposing cast)
_F8_COLS_INTERP = (16, 32, 4)
_COMBINE = (4, 512, 4)  # BN, BD, num_warps
_COMBINE_INTERP = (4, 32, 4)


def _check_device(t, who):
    if not (t.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: tensors are on {t.device}; the Triton kernels need CUDA tensors, or "
                           f"TRITON_INTERPRET=1 set before kernels.moe.triton is imported (CPU interpreter)")


def quantize_values(mode, a, b=None, c=None, d=None, e=None, *, N, P, C, H, K, offs, recipe, block, who,
                    hw_cast=None):
    """Make the MODE prologue's values (module docstring; a, b, c, d, e as _values reads them) and quantize them
    both ways. Returns (q [P, C], s, qt [C, P], st, dots) in reference.quantize_both's layouts; dots: the per-row
    partial dots <dout, y> [column tiles, P] for MODE 1, else None."""
    _check_device(a, who)
    dev = a.device
    hw = default_hw_cast(dev) if hw_cast is None else hw_cast
    a, is_bf16 = _as_kernel_input(a)
    if mode == 1:
        e, _ = _as_kernel_input(e)
    if mode == 3:
        b, _ = _as_kernel_input(b)
    args = [t if t is not None else a for t in (a, b, c, d, e)]  # unused pointer slots: any tensor
    u8, f32, f8 = torch.uint8, torch.float32, torch.float8_e4m3fn
    want_dot = mode == 1
    if recipe == "mxfp8":
        bm, bd, warps = (_MX_INTERP if _INTERPRET else _MX_CONFIGS)[block]
        n_d = triton.cdiv(C, bd)
        q = torch.empty((P, C), dtype=u8, device=dev)
        s = torch.empty((P, C // 32), dtype=u8, device=dev)
        qt = torch.empty((C, P), dtype=u8, device=dev)
        st = torch.empty((P // 32, C), dtype=u8, device=dev)
        dots = torch.empty((n_d, P), dtype=f32, device=dev) if want_dot else None
        if P and C:
            grid = (triton.cdiv(P, bm) * n_d,)
            wrap_triton(_mx_kernel)[grid](*args, q, s, qt, st, dots if want_dot else s, N, P, C, H, MODE=mode, K=K,
                                          QB=block, BM=bm, BD=bd, HW_CAST=hw, IS_BF16=is_bf16, num_warps=warps)
        return q.view(f8), s, qt.view(f8), st.t(), dots
    # fp8_rowwise
    if C > MAX_ROW:
        raise ValueError(f"{who}: rows of {C} features; the fp8_rowwise kernel holds at most {MAX_ROW} per program")
    E = offs.shape[0]
    q = torch.empty((P, C), dtype=u8, device=dev)
    s = torch.empty((P,), dtype=f32, device=dev)
    amax = torch.zeros((E + 1, C), dtype=torch.int32, device=dev)
    dots = torch.empty((1, P), dtype=f32, device=dev) if want_dot else None
    qt = torch.empty((C, P), dtype=u8, device=dev)
    e_pad = triton.next_power_of_2(max(E, 2))
    if P and C:
        bc = triton.next_power_of_2(max(C, 16))
        warps = min(16, max(4, bc // 1024))
        programs = min(P, 4 * _sm_count(dev))
        wrap_triton(_f8_rows_kernel)[(programs,)](*args, q, s, amax, dots if want_dot else s, offs, N, P, C, H, E,
                                                  triton.cdiv(P, programs), MODE=mode, K=K, BC=bc, E_PAD=e_pad,
                                                  HW_CAST=hw, IS_BF16=is_bf16, num_warps=warps)
    scale = amax_to_scale(amax[:E].view(f32), E4M3, round_to_pow2=True)  # [E, C]
    if P and C:
        bm, bd, warps = _F8_COLS_INTERP if _INTERPRET else _F8_COLS
        grid = (triton.cdiv(P, bm) * triton.cdiv(C, bd),)
        wrap_triton(_f8_cols_kernel)[grid](*args, qt, scale, offs, N, P, C, H, E, MODE=mode, K=K, BM=bm, BD=bd,
                                           E_PAD=e_pad, HW_CAST=hw, IS_BF16=is_bf16, num_warps=warps)
    return q.view(f8), s, qt.view(f8), scale, dots


def combine_triton(y, pos, weights):
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
        wrap_triton(_combine_kernel)[grid](yh, pos, weights, out.view(torch.int16) if out_bits else out, n, D, K=k,
                                           BN=bn, BD=bd, IS_BF16=is_bf16, OUT_BITS=out_bits, num_warps=warps)
    return out
