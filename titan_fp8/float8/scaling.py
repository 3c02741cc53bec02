"""amax -> scale, and the casts every recipe shares.

Convention (torchao's): `scale` multiplies the high-precision tensor into float8 range, `data / scale` gives
it back. `amax_to_scale` (kernels/float8_cast/reference.py) is the ONE rule turning an absolute maximum into a
scale, for every recipe except MXFP8, whose power-of-two E8M0 rule lives with the format in `kernels.mxfp8`.

Edge cases (tested in tests/cpu/test_float8_cast.py and tests/cpu/test_nonfinite.py):
- amax == 0 (all-zero tensor or block): amax is clamped to EPS, so the scale is finite and zeros stay zeros.
- non-finite amax (a NaN or inf anywhere in the scale group): the scale is NaN, so every value of the group
  casts to NaN and the failure stays visible in the loss. (A plain 448/inf would give scale 0 and silently
  turn the group into zeros.) `precompute_float8_dynamic_scale_for_fsdp(..., check_finite=True)` raises
  instead, naming the weight.
"""
from __future__ import annotations

import torch

# The amax -> scale rule and the plain cast live with the kernels that implement them in Triton (kernels/
# never imports titan_fp8, so the rule's one home is there); every recipe here reads them from it.
from kernels.float8_cast import to_float8_tensorwise
from kernels.float8_cast.reference import E4M3, E5M2, EPS, amax_to_scale, to_float8  # noqa: F401

BLOCK_K = 128  # blockwise recipe: activations 1x128, weights 128x128


def to_float8_fused(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype) -> torch.Tensor:
    """to_float8 as ONE kernel on CUDA (eager torch would run mul, clamp and cast as three passes), for casts
    outside compiled regions (FSDP2 hooks): kernels.float8_cast's Triton cast, launched directly. A
    torch.compile'd cast, as before, cost a compiled-graph call (dynamo guards and wrapper) per weight and
    all-gather: 7 per llama_moe block and direction, the largest item of the hooks' host time in an H100
    profile (2026-11-23). Same bits as to_float8."""
    return to_float8_tensorwise(x, scale, float8_dtype)


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as an fp32 0-d tensor; 0 for an empty tensor (an empty FSDP shard); NaN if any NaN."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return torch.linalg.vector_norm(x, ord=float("inf"), dtype=torch.float32)


def tensorwise_scale(x: torch.Tensor, float8_dtype: torch.dtype) -> torch.Tensor:
    return amax_to_scale(tensor_amax(x), float8_dtype)


# ---------------------------------------------------------------------------------- blockwise (DeepSeek V3)
def quantize_1x128(x: torch.Tensor, float8_dtype: torch.dtype = E4M3):
    """x [M, K] -> (data [M, K], scale fp32 [M, K/128]): one scale per 1x128 block along K."""
    M, K = x.shape
    xb = x.to(torch.float32).reshape(M, K // BLOCK_K, BLOCK_K)
    scale = amax_to_scale(xb.abs().amax(-1), float8_dtype) if x.numel() else xb.new_ones(M, K // BLOCK_K)
    data = to_float8(xb, scale.unsqueeze(-1), float8_dtype).reshape(M, K)
    return data, scale


def dequantize_1x128(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    M, K = data.shape
    return (data.to(torch.float32).reshape(M, K // BLOCK_K, BLOCK_K) / scale.unsqueeze(-1)).reshape(M, K)


def quantize_128x128(w: torch.Tensor, float8_dtype: torch.dtype = E4M3):
    """w [N, K] -> (data [N, K], scale fp32 [N/128, K/128]): one scale per 128x128 tile."""
    N, K = w.shape
    wb = w.to(torch.float32).reshape(N // BLOCK_K, BLOCK_K, K // BLOCK_K, BLOCK_K)
    if w.numel():
        scale = amax_to_scale(wb.abs().amax(dim=(1, 3)), float8_dtype)
    else:
        scale = wb.new_ones(N // BLOCK_K, K // BLOCK_K)
    data = to_float8(wb, scale[:, None, :, None], float8_dtype).reshape(N, K)
    return data, scale


def dequantize_128x128(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    N, K = data.shape
    d = data.to(torch.float32).reshape(N // BLOCK_K, BLOCK_K, K // BLOCK_K, BLOCK_K)
    return (d / scale[:, None, :, None]).reshape(N, K)


# ---------------------------------------------------------------------------------- MXFP8 (format in kernels/)
def mx_quantize(x: torch.Tensor, dim: int):
    from kernels.mxfp8 import to_mxfp8
    return to_mxfp8(x, dim=dim)


def mx_dequantize(data: torch.Tensor, scale: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    from kernels.mxfp8 import from_mxfp8
    return from_mxfp8(data, scale, dim=dim, dtype=dtype)


def mx_quantize_weight(w: torch.Tensor):
    """Weight [N, K] -> (data, scale_k [N, K/32]): one E8M0 scale per 32x32 tile (kernels.mxfp8
    to_mxfp8_tiles32), so ONE quantization serves the forward (blocks along K) and grad-input (blocks along N)
    GEMMs, and a 32-row-aligned FSDP shard quantizes exactly as the unsharded weight would."""
    from kernels.mxfp8 import to_mxfp8_tiles32
    data, scale_k, _ = to_mxfp8_tiles32(w)
    return data, scale_k


def eager_warps(num_warps: int):
    """A fixed launch config for an eager quantizer call (FSDP2's hooks: no autotuner Python per call); None
    under torch.compile, which traces the quantizer's custom op instead of a raw launch."""
    return None if torch.compiler.is_compiling() else num_warps


def mx_quantize_weight_tiles(w: torch.Tensor, tile: int):
    """Weight [N, K] -> (data, scale_k [N, K/32]): MXFP8 with one E8M0 scale per tile x tile square (N, K
    multiples of tile), written into each 1x32 block it covers (so (data, scale_k) decodes as plain MXFP8).
    One read on CUDA (kernels.grouped_gemm.quant_triton), the bit-identical plain PyTorch rule elsewhere."""
    if w.is_cuda:
        from kernels.grouped_gemm.quant_triton import BLOCKWISE_NUM_WARPS, to_mxfp8_blocked_rowcol

        # fixed launch, no autotuner: FSDP2's all-gather hook calls this per weight, and its host time is step time
        data, scale_k, _, _ = to_mxfp8_blocked_rowcol(w, row_block=tile, row_tile=tile, do_col=False,
                                                      num_warps=eager_warps(BLOCKWISE_NUM_WARPS))
        return data, scale_k
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    return to_mxfp8_blocked(w, -1, tile, tile)
