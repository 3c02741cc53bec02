"""TEMPORARY stand-in for contract 1 (titan_fp8/float8/expert_weights.py, helper A's branch experts-fsdp):
same names and signature; delete this file once that module is merged (experts.py imports from here only).

    expert_weight_operands(w [E, N, K], moe_recipe, granularity) -> ExpertOperands

Quantizes on every call (no per-step cache, no FSDP float8 all-gather: that is A's module).
Scales follow the project's convention (scale multiplies the high-precision value into float8 range;
data / scale gives it back); the GEMM wrappers in experts.py take reciprocals where torch wants multipliers.
  fp8_rowwise: ONE power-of-two fp32 scale per expert for the whole weight, broadcast to [E, N] / [E, K].
      (Not one per w13 half: a scale that differs between the gate and up halves varies along dgrad's
      contraction axis (2H), which a rowwise-scaled GEMM cannot express; per half would need two dgrad GEMMs.)
  mxfp8 mx128/mx32: 128x128 E8M0 tiles (kernels/grouped_gemm/quant.py to_mxfp8_blocked), the dgrad operand
      is the same bytes transposed, its scale the tile scales laid out along N ([E, N/32, K]).
  mxfp8 mx32_plain: 1x32 along K (fprop) and 1x32 along N (dgrad), two differently scaled copies.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from kernels.float8_cast.reference import E4M3, amax_to_scale, to_float8
from kernels.grouped_gemm.quant import to_mxfp8_blocked


class ExpertOperands(NamedTuple):
    fwd_data: Tensor   # float8_e4m3fn [E, N, K] contiguous
    fwd_scale: Tensor  # fp8_rowwise: fp32 [E, N]; mxfp8: uint8 E8M0 [E, N, K/32]
    bwd_data: Tensor   # float8_e4m3fn [E, K, N] contiguous
    bwd_scale: Tensor  # fp8_rowwise: fp32 [E, K]; mxfp8: uint8 E8M0 [E, N/32, K]


def _mx_blocked(w: Tensor, block: int, tile: int):
    if w.is_cuda:
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
        return to_mxfp8_blocked_rowcol(w, row_block=block, row_tile=tile, do_col=False)[:2]
    return to_mxfp8_blocked(w, -1, block, tile)


@torch.no_grad()
def expert_weight_operands(w: Tensor, moe_recipe: str, granularity: Optional[str]) -> ExpertOperands:
    if w.ndim != 3:
        raise ValueError(f"expert_weight_operands: w must be [E, N, K], got shape {tuple(w.shape)}")
    E, N, K = w.shape
    if moe_recipe == "fp8_rowwise":
        amax = w.abs().amax(dim=(1, 2)).to(torch.float32) if w.numel() else w.new_zeros(E, dtype=torch.float32)
        amax = torch.where(torch.isnan(amax), torch.full_like(amax, float("inf")), amax)
        s = amax_to_scale(amax, E4M3, round_to_pow2=True)  # [E]
        data = to_float8(w, s[:, None, None], E4M3)
        return ExpertOperands(data, s[:, None].expand(E, N), data.transpose(1, 2).contiguous(),
                              s[:, None].expand(E, K))
    if moe_recipe == "mxfp8":
        if granularity in ("mx128", "mx32"):
            data, scale = _mx_blocked(w, 128, 128)  # scale [E, N, K/32], constant over 128x128 tiles
            # tile scales along N: one byte per 32 rows (the first row of each 32-row run) for every column k
            bwd_scale = scale[:, ::32, :].repeat_interleave(32, dim=2)
            return ExpertOperands(data, scale, data.transpose(1, 2).contiguous(), bwd_scale)
        if granularity == "mx32_plain":
            data, scale = _mx_blocked(w, 32, 1)
            data_t, scale_t = _mx_blocked(w.transpose(1, 2).contiguous(), 32, 1)  # [E, K, N], [E, K, N/32]
            return ExpertOperands(data, scale, data_t, scale_t.transpose(1, 2))
        raise ValueError(f"expert_weight_operands: granularity={granularity!r}; allowed: mx128, mx32, mx32_plain")
    raise ValueError(f"expert_weight_operands: moe_recipe={moe_recipe!r}; allowed: fp8_rowwise, mxfp8")
