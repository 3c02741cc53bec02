"""The fused MoE expert-path kernels in plain PyTorch (any device): the emulated twin of kernels/moe/triton.py.

Every function here returns exactly the bytes the Triton kernels write (tests compare them bit for bit), except
combine_backward's dweights, a dot product over the model dim whose fp32 summation order the kernels choose
(stated tolerance in tests/cpu/test_moe_kernels.py). The quantization rules are not re-derived here:
  mxfp8        kernels.grouped_gemm.quant.to_mxfp8_blocked (kernels.mxfp8's format, one E8M0 scale per
               1 x `block` run, written into each 1x32 block it covers)
  fp8_rowwise  kernels.float8_cast.reference: amax_to_scale(amax, e4m3, round_to_pow2=True), to_float8
               (scale multiplies into float8 range: value = data / scale; a NaN/inf in a scale group gives a
               NaN scale and NaN data)

Row-quantized ("rows", the fprop / dgrad operand of a grouped GEMM) = along the feature axis:
  mxfp8        data e4m3 [P, C], scale uint8 [P, C/32]
  fp8_rowwise  data e4m3 [P, C], scale fp32 [P]                      (one per row)
Token-major copy ("cols", the wgrad operand) = transposed [C, P], quantized along tokens:
  mxfp8        data e4m3 [C, P] contiguous, scale uint8 [C, P/32]: blocks of `block` tokens from token 0, stored as
               a transposed view of a row-major [P/32, C] buffer (the kernels write whole sectors that way;
               .contiguous() gives the row-major copy where a consumer wants one)
  fp8_rowwise  data e4m3 [C, P] contiguous, scale fp32 [E, C]: one scale per (expert group, feature) over the
               group's tokens (the 2d x 2d torch._scaled_grouped_mm takes it flattened: scale.reshape(-1)).
               Rows at or past offs[-1] (none in an MoE buffer) are written as zero bytes.

SwiGLU is computed with one fixed sequence of correctly rounded fp32 operations (see _sigmoid), so PyTorch and
Triton give the same bits: torch's silu and Triton's exp differ from each other in the last bits. The compiled
Triton kernels run a faster sigmoid by default (kernels.moe.triton.SIGMOID = "fast"): within the same error
bound, not the same bits; "exact" gives this module's.
"""
from __future__ import annotations

import math

import torch

from kernels.float8_cast.reference import E4M3, abs_amax, amax_to_scale, to_float8
from kernels.grouped_gemm.quant import to_mxfp8_blocked

RECIPES = ("fp8_rowwise", "mxfp8")
MX_BLOCKS = (32, 128)

# exp2 on [-0.5, 0.5]: Taylor coefficients ln2^k / k! (fp32); truncation error < 6e-9, below fp32's ulp at 1
_LN2 = 0.6931471805599453
EXP2_COEFFS = tuple(float(torch.tensor(_LN2 ** k / math.factorial(k), dtype=torch.float32)) for k in range(8))
NEG_LOG2E = float(torch.tensor(-1.4426950408889634, dtype=torch.float32))
EXP2_LO, EXP2_HI = -64.0, 127.0  # the exponent argument is clamped here: 2^-64 and 2^127 already saturate sigmoid


