"""Float8 (E4M3 / E5M2) scaling with one scale per tensor, row or column: the plain PyTorch rule and the
reference of the Triton casts beside it (kernels/float8_cast/triton.py).

Convention (torchao's): `scale` multiplies the high-precision tensor into float8 range, data / scale gives it
back. `amax_to_scale` is the ONE rule turning an absolute maximum into such a scale; titan_fp8.float8.scaling
re-exports it for every recipe except MXFP8 (whose E8M0 rule is kernels/mxfp8's).

Edge cases:
- amax == 0 (all-zero tensor, row or column): amax is clamped to EPS, so the scale is finite and zeros stay
  zeros.
- non-finite amax (a NaN or inf anywhere in the scale group): the scale is NaN, so every value of the group
  casts to NaN and the failure stays visible in the loss. (A plain 448/inf would give scale 0 and silently
  turn the group into zeros.)
"""
from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
EPS = 1e-12


def amax_to_scale(amax: torch.Tensor, float8_dtype: torch.dtype, round_to_pow2: bool = False) -> torch.Tensor:
    """fp32 scale = finfo(float8_dtype).max / max(amax, EPS); NaN where amax is not finite.

    Computed in float64 so eager and torch.compile agree bit for bit (torchao's reason too).
    round_to_pow2 rounds the scale DOWN to a power of two by masking the fp32 mantissa (exact, unlike
    exp2(floor(log2(s))) whose log2 rounds)."""
    a = amax.to(torch.float64)
    scale = torch.finfo(float8_dtype).max / torch.clamp(a, min=EPS)
    scale = torch.where(torch.isfinite(a), scale, torch.full_like(scale, float("nan")))
    scale = scale.to(torch.float32)
    if round_to_pow2:
        bits = scale.view(torch.int32) & 0x7F800000  # keep sign(0) and exponent: floor to 2^e
        pow2 = bits.view(torch.float32)
        scale = torch.where(torch.isfinite(scale), pow2, scale)
    return scale


def to_float8(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype) -> torch.Tensor:
    """Plain float8 data = saturate(x * scale). Bit-identical to torchao's hp_tensor_and_scale_to_float8
    (fp32 multiply, clamp to +-max, round to nearest even); NaN stays NaN."""
    fmax = torch.finfo(float8_dtype).max
    return (x.to(torch.float32) * scale).clamp(-fmax, fmax).to(float8_dtype)


def abs_amax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """max |x| along `dim` in fp32, NaN reported as inf (both give a NaN scale; inf is what an atomic max
    over float bits can carry). 0 along an empty dim."""
    if x.shape[dim] == 0:
        shape = list(x.shape)
        del shape[dim]
        return torch.zeros(shape, dtype=torch.float32, device=x.device)
    # reduce in x's own dtype (|x| and max are exact in it; amax propagates NaN), widen only the result: an
    # fp32 copy of x here would be merged under torch.compile with the cast's own widening, and saved for
    # backward (4 bytes per element)
    a = x.abs().amax(dim).to(torch.float32)
    return torch.where(torch.isnan(a), torch.full_like(a, float("inf")), a)


def to_float8_rowwise_reference(x: torch.Tensor):
    """x [M, N] -> (data e4m3 [M, N], scale fp32 [M, 1] (power of two, one per row), col_amax fp32 [N])."""
    row_amax = abs_amax(x, 1).unsqueeze(1)
    scale = amax_to_scale(row_amax, E4M3, round_to_pow2=True)
    return to_float8(x, scale, E4M3), scale, abs_amax(x, 0)


def to_float8_colwise_transposed_reference(x: torch.Tensor, col_amax: torch.Tensor):
    """x [M, N], col_amax [N] (max |x| per column, from to_float8_rowwise) -> (data_t e4m3 [N, M] row-major:
    column j of x scaled by scale[0, j], scale fp32 [1, N])."""
    scale = amax_to_scale(col_amax.reshape(1, -1), E4M3, round_to_pow2=True)
    # transpose first (then cast row j of x.T with scale j): under torch.compile a different node from the
    # forward row cast's widening of the same x, so the two are not merged into one fp32 copy of x that the
    # partitioner would save for backward
    return to_float8(x.t().contiguous(), scale.t(), E4M3), scale