# ----------------------------------------------------------------------------------------------- quantization
def row_group(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """Expert group of every buffer row (int64 [rows]); len(offs) for rows at or past offs[-1]."""
    r = torch.arange(rows, device=offs.device, dtype=torch.int64)
    return torch.searchsorted(offs.to(torch.int64), r, right=True)


def quantize_rows(v: torch.Tensor, recipe: str, block: int):
    """v fp32 [P, C] -> (data e4m3 [P, C], scale) along the feature axis (module docstring)."""
    if recipe == "mxfp8":
        return to_mxfp8_blocked(v, -1, block, 1)
    scale = amax_to_scale(abs_amax(v, 1), E4M3, round_to_pow2=True)
    return to_float8(v, scale[:, None], E4M3), scale


def quantize_token_major(v: torch.Tensor, offs: torch.Tensor, recipe: str, block: int, col_tile: int = 1):
    """v fp32 [P, C] -> (data e4m3 [C, P], scale) along the token axis (module docstring). mxfp8 col_tile=128:
    one scale per `block` tokens x 128 features (what the weight-tiled wgrad kernels declare as a_tile=128)."""
    P, C = v.shape
    if recipe == "mxfp8":
        data, scale = to_mxfp8_blocked(v.t(), -1, block, col_tile)  # [C, P], [C, P/32]
        return data, scale.t().contiguous().t()
    E = offs.shape[0]
    g = row_group(offs, P)
    a = v.abs()
    a = torch.where(torch.isnan(a), torch.full_like(a, float("inf")), a)
    amax = torch.zeros(E + 1, C, dtype=torch.float32, device=v.device)
    amax = amax.scatter_reduce(0, g[:, None].expand(P, C), a, "amax", include_self=True)
    scale = amax_to_scale(amax[:E], E4M3, round_to_pow2=True)  # [E, C]
    row_scale = torch.cat([scale, scale.new_zeros(1, C)])[g]  # [P, C]
    data = to_float8(v, row_scale, E4M3).view(torch.uint8)
    data = torch.where((g < E)[:, None], data, torch.zeros_like(data))  # rows past offs[-1]: zero bytes
    return data.t().contiguous().view(E4M3), scale


ROWS, TOKEN_MAJOR, BOTH = 1, 2, 3  # dispatch_quantize's `outputs`: which copies it makes


def unmade_rows(ref: torch.Tensor, C: int, recipe: str):
    """What stands for a row copy that was not made: (data [0, C], scale [0, C/32] (mxfp8) / [0] (fp8_rowwise))."""
    if recipe == "mxfp8":
        return ref.new_empty((0, C), dtype=E4M3), ref.new_empty((0, C // 32), dtype=torch.uint8)
    return ref.new_empty((0, C), dtype=E4M3), ref.new_empty((0,), dtype=torch.float32)


def unmade_token_major(ref: torch.Tensor, C: int, recipe: str):
    """What stands for a token-major copy that was not made: (data [C, 0], scale [C, 0] (mxfp8, a transposed
    view as the made one) / [0, C] (fp8_rowwise))."""
    if recipe == "mxfp8":
        return ref.new_empty((C, 0), dtype=E4M3), ref.new_empty((0, C), dtype=torch.uint8).t()
    return ref.new_empty((C, 0), dtype=E4M3), ref.new_empty((0, C), dtype=torch.float32)


def quantize_both(v, offs, recipe, block, col_tile=1, outputs=BOTH):
    """(rows data, scale, token-major data, scale); a copy `outputs` leaves out is unmade_rows / unmade_token_major."""
    C = v.shape[1]
    rows = quantize_rows(v, recipe, block) if outputs & ROWS else unmade_rows(v, C, recipe)
    cols = (quantize_token_major(v, offs, recipe, block, col_tile) if outputs & TOKEN_MAJOR
            else unmade_token_major(v, C, recipe))
    return (*rows, *cols)


# ----------------------------------------------------------------------------------------------- SwiGLU
def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + 2^t), t = clamp(x * -log2(e), -64, 127), 2^t = 2^n * p(t - n) with n = floor(t + 1/2) and p a
    degree-7 polynomial (Horner). Every step is ONE correctly rounded fp32 op, in this order, with nothing fused
    (the Triton twin uses mul.rn / add.rn / rcp.rn), so both sides give the same bits. Relative error: a few ulp
    plus |x| * 2^-24 (t rounded to fp32 carries through 2^t; it matters only where sigmoid is tiny); for
    x < -88 the clamp gives ~2^-127 instead of a smaller value (silu's absolute error there < 1e-36).
    NaN in -> NaN out."""
    t = (x * NEG_LOG2E).clamp(EXP2_LO, EXP2_HI)
    n = torch.floor(t + 0.5)
    f = t - n
    p = torch.full_like(f, EXP2_COEFFS[7])
    for c in EXP2_COEFFS[6::-1]:
        p = p * f + c
    two_n = ((n.to(torch.int32) + 127) << 23).view(torch.float32)  # n in [-64, 127]: normal, exact
    e = p * two_n
    s = torch.reciprocal(1.0 + e)  # IEEE 1/x (Triton: rcp.rn.f32)
    return torch.where(torch.isnan(x), x, s)


def swiglu_values(h13: torch.Tensor) -> torch.Tensor:
    """h13 [P, 2H] -> a = silu(h1) * h3 in fp32 [P, H] (h1 = h13[:, :H], h3 = h13[:, H:])."""
    H = h13.shape[1] // 2
    h1, h3 = h13[:, :H].float(), h13[:, H:].float()
    return (h1 * _sigmoid(h1)) * h3


def swiglu_grad_values(da: torch.Tensor, h13: torch.Tensor) -> torch.Tensor:
    """da [P, H], h13 [P, 2H] -> [dh1 | dh3] fp32 [P, 2H]: dh1 = (da * h3) * (s * (1 + h1 * (1 - s))),
    dh3 = da * (h1 * s), s = sigmoid(h1) (this op order, each op rounded once)."""
    H = h13.shape[1] // 2
    h1, h3, g = h13[:, :H].float(), h13[:, H:].float(), da.float()
    s = _sigmoid(h1)
    dsilu = s * (1.0 + h1 * (1.0 - s))
    return torch.cat([(g * h3) * dsilu, g * (h1 * s)], dim=1)


# ----------------------------------------------------------------------------------------------- the ops
def gather_rows(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """fp32 [P, D]: row r = x[src[r]], zero where src[r] == N (padding)."""
    n = x.shape[0]
    if n == 0:
        return x.new_zeros(src.shape[0], x.shape[1], dtype=torch.float32)
    v = x.float().index_select(0, src.clamp(max=n - 1))
    return torch.where((src < n)[:, None], v, torch.zeros_like(v))


def dispatch_quantize_reference(x, src, offs, recipe, block, col_tile=1, outputs=BOTH):
    """(xq [P, D], xs, xtq [D, P], xts): x's rows gathered into expert order (src == N -> zero row), quantized;
    `outputs` (ROWS, TOKEN_MAJOR, BOTH) says which copies are made (quantize_both)."""
    return quantize_both(gather_rows(x, src), offs, recipe, block, col_tile, outputs)


def combine_reference(y, pos, weights):
    """out[t] = sum_j weights[t, j] * y[pos[t*k + j]], slot order, fp32 (one rounding per product and per sum,
    starting from 0), cast to y.dtype."""
    n, k = weights.shape
    D = y.shape[1]
    yp = y.index_select(0, pos).view(n, k, D).float()
    acc = torch.zeros(n, D, dtype=torch.float32, device=y.device)
    for j in range(k):
        acc = acc + weights[:, j:j + 1] * yp[:, j]
    return acc.to(y.dtype)


def combine_backward_values(dout, pos, weights, src):
    """dy fp32 [P, D]: weights[t, slot] * dout[t] on the row holding (t, slot); 0 on padding rows."""
    n, k = weights.shape
    P = src.shape[0]
    pair = torch.full((P,), -1, dtype=torch.int64, device=src.device)
    pair[pos] = torch.arange(n * k, device=src.device)
    real = src < n
    if n * k == 0:
        return dout.new_zeros(P, dout.shape[1], dtype=torch.float32)
    w = weights.reshape(-1)[pair.clamp(min=0)]
    g = dout.float().index_select(0, src.clamp(max=n - 1))
    v = w[:, None] * g
    return torch.where(real[:, None], v, torch.zeros_like(v))


def combine_backward_reference(dout, y, pos, weights, src, offs, recipe, block):
    """(dyq [P, D], dys, dytq [D, P], dyts, dweights [N, k] fp32): dy quantized for w2's dgrad (rows) and wgrad
    (token-major); dweights[t, j] = <dout[t], y[pos[t*k + j]]> in fp32."""
    n, k = weights.shape
    v = combine_backward_values(dout, pos, weights, src)
    dw = (dout.float()[:, None, :] * y.index_select(0, pos).view(n, k, y.shape[1]).float()).sum(-1)  # n may be 0
    return (*quantize_both(v, offs, recipe, block), dw)


def swiglu_quantize_reference(h13, offs, recipe, block, col_tile=1):
    """(aq [P, H], as, atq [H, P], ats) for a = silu(h1) * h3."""
    return quantize_both(swiglu_values(h13), offs, recipe, block, col_tile)


def swiglu_quantize_backward_reference(da, h13, offs, recipe, block):
    """(dq [P, 2H], ds, dtq [2H, P], dts) for [dh1 | dh3]."""
    return quantize_both(swiglu_grad_values(da, h13), offs, recipe, block)
