"""Float8 routed experts.

Two things live here:
  Float8GroupedExperts / fused_experts (issue 9; second half of this file): the whole expert path of an MoE
      layer as ONE autograd op, dispatch -> grouped GEMM(w13) -> SwiGLU -> grouped GEMM(w2) -> combine, for
      moe_recipe "fp8_rowwise" (torch._scaled_grouped_mm) and "mxfp8" (kernels.grouped_gemm), with an emulated
      twin (same quantization in plain PyTorch, float64 GEMMs) for CPU. See the section header below.
  mxfp8_grouped_mm: the per-GEMM MXFP8 op (GroupedExperts.mm under the older conversion), described next.

MXFP8 grouped GEMM for MoE experts: the autograd op that GroupedExperts.mm becomes under float8.

    mxfp8_grouped_mm(x, w, offs) -> out          x [T, in], w [E, out, in], offs int32 [E] (cumulative ends)

Same contract as titan_fp8.models.moe.grouped_mm: out[s:e] = x[s:e] @ w[i]^T for group i; groups may be
empty; rows at or past offs[-1] are padding (their output and input gradient are zero, their contents are
never read into a real row's result). Forward quantizes x and w; backward quantizes dO and w again and
runs the three MXFP8 grouped GEMMs of kernels.grouped_gemm (fprop, dgrad, wgrad). What is saved for
backward is float8: the token-major MXFP8 copy of x (wgrad's operand, made in forward), not bf16 x.

Scale granularity (every operand is a valid MXFP8 tensor: E4M3 data, one E8M0 scale per 1x32 block; the
`granularity` names how widely one scale is shared, which sets speed and precision; see
kernels/grouped_gemm/NOTES.md for the measurements):

  name        fprop x (along in)  w (fprop and dgrad)  dgrad dO (along out)  wgrad dO^T / x^T (along tokens)
  "mx128"     1x128               128x128 tiles        1x128                1x128 / 128(in) x 128 tiles
  "mx32"      1x32 (plain MX)     128x128 tiles        1x32 (plain MX)      1x32 / 128(in) x 32 tiles
  "mx32_plain" 1x32               1x32 along K / N     1x32                 1x32 / 1x32   (slowest)

This op quantizes w twice (fprop along in, dgrad along out); "mx128" / "mx32" share each scale over 128 rows of
the GEMM's output axis x `block` along its reduction: 128x128 tiles for "mx128", 128 x 32 regions for "mx32" (finer
than the fused path's square 128x128 tiles, expert_weights.py, which one quantization or float8 all-gather serves in
both directions).
"mx128" is the one faster than bf16 on H200 (1.07-1.29x; NOTES.md); it is DeepSeek-V3's 1x128 / 128x128
granularity with power-of-two (E8M0) scales, plus 128x128 tiles for x^T in wgrad. "mx32" keeps the OCP MX
1x32 blocks on every activation and gradient. Token blocks for wgrad lie on the global token grid (from row
0), so a block that straddles two experts' rows has one scale for both. Rows at or past offs[-1] are
zeroed before the token-axis quantization so padding garbage (torch._grouped_mm leaves such rows
uninitialised) cannot reach a real token's scale.

CUDA tensors run the one-read quantizers of kernels/grouped_gemm (x / dO: both copies from one read; on sm_90 the
CUDA C++ kernel of quant_cuda.py where it builds, else quant_triton.py's; TITAN_FP8_ROWCOL_QUANT picks) and the
GEMMs of kernels/grouped_gemm through its backend switch (`backend`: "auto" runs "mx128" on CUTLASS on sm_90
where it builds, wgrad only with token_align=128); anything else runs the emulated twin (the
same quantization in plain PyTorch, kernels/grouped_gemm/quant.py, then the float64 dequantize-then-matmul
references), which tests compare with the kernels.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from torch.profiler import record_function

import kernels.moe as moe_kernels
from kernels.moe import reference as moe_reference
from kernels.grouped_gemm import (
    grouped_mm_dgrad_reference,
    grouped_mm_fprop_reference,
    grouped_mm_wgrad_reference,
    mxfp8_grouped_mm_dgrad,
    mxfp8_grouped_mm_fprop,
    mxfp8_grouped_mm_wgrad,
)
from kernels.grouped_gemm.quant import to_mxfp8_blocked
from kernels.mxfp8 import from_mxfp8
from titan_fp8.models.moe import GroupedExperts, _row_group

from . import expert_weights
from .backward_order import zero_from

__all__ = ["Granularity", "GRANULARITIES", "mxfp8_grouped_mm", "make_mxfp8_grouped_mm", "MOE_RECIPES",
           "FusedSpec", "make_fused_spec", "fused_experts", "Float8GroupedExperts", "dgrad_weight_operand"]


class Granularity(NamedTuple):
    block: int         # elements along the reduction axis sharing a scale (x, dO, and along tokens)
    weight_tile: int   # rows of w sharing a scale per block (1 = plain 1x32 along K / N)
    wgrad_x_tile: int  # rows (in-features) of x^T sharing a scale per token block in wgrad


GRANULARITIES = {
    "mx128": Granularity(128, 128, 128),
    "mx32": Granularity(32, 128, 128),
    "mx32_plain": Granularity(32, 1, 1),
}
DEFAULT_GRANULARITY = "mx128"


def _backend(t: torch.Tensor, backend: str) -> str:
    # "auto"/"triton"/"cutlass"/"gluon" name the GEMM backend of kernels.grouped_gemm (its one switch;
    # quantization is Triton for all of them); "emulated" is the plain-PyTorch twin
    if backend not in ("auto", "triton", "cutlass", "gluon", "emulated"):
        raise ValueError(f"mxfp8_grouped_mm: backend={backend!r}; allowed: 'auto', 'triton', 'cutlass', 'gluon', "
                         f"'emulated'")
    if backend == "auto" and not t.is_cuda:
        return "emulated"
    return backend


def _quant_act(t, offs, g, row, col, col_tile, backend):
    """Row copy of t [T, C] along C (1 x block) and token-major copy along tokens (block x col_tile), padding
    rows zeroed for the latter. Triton: one read of t; emulated: its plain PyTorch twin, same bytes."""
    if backend != "emulated":
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    else:
        from kernels.grouped_gemm.quant import to_mxfp8_blocked_rowcol_reference as to_mxfp8_blocked_rowcol
    return to_mxfp8_blocked_rowcol(t, row_block=g.block, col_block=g.block, col_tile=col_tile, do_row=row,
                                   do_col=col, limit=offs[-1:])


def _quant_weight(w, g, along_out, backend):
    """w [E, out, in] with weight_tile x block scales: along in (fprop: data [E, out, in]) or along out
    (dgrad: data [E, in, out], i.e. W^T quantized along its last dim)."""
    if backend != "emulated":
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
        if along_out:
            return to_mxfp8_blocked_rowcol(w, col_block=g.block, col_tile=g.weight_tile, do_row=False)[2:]
        return to_mxfp8_blocked_rowcol(w, row_block=g.block, row_tile=g.weight_tile, do_col=False)[:2]
    if along_out:
        return to_mxfp8_blocked(w.transpose(1, 2), -1, g.block, g.weight_tile)
    return to_mxfp8_blocked(w, -1, g.block, g.weight_tile)


def _fprop(xd, xs, wd, ws, offs, out_dtype, g, backend):
    if backend != "emulated":
        return mxfp8_grouped_mm_fprop(xd, xs, wd, ws, offs, out_dtype, block=g.block, w_tile=g.weight_tile,
                                      validate=False, backend=backend)
    return grouped_mm_fprop_reference(xd, xs, wd, ws, offs, out_dtype=out_dtype)


class _MXFP8GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offs, g, backend, token_align):
        # x along in, and (only if w needs a gradient) the token-major copy wgrad reads: float8 is what is
        # saved for backward, not bf16 x
        xd, xs, xtd, xts = _quant_act(x, offs, g, True, ctx.needs_input_grad[1], g.wgrad_x_tile, backend)
        wd, ws = _quant_weight(w, g, False, backend)
        out = _fprop(xd, xs, wd, ws, offs, x.dtype, g, backend)
        ctx.save_for_backward(xtd, xts, w, offs)
        ctx.g, ctx.backend, ctx.x_dtype, ctx.T, ctx.token_align = g, backend, x.dtype, x.shape[0], token_align
        return out

    @staticmethod
    def backward(ctx, dout):
        xtd, xts, w, offs = ctx.saved_tensors
        g, backend = ctx.g, ctx.backend
        dx = dw = None
        dd, ds, dtd, dts = _quant_act(dout, offs, g, ctx.needs_input_grad[0], ctx.needs_input_grad[1], 1, backend)
        if ctx.needs_input_grad[0]:
            # w scaled along out (N): w^T [E, in, out] quantized along its last dim, viewed back as [E, out, in]
            wtd, wts = _quant_weight(w, g, True, backend)
            wn_data, wn_scale = wtd.transpose(1, 2), wts.transpose(1, 2)  # [E, N, K] view, [E, N/32, K]
            if backend != "emulated":
                dx = mxfp8_grouped_mm_dgrad(dd, ds, wn_data, wn_scale, offs, ctx.x_dtype, block=g.block,
                                            w_tile=g.weight_tile, validate=False, backend=backend)
            else:
                dx = grouped_mm_dgrad_reference(dd, ds, wn_data, wn_scale, offs, out_dtype=ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            if backend != "emulated":
                # bf16 weights: the kernel rounds its fp32 sum to bf16 itself (no fp32 [E, N, K] round trip)
                dw_dtype = torch.bfloat16 if w.dtype == torch.bfloat16 else torch.float32
                dw = mxfp8_grouped_mm_wgrad(dtd, dts, xtd, xts, offs, dw_dtype, block=g.block,
                                            a_tile=g.wgrad_x_tile, validate=False, backend=backend,
                                            token_align=ctx.token_align)
            else:
                dw = grouped_mm_wgrad_reference(dtd, dts, xtd, xts, offs, out_dtype=torch.float32)
            dw = dw.to(w.dtype)
        return dx, dw, None, None, None, None


def mxfp8_grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *,
                     granularity: str = DEFAULT_GRANULARITY, backend: str = "auto",
                     token_align: int = 1) -> torch.Tensor:
    """MXFP8 grouped GEMM with autograd: x [T, in] (bf16/fp32), w [E, out, in], offs int32 [E].
    token_align: every group boundary is a multiple of it (the MoE's token_group_align); 128 lets "auto" run
    wgrad on CUTLASS too (kernels.grouped_gemm's backend switch)."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != 2 or w.dim() != 3 \
            or x.shape[1] != w.shape[2]:
        raise ValueError(f"mxfp8_grouped_mm: expected x [T, in] and w [E, out, in], got x "
                         f"{tuple(getattr(x, 'shape', ()))}, w {tuple(getattr(w, 'shape', ()))}")
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.shape != (w.shape[0],):
        raise ValueError(f"mxfp8_grouped_mm: offs must be int32 [E={w.shape[0]}], got "
                         f"{getattr(offs, 'dtype', type(offs).__name__)} {tuple(getattr(offs, 'shape', ()))}")
    if x.shape[1] % 32 or w.shape[1] % 32:
        raise ValueError(f"mxfp8_grouped_mm: in ({x.shape[1]}) and out ({w.shape[1]}) features must be multiples "
                         f"of 32 (MXFP8 blocks), got w {tuple(w.shape)}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"mxfp8_grouped_mm: granularity={granularity!r}; allowed: {', '.join(GRANULARITIES)}")
    if x.dtype not in (torch.bfloat16, torch.float32, torch.float16):
        raise ValueError(f"mxfp8_grouped_mm: x.dtype is {x.dtype}; expected bf16, fp16 or fp32")
    return _MXFP8GroupedMM.apply(x, w, offs, GRANULARITIES[granularity], _backend(x, backend), token_align)


def make_mxfp8_grouped_mm(granularity: str = DEFAULT_GRANULARITY, backend: str = "auto", token_align: int = 1):
    """A (x, w, offs) callable for GroupedExperts.mm with the granularity fixed."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"make_mxfp8_grouped_mm: granularity={granularity!r}; allowed: {', '.join(GRANULARITIES)}")
    return functools.partial(mxfp8_grouped_mm, granularity=granularity, backend=backend, token_align=token_align)


# =============================================================================================================
# The fused float8 expert path (issue 9): ONE autograd op over dispatch -> GEMM(w13) -> SwiGLU -> GEMM(w2) ->
# combine, for moe_recipe "fp8_rowwise" (torch._scaled_grouped_mm) and "mxfp8" (kernels.grouped_gemm).
# =============================================================================================================
#
# Forward (N tokens, k slots, P = buffer rows of the DispatchPlan, every expert group padded to `align` rows):
#   dispatch_quantize  x [N, D] -> xq [P, D] (fprop rows) + xtq [D, P] (token-major: w13's wgrad operand)
#   fprop(w13)         h13 [P, 2H] bf16 (kept for SwiGLU's backward)
#   swiglu_quantize    a = silu(h1) * h3 -> aq [P, H] (fprop rows) + atq [H, P] (token-major: w2's wgrad)
#   fprop(w2)          y [P, D] bf16 (kept: the router weights' gradient reads it)
#   combine            out[t] = sum_j weights[t, j] * y[pos[t*k + j]]  (fp32 sum in slot order)
# Saved for backward: xtq/xts, h13, atq/ats, y, the plan and the router weights; no bf16 permuted copy of x.
# Backward (each dgrad before its wgrad, for peak memory): combine_backward (dy rows + token-major, router
# weights' gradient) -> dgrad(w2), wgrad(w2) -> swiglu_quantize_backward -> dgrad(w13) -> dx[t] = sum_j
# dx_buf[pos[t*k + j]] (combine, unit weights) -> wgrad(w13).
# wgrad writes the parameter dtype from the GEMM (mxfp8: the kernel's bf16/fp32 output; fp8_rowwise:
# torch._scaled_grouped_mm's bf16 output, cast only for fp32 parameters).
#
# Activation ops: kernels.moe (contract 2; Triton on CUDA, its plain PyTorch reference for the emulated twin),
# with mxfp8's wgrad-tiled x^T / a^T (col_tile=128). Weights: contract 1,
# titan_fp8.float8.expert_weights.expert_weight_operands (cached once per optimizer step in eager; under
# torch.compile inductor fuses the casts; a float8-all-gathered weight brings its own bytes), except compiled
# mxfp8's dgrad operand of a plain weight, quantized in backward (_weight: no float8 weight kept for backward).
# Scale convention (fp8_rowwise, activations and weights alike): the project's quantization scales (value =
# data / scale; kernels.moe, contract 1); torch._scaled_grouped_mm multiplies by their reciprocals (powers of two:
# exact; [E, N]-sized for weights, so the inversion is negligible).
#   fp8_rowwise rows: fp32 [P], one power-of-two scale per row;
#   fp8_rowwise token-major: fp32 [E, C], one per (expert group, feature): the only 2d x 2d (grouped K) scale
#       layout torch._scaled_grouped_mm takes (scale_a [E * N], scale_b [E * K], group-major; torchao 0.18's
#       moe_training writes the same); token groups padded to 16 rows (its fp8 wgrad requirement).
#   mxfp8: E8M0 rows 1 x block; token-major block (tokens) x tile (features).
# No host sync anywhere: group membership comes from searchsorted on offs, never from offs.tolist().

MOE_RECIPES = ("fp8_rowwise", "mxfp8")
ROWWISE_GROUP_ALIGN = 16  # torch._scaled_grouped_mm's fp8 wgrad needs token groups in multiples of 16


@dataclass(frozen=True)
class FusedSpec:
    """What the fused op needs besides tensors (hashable: a constant for torch.compile)."""
    recipe: str                 # "fp8_rowwise" | "mxfp8"
    granularity: str | None     # mxfp8: a GRANULARITIES key; fp8_rowwise: None
    backend: str                # "emulated" | "cuda" (fp8_rowwise) | mxfp8 GEMM backend ("auto", "triton", "cutlass", "gluon")
    align: int                  # token group alignment the plan must have
    act_backend: str = "auto"   # kernels.moe backend on real hardware: "auto" (Triton) | "reference" (torch ops)

    @property
    def g(self) -> Granularity:
        return GRANULARITIES[self.granularity]

    @property
    def emulated(self) -> bool:
        return self.backend == "emulated"


def make_fused_spec(recipe: str, granularity: str | None = None, backend: str = "auto",
                    device: torch.device | str = "cuda", act_backend: str = "auto") -> FusedSpec:
    if recipe not in MOE_RECIPES:
        raise ValueError(f"moe_recipe_name={recipe!r}; allowed: {', '.join(MOE_RECIPES)}")
    if recipe == "fp8_rowwise":
        if granularity is not None:
            raise ValueError(f"moe_granularity={granularity!r} is for moe_recipe_name='mxfp8'; fp8_rowwise has none")
        if backend not in ("auto", "emulated", "cuda"):
            raise ValueError(f"fp8_rowwise expert backend={backend!r}; allowed: auto, emulated, cuda")
        align = ROWWISE_GROUP_ALIGN
    else:
        granularity = granularity or DEFAULT_GRANULARITY
        if granularity not in GRANULARITIES:
            raise ValueError(f"moe_granularity={granularity!r}; allowed: {', '.join(GRANULARITIES)}")
        align = GRANULARITIES[granularity].block
    if backend == "auto" and torch.device(device).type != "cuda":
        backend = "emulated"
    elif backend == "auto" and recipe == "fp8_rowwise":
        backend = "cuda"
    if act_backend not in ("auto", "reference"):
        raise ValueError(f"act_backend={act_backend!r}; allowed: auto (kernels.moe's Triton kernels on CUDA), "
                         f"reference (its plain PyTorch ops; inductor fuses them under torch.compile)")
    return FusedSpec(recipe, granularity, backend, align, act_backend)


# ------------------------------------------------------------------------------------------ activation ops
# kernels.moe (contract 2) writes every activation operand: Triton on CUDA, its plain PyTorch reference (same
# bytes) for the emulated twin. mxfp8 with weight-tiled wgrad ("mx128", "mx32") reads x^T and a^T (wgrad's second
# operand) in block (tokens) x 128 (features) tiles, the layout the tiled wgrad kernels need (0.4-0.6x the speed
# without: kernels/grouped_gemm/NOTES.md): dispatch and SwiGLU write it directly (col_tile=128), from the same one
# read of x / h13 as the row copy. The gradients (dy, dh13: wgrad's first operand, tile 1) are 1 x block.
def _moe_backend(spec: FusedSpec) -> str:
    return "reference" if spec.emulated else spec.act_backend


def _a_tile(spec: FusedSpec) -> int:
    return spec.g.wgrad_x_tile if spec.recipe == "mxfp8" else 1


def dispatch_quantize(x: Tensor, src: Tensor, offs: Tensor, spec: FusedSpec, rows_q=None,
                      outputs: int = moe_kernels.BOTH, opaque: bool = False):
    """x [N, D] -> (xq [P, D], xs, xtq [D, P], xts): rows gathered into expert order (src == N: zero row).
    outputs: moe_kernels.ROWS / TOKEN_MAJOR / BOTH, the copies made (one left out comes back empty); opaque:
    kernels.moe.dispatch_quantize's.

    rows_q = (data [N, D], scale): x's rows already quantized (expert parallelism's float8 dispatch, where x is
    their exact dequantization): they are gathered, not quantized again; only the token-major copy is made."""
    if rows_q is not None:
        return _dispatch_prequantized(x, src, offs, spec, *rows_q)
    return moe_kernels.dispatch_quantize(x, src, offs, spec.recipe, spec.align, backend=_moe_backend(spec),
                                         col_tile=_a_tile(spec), outputs=outputs, opaque=opaque)


def quantize_dispatch_rows(x: Tensor, spec: FusedSpec) -> tuple[Tensor, Tensor]:
    """x [M, D] -> its rows quantized in the layout the first grouped GEMM reads (kernels.moe contract 2:
    fp8_rowwise e4m3 + fp32 scale per row; mxfp8 e4m3 + E8M0 per 1x32 block carrying its 1 x block run).
    Row quantization is row-local, so gathering these rows equals quantizing the gathered rows bit for bit.
    Plain PyTorch (kernels.moe.reference: the bytes the kernels write); torch.compile fuses it."""
    return moe_reference.quantize_rows(x.float(), spec.recipe, spec.g.block if spec.recipe == "mxfp8" else 32)


def dequantize_dispatch_rows(data: Tensor, scale: Tensor, spec: FusedSpec, dtype: torch.dtype) -> Tensor:
    """The exact values of quantize_dispatch_rows' output (e4m3 x a power of two fits bf16 and fp32 exactly)."""
    if spec.recipe == "mxfp8":
        return from_mxfp8(data, scale, dim=-1, dtype=torch.float32).to(dtype)
    return (data.float() / scale.float().unsqueeze(-1)).to(dtype)


def _dispatch_prequantized(x, src, offs, spec, data, scale):
    # fprop rows: the received float8 rows gathered into expert order; a padding row (src == N) gets the bytes
    # a zero row quantizes to (what dispatch_quantize writes there)
    zq, zs = quantize_dispatch_rows(x.new_zeros(1, x.shape[1]), spec)
    # gathered as bytes: index_select / cat need not support float8 dtypes on every device
    xq = torch.cat([data.view(torch.uint8), zq.view(torch.uint8)]).index_select(0, src).view(data.dtype)
    xs = torch.cat([scale, zs]).index_select(0, src)
    # wgrad's token-major copy: from x, the exact dequantization of the received rows (one more rounding than
    # quantizing the sender's bf16 along tokens; DeepSeek-V3 does the same). Only that copy is made: the
    # received rows are what the GEMM reads.
    _, _, xtq, xts = dispatch_quantize(x, src, offs, spec, outputs=moe_kernels.TOKEN_MAJOR)
    return xq, xs, xtq, xts


class Float8Dispatch(torch.autograd.Function):
    """Expert parallelism's float8 dispatch: the sender's rows, quantized (quantize_dispatch_rows), travel as
    bytes [M, D + scale bytes] (uint8: gloo has no float8) in ONE all_to_all_single; the receiver gets the
    float8 rows + scales for the GEMM and their exact dequantization (the autograd carrier, and the source of
    wgrad's token-major copy). Backward: the reverse all-to-all of the gradient in bf16. float8 there would
    halve those bytes too, but the gradient has a wider, heavier-tailed range than activations and no per-row
    scale is known before the backward GEMM runs; not built (DeepSeek-V3 also keeps it bf16)."""

    @staticmethod
    def forward(ctx, x_send, data, scale, out_splits, in_splits, group, spec):
        from titan_fp8.models.expert_parallel import _all_to_all_raw

        ctx.splits, ctx.group = (out_splits, in_splits), group
        d = data.shape[1]
        packed = torch.cat([data.view(torch.uint8), scale.reshape(data.shape[0], -1).contiguous()
                            .view(torch.uint8)], dim=1)
        got = _all_to_all_raw(packed, out_splits, in_splits, group)
        r_data = got[:, :d].contiguous().view(data.dtype)
        r_scale = got[:, d:].contiguous().view(scale.dtype)
        r_scale = r_scale.reshape(-1) if scale.dim() == 1 else r_scale
        x_recv = dequantize_dispatch_rows(r_data, r_scale, spec, x_send.dtype)
        ctx.mark_non_differentiable(r_data, r_scale)
        return x_recv, r_data, r_scale

    @staticmethod
    def backward(ctx, g, _gd, _gs):
        from titan_fp8.models.expert_parallel import _all_to_all_raw

        out_splits, in_splits = ctx.splits
        return _all_to_all_raw(g, in_splits, out_splits, ctx.group), None, None, None, None, None, None


@torch.compiler.disable
def _float8_all_to_all(x_send, data, scale, out_splits, in_splits, group, spec):
    return Float8Dispatch.apply(x_send, data, scale, out_splits, in_splits, group, spec)


def swiglu_quantize(h13: Tensor, offs: Tensor, spec: FusedSpec):
    """h13 [P, 2H] -> a = silu(h1) * h3 quantized: (aq [P, H], as, atq [H, P], ats)."""
    return moe_kernels.swiglu_quantize(h13, offs, spec.recipe, spec.align, backend=_moe_backend(spec),
                                       col_tile=_a_tile(spec))


def swiglu_quantize_backward(da: Tensor, h13: Tensor, offs: Tensor, spec: FusedSpec):
    """-> (dq [P, 2H], ds, dtq [2H, P], dts): dh13 quantized for w13's dgrad (rows) and wgrad (token-major)."""
    return moe_kernels.swiglu_quantize_backward(da, h13, offs, spec.recipe, spec.align, backend=_moe_backend(spec))


def combine(y: Tensor, pos: Tensor, weights: Tensor, spec: FusedSpec) -> Tensor:
    """out[t] = sum_j weights[t, j] * y[pos[t*k + j]] (fp32, slot order, deterministic), y's dtype."""
    return moe_kernels.combine(y, pos, weights.float(), backend=_moe_backend(spec), recipe=spec.recipe)


def combine_backward(dout, y, pos, weights, src, offs, spec: FusedSpec):
    """-> (dyq [P, D], dys, dytq [D, P], dyts, dweights [N, k] fp32)."""
    return moe_kernels.combine_backward(dout, y, pos, weights.float(), src, offs, spec.recipe, spec.align,
                                        backend=_moe_backend(spec))


# ------------------------------------------------------------------------------------------ GEMMs
def _masked_grouped_matmul(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """out[r] = a[r] @ b[group(r)] (a [P, R], b [E, R, C]) by one dense matmul per expert over all rows, kept
    where the row belongs to it: no host sync (torch.compile fullgraph), any device. For the emulated twin."""
    group = _row_group(offs, a.shape[0]).unsqueeze(1)
    out = a.new_zeros(a.shape[0], b.shape[2])
    for e in range(b.shape[0]):
        mine = group == e
        out = torch.where(mine, torch.where(mine, a, 0) @ b[e], out)
    return out


def _masked_grouped_wgrad(dt: Tensor, at: Tensor, offs: Tensor) -> Tensor:
    """dW[e] = dt[:, rows of e] @ at[:, rows of e]^T (dt [N, P], at [K, P]) -> [E, N, K], sync-free."""
    group = _row_group(offs, dt.shape[1])
    return torch.stack([torch.where(group == e, dt, 0) @ at.t() for e in range(offs.shape[0])])


_EMU = torch.float64  # emulated GEMMs: exact products of the decoded float8 values, one rounding at the end


def _rw_decode(q: Tensor, scale: Tensor) -> Tensor:
    """fp8_rowwise data [.., R, C] with one quantization scale per row [.., R]: value = data / scale."""
    return q.to(_EMU) / scale.to(_EMU).unsqueeze(-1)


def _f8_fprop(xq, xs, wq, ws, offs, spec: FusedSpec, out_dtype):
    """out[r] = x[r] @ w[e]^T; xq [P, K], wq [E, N, K] (contract 1's fwd operand)."""
    if spec.recipe == "fp8_rowwise":
        if spec.emulated:
            return _masked_grouped_matmul(_rw_decode(xq, xs), _rw_decode(wq, ws).transpose(1, 2),
                                          offs).to(out_dtype)
        return torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), xs.reciprocal(), ws.reciprocal(), offs=offs,
                                        out_dtype=torch.bfloat16, use_fast_accum=True).to(out_dtype)
    g = spec.g
    if spec.emulated:
        x = from_mxfp8(xq, xs, dim=-1, dtype=_EMU)
        w = from_mxfp8(wq, ws, dim=-1, dtype=_EMU)
        return _masked_grouped_matmul(x, w.transpose(1, 2), offs).to(out_dtype)
    return mxfp8_grouped_mm_fprop(xq, xs, wq, ws, offs, out_dtype, block=g.block, w_tile=g.weight_tile,
                                  validate=False, **_gemm_backend(spec))


def _f8_dgrad(dq, ds, wtq, wts, offs, spec: FusedSpec, out_dtype):
    """dx[r] = dout[r] @ w[e]; dq [P, N], wtq [E, K, N] (contract 1's bwd operand: w^T) with its scale."""
    if spec.recipe == "fp8_rowwise":  # w^T's rows are dgrad's output columns: the fprop call on (dout, w^T)
        return _f8_fprop(dq, ds, wtq, wts, offs, spec, out_dtype)
    g = spec.g
    wn, wns = wtq.transpose(1, 2), wts  # [E, N, K] view, scale [E, N/32, K]
    if spec.emulated:
        d = from_mxfp8(dq, ds, dim=-1, dtype=_EMU)
        w = from_mxfp8(wn, wns, dim=-2, dtype=_EMU)  # [E, N, K]
        return _masked_grouped_matmul(d, w, offs).to(out_dtype)
    return mxfp8_grouped_mm_dgrad(dq, ds, wn, wns, offs, out_dtype, block=g.block, w_tile=g.weight_tile,
                                  validate=False, **_gemm_backend(spec))


def _f8_wgrad(dtq, dts, atq, ats, offs, spec: FusedSpec, out_dtype):
    """dW[e] = dout[rows of e]^T @ a[rows of e] from token-major copies dtq [N, P], atq [K, P] -> [E, N, K]."""
    if spec.recipe == "fp8_rowwise":  # scales [E, C]: one per (group, feature)
        if spec.emulated:
            group = _row_group(offs, dtq.shape[1]).clamp(max=offs.shape[0] - 1)
            dt = dtq.to(_EMU) / dts.to(_EMU).index_select(0, group).t()
            at = atq.to(_EMU) / ats.to(_EMU).index_select(0, group).t()
            return _masked_grouped_wgrad(dt, at, offs).to(torch.bfloat16).to(out_dtype)
        out = torch._scaled_grouped_mm(dtq, atq.t(), dts.reciprocal().reshape(-1), ats.reciprocal().reshape(-1),
                                       offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True)
        return out if out_dtype == torch.bfloat16 else out.to(out_dtype)
    g = spec.g
    if spec.emulated:
        dt = from_mxfp8(dtq, dts, dim=-1, dtype=_EMU)
        at = from_mxfp8(atq, ats, dim=-1, dtype=_EMU)
        return _masked_grouped_wgrad(dt, at, offs).to(out_dtype)
    kernel_dtype = out_dtype if out_dtype in (torch.float32, torch.bfloat16) else torch.float32
    # the plan pads every group to spec.align tokens: declared, so "auto" may run wgrad on CUTLASS (mx128)
    dw = mxfp8_grouped_mm_wgrad(dtq, dts, atq, ats, offs, kernel_dtype, block=g.block, a_tile=_a_tile(spec),
                                validate=False, token_align=spec.align, **_gemm_backend(spec))
    return dw if kernel_dtype == out_dtype else dw.to(out_dtype)


def _gemm_backend(spec: FusedSpec) -> dict:
    # kernels.grouped_gemm's one switch: "auto" (it picks: CUTLASS for mx128 on sm_90 where it builds, else
    # Gluon for mx32 on sm_90, else Triton), "triton", "cutlass", "gluon" (an error where it cannot run)
    return {"backend": spec.backend}


def dgrad_weight_operand(w: Tensor, after: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """W^T [E, K, N] float8 in 128 x 128 tiles along N and its scales [E, K, N/32] (each 1x32 block carrying its
    tile's), from one read of w: the same bytes and scales as contract 1's transposed fprop operand (mx128 and mx32
    alike). `after` (compiled backward): a backward tensor the quantization waits for, never read (see _weight);
    with it the quantizer runs as quant_triton's opaque custom op, the one form inductor orders after `after`."""
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    return tuple(to_mxfp8_blocked_rowcol(w, col_block=128, col_tile=128, do_row=False, after=after)[2:])


DGRAD_PARTS = 2  # an expert weight's dgrad in this many launches over the experts (see _dgrad_in_parts)


def _dgrad_in_parts(dq, ds, w: Tensor, offs, spec: FusedSpec, out_dtype) -> Tensor | None:
    """An expert weight's dgrad (w2's, then w13's) through the dgrad_in_parts op where it applies (compiled, a plain
    mx128 weight whose dgrad runs on CUTLASS with bf16 output), else None (the caller runs the one-launch dgrad with
    _weight's backward operand). The op quantizes W^T itself, after dq exists: it is an input of the op. A traced
    quantizer tied to dq only through a kernel argument it never reads was scheduled by inductor BEFORE
    combine_backward (W2^T alive at backward's start: dsv3_layer mx128 peak 1.70 -> 1.82 GiB,
    benchmarks/results/issue9_host_s16/call7_error_probe/)."""
    if not (DGRAD_PARTS > 1 and w.shape[0] >= 2 and spec.recipe == "mxfp8" and not spec.emulated
            and out_dtype == torch.bfloat16 and type(w) in (Tensor, torch.nn.Parameter)
            and torch.compiler.is_compiling()):
        return None
    g = spec.g
    if g.block != 128 or g.weight_tile != 128:
        return None
    from kernels.grouped_gemm import pick_backend
    if pick_backend("fused experts dgrad", "dgrad", spec.backend, dq, g.block, g.weight_tile, w.shape[1],
                    w.shape[2], out_dtype) != "cutlass":
        return None
    from kernels.grouped_gemm import cutlass_backend
    return cutlass_backend.dgrad_in_parts(dq, ds, w.detach(), offs, DGRAD_PARTS)


def _weight(w: Tensor, spec: FusedSpec, which: str, after: Tensor | None = None):
    """(data, scale) of contract 1's `which` operand of w. Backward passes `after` (a tensor backward computed):
    compiled, a plain weight's dgrad operand is then quantized in backward, next to its use. Through contract 1 the
    partitioner would make it in forward (it depends only on the weight: shared with the fprop operand by CSE, or
    moved there) and keep it alive for backward: 276 MB of float8 weights at llama_moe, over bf16's peak."""
    if (after is not None and spec.recipe == "mxfp8" and spec.g.weight_tile == 128 and not spec.emulated
            and type(w) in (Tensor, torch.nn.Parameter) and torch.compiler.is_compiling()):
        wtd, wts = dgrad_weight_operand(w.detach(), after)
        return wtd, wts.transpose(1, 2)
    ops = expert_weights.expert_weight_operands(w, spec.recipe, spec.granularity, which=which)
    return (ops.fwd_data, ops.fwd_scale) if which == "fwd" else (ops.bwd_data, ops.bwd_scale)


# ------------------------------------------------------------------------------------------ the autograd op
def _remake_x_token_major(x: Tensor, src: Tensor, offs: Tensor, spec: FusedSpec, after: Tensor | None):
    """Backward: x's token-major float8 copy for w13's wgrad, made again from x (the same bytes as forward's
    dispatch would have written: the same kernel on the same values). Compiled, `after` (a zero from a tensor
    backward makes, backward_order.zero_from) rides on src, so the copy is made next to the wgrad, not at
    backward's start; and through the opaque op, whose output is allocated when it runs: the traced op's
    buffer was allocated with the dSwiGLU outputs at mx32's layer peak (benchmarks/results/issue9_s20/)."""
    if after is not None:
        src = src + after.reshape(()).to(src.dtype)
    _, _, xtq, xts = dispatch_quantize(x, src, offs, spec, outputs=moe_kernels.TOKEN_MAJOR, opaque=True)
    return xtq, xts


class _FusedExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, w13, w2, src, pos, offs, spec: FusedSpec, rows_q=None, x_kept=False):
        # x_kept (the caller holds x through backward anyway): save x, not a float8 token-major copy of it, and
        # make that copy in backward right before w13's wgrad. The copy (1 byte per row of the padded expert
        # buffer: 68 MB at llama_moe, 231 MB at dsv3_layer) was alive from forward to the end of backward, across
        # backward's peak; making it again costs one more read of x.
        remake = x_kept and rows_q is None
        xq, xs, xtq, xts = dispatch_quantize(x, src, offs, spec, rows_q,
                                             outputs=moe_kernels.ROWS if remake else moe_kernels.BOTH)
        h13 = _f8_fprop(xq, xs, *_weight(w13, spec, "fwd"), offs, spec, x.dtype)
        aq, as_, atq, ats = swiglu_quantize(h13, offs, spec)
        y = _f8_fprop(aq, as_, *_weight(w2, spec, "fwd"), offs, spec, x.dtype)
        out = combine(y, pos, weights, spec)
        # float8 token-major copies for the wgrads (or x, to make x's again), h13 for SwiGLU's backward, y for the
        # router weights' grad
        x_for_wgrad = (x, None) if remake else (xtq, xts)
        ctx.save_for_backward(*x_for_wgrad, h13, atq, ats, y, weights, w13, w2, src, pos, offs)
        ctx.spec, ctx.remake = spec, remake
        return out

    @staticmethod
    def backward(ctx, dout):
        xtq, xts, h13, atq, ats, y, weights, w13, w2, src, pos, offs = ctx.saved_tensors
        spec = ctx.spec
        if ctx.remake:  # the first slot holds x (forward's x_for_wgrad)
            x, xtq = xtq, None
        dout = dout.contiguous()
        grad_dtype = dout.dtype
        # Order for peak memory: each dgrad (with its transient float8 weight operand) runs before its wgrad, and
        # dx is summed before dw13 exists, so the biggest buffers (dw13, the float8 w13^T, dx_buf) never coexist;
        # operands are dropped after their last use (under torch.compile the graph frees them there anyway).
        dyq, dys, dytq, dyts, dweights = combine_backward(dout, y, pos, weights, src, offs, spec)
        del y, dout
        da = _dgrad_in_parts(dyq, dys, w2, offs, spec, grad_dtype)
        if da is None:
            da = _f8_dgrad(dyq, dys, *_weight(w2, spec, "bwd", after=dyq), offs, spec, grad_dtype)
        del dyq, dys
        # dSwiGLU before w2's wgrad: h13 and da are gone before dw2 (an output, alive to the end) exists (eager;
        # compiled, inductor's reorder_for_peak_memory picks its own order: it still runs w2's wgrad first, with
        # h13 + da + dw2 at llama_moe tw:mx128's peak, benchmarks/results/issue9_s17/call5_bwd_order/)
        dq, ds, dtq, dts = swiglu_quantize_backward(da, h13, offs, spec)
        del da, h13
        dw2 = _f8_wgrad(dytq, dyts, atq, ats, offs, spec, w2.dtype) if ctx.needs_input_grad[3] else None
        del dytq, dyts, atq, ats
        dx, compiling = None, torch.compiler.is_compiling()
        # x's token-major copy (ctx.remake) is made after w13's dgrad (dq before, where there is no dgrad)
        after = zero_from(dq) if compiling else None
        if ctx.needs_input_grad[0]:
            dx_buf = _dgrad_in_parts(dq, ds, w13, offs, spec, grad_dtype)
            if dx_buf is None:
                dx_buf = _f8_dgrad(dq, ds, *_weight(w13, spec, "bwd", after=dq), offs, spec, grad_dtype)
            after = zero_from(dx_buf) if compiling else None
            # fp8_rowwise, compiled, remaking x's copy: dx is summed here, by the combine op, and the remake (so
            # w13's wgrad) waits for it. With the gather-sum fused into x's final gradient add, inductor ran that
            # add after w13's wgrad: dx_buf ([P, D], 129 MB) alive beside dw13 (352 MB) at llama_moe, a layer peak
            # of 1.045 GiB against bf16's 1.010 (benchmarks/results/issue9_s20/). Costs one pass over dx [N, D].
            materialize = compiling and ctx.remake and spec.recipe == "fp8_rowwise"
            # each token's k rows summed in slot order (fp32 accumulation): deterministic, no atomics
            if compiling and not materialize:
                dx = _sum_token_rows(dx_buf, pos, weights.shape[1], grad_dtype)
            else:  # the combine kernel with unit weights (1 * v is exact): one pass at copy speed
                dx = combine(dx_buf, pos, torch.ones_like(weights, dtype=torch.float32), spec)
            if materialize:
                after = zero_from(dx)
            del dx_buf
        del dq, ds
        dw13 = None
        if ctx.needs_input_grad[2]:
            if ctx.remake:
                xtq, xts = _remake_x_token_major(x, src, offs, spec, after)
            dw13 = _f8_wgrad(dtq, dts, xtq, xts, offs, spec, w13.dtype)
        dweights = dweights.to(weights.dtype) if ctx.needs_input_grad[1] else None
        return dx, dweights, dw13, dw2, None, None, None, None, None, None


def _sum_token_rows(rows: Tensor, pos: Tensor, k: int, dtype) -> Tensor:
    """out[t] = sum_j rows[pos[t*k + j]] in slot order, fp32, then dtype: combine with unit weights as plain ops,
    the same values (a sum of -0s stays -0 here; the kernel starts from +0). Compiled, inductor fuses this
    gather-sum into the kernel that adds x's other gradients (router, shared expert): no [N, D] buffer of its own,
    which inductor had allocated at backward's start and held there (64 MB at llama_moe, at the peak:
    benchmarks/results/issue9_s17/), and one pass fewer."""
    g = rows.index_select(0, pos).view(-1, k, rows.shape[1])
    acc = g[:, 0].float()
    for j in range(1, k):
        acc = acc + g[:, j].float()
    return acc.to(dtype)


def fused_experts(x: Tensor, weights: Tensor, w13: Tensor, w2: Tensor, plan, spec: FusedSpec,
                  rows_q: tuple | None = None, x_kept: bool = False) -> Tensor:
    """The whole float8 expert path: x [N, D], router weights [N, k], plan (DispatchPlan with groups padded
    to spec.align) -> out [N, D] = sum_j weights[t, j] * expert_{e(t, j)}(x[t]). fwd+bwd, no host sync.
    x_kept: the caller holds x through backward anyway (an MoE's router reads it for its weight gradient): the
    op then saves x and makes x's float8 token-major copy for w13's wgrad in backward, instead of holding it
    from forward (same values; ignored with rows_q)."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or w13.shape[2] != x.shape[1] \
            or w2.shape[1] != x.shape[1] or w13.shape[1] != 2 * w2.shape[2]:
        raise ValueError(f"fused_experts: expected x [N, D], w13 [E, 2H, D], w2 [E, D, H]; got x {tuple(x.shape)}, "
                         f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    P = plan.src.shape[0]
    if P % spec.align:
        raise ValueError(f"fused_experts: the dispatch plan has {P} rows, not a multiple of {spec.align}: set the "
                         f"MoE's token_group_align to {spec.align} for moe recipe {spec.recipe!r}")
    if weights.shape[0] != x.shape[0] or plan.pos.shape[0] != weights.numel():
        raise ValueError(f"fused_experts: router weights {tuple(weights.shape)} and plan.pos "
                         f"{tuple(plan.pos.shape)} do not match x {tuple(x.shape)}")
    return _FusedExperts.apply(x, weights, w13, w2, plan.src, plan.pos, plan.offs, spec, rows_q, x_kept)


class Float8GroupedExperts(GroupedExperts):
    """GroupedExperts (same parameters w13 [E, 2H, D], w2 [E, D, H]) whose `routed` is the fused float8 path.

    moe_recipe "fp8_rowwise" | "mxfp8" (granularity mx128 / mx32 / mx32_plain); backend "auto" (CUDA: the
    fast path; elsewhere the emulated twin), "emulated", or for mxfp8 a kernels.grouped_gemm backend name.
    The owning MoE must pad token groups to `token_group_align` (16 for fp8_rowwise, the mxfp8 block).
    act_backend "reference" runs kernels.moe's plain PyTorch ops instead of its Triton kernels (benchmarks).
    """

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, moe_recipe: str = "mxfp8",
                 granularity: str | None = None, backend: str = "auto", act_backend: str = "auto",
                 keep_input_copy: bool = False):
        super().__init__(dim, hidden_dim, num_experts)
        self._configure(moe_recipe, granularity, backend, act_backend)
        # Float8Config.moe_keep_input_copy: with x_kept (routed), keep the float8 token-major copy of x anyway
        self.keep_input_copy = keep_input_copy

    def _configure(self, moe_recipe, granularity, backend, act_backend="auto"):
        if moe_recipe == "mxfp8":
            granularity = granularity or DEFAULT_GRANULARITY
            g = GRANULARITIES.get(granularity)
            multiple = max(g.block, g.weight_tile, g.wgrad_x_tile) if g else 32  # unknown names: make_fused_spec
            bad = [f"{n} {tuple(getattr(self, n).shape)}" for n in ("w13", "w2")
                   if any(d % multiple for d in getattr(self, n).shape[1:])]
            if bad:
                raise ValueError(f"Float8GroupedExperts: moe_recipe 'mxfp8' ({granularity}) needs out/in dims that are "
                                 f"multiples of {multiple}: {', '.join(bad)}")
        elif moe_recipe == "fp8_rowwise":
            bad = [f"{n} {tuple(getattr(self, n).shape)}" for n in ("w13", "w2")
                   if any(d % 16 for d in getattr(self, n).shape[1:])]
            if bad:
                raise ValueError(f"Float8GroupedExperts: moe_recipe 'fp8_rowwise' needs out/in dims that are "
                                 f"multiples of 16: {', '.join(bad)}")
        spec = make_fused_spec(moe_recipe, granularity, backend, "cpu", act_backend)  # validates the names
        self.moe_recipe, self.granularity = moe_recipe, granularity
        self.backend, self.act_backend = backend, act_backend
        self.token_group_align = spec.align

    @classmethod
    def from_grouped_experts(cls, experts: GroupedExperts, config) -> "Float8GroupedExperts":
        """A Float8GroupedExperts holding `experts`' parameters (the same Parameter objects). `config` is a
        Float8Config with moe_recipe_name / moe_granularity (and emulate: the emulated twin)."""
        recipe = getattr(config, "moe_recipe_name", None)
        if recipe in (None, "none"):
            raise ValueError(f"Float8GroupedExperts.from_grouped_experts: config.moe_recipe_name={recipe!r}; "
                             f"set it to one of {', '.join(MOE_RECIPES)}")
        gran = getattr(config, "moe_granularity", None) if recipe == "mxfp8" else None
        backend = "emulated" if getattr(config, "emulate", False) else "auto"
        with torch.device("meta"):
            new = cls(experts.dim, experts.hidden_dim, experts.num_experts, "mxfp8" if recipe == "mxfp8" else
                      "fp8_rowwise", gran)
        new.w13, new.w2 = experts.w13, experts.w2
        new._configure(recipe, gran, backend)
        new.keep_input_copy = bool(getattr(config, "moe_keep_input_copy", False))
        return new

    def prepare_backend(self, device) -> None:
        """Build or load, eagerly, what this module's GEMM backend needs on `device` (the CUTLASS extension for
        mxfp8 "mx128" with backend "auto" / "cutlass" on CUDA). Call it before torch.compile: traced, the first
        load (importlib, the build) is a graph break that stays in every later step (an end-to-end llama_moe run
        had 9 per step). "auto" without CUTLASS runs Triton and logs why when it picks; "cutlass" raises."""
        if (self.moe_recipe != "mxfp8" or torch.device(device).type != "cuda"
                or self.backend not in ("auto", "cutlass") or GRANULARITIES[self.granularity].block != 128):
            return
        from kernels.grouped_gemm import cutlass_backend
        try:
            cutlass_backend.load()
        except cutlass_backend.CutlassUnavailable:
            if self.backend == "cutlass":
                raise

    def spec(self, device) -> FusedSpec:
        return make_fused_spec(self.moe_recipe, self.granularity, self.backend, device, self.act_backend)

    def forward(self, x_sorted: Tensor, offs: Tensor, grad_scale: float = 1.0) -> Tensor:
        """Tokens already in expert order (groups padded to token_group_align, offs[-1] == rows): the fused
        path with the identity plan and unit weights."""
        from titan_fp8.models.moe import DispatchPlan
        rows = torch.arange(x_sorted.shape[0], device=x_sorted.device)
        plan = DispatchPlan(rows, rows, offs, offs)
        ones = torch.ones(x_sorted.shape[0], 1, device=x_sorted.device, dtype=torch.float32)
        return fused_experts(x_sorted, ones, *self.local_weights(grad_scale), plan, self.spec(x_sorted.device))

    def routed(self, x: Tensor, weights: Tensor, plan, rows_q: tuple | None = None,
               grad_scale: float = 1.0, x_kept: bool = False) -> Tensor:
        """rows_q: x's rows already quantized (dispatch_float8's output); grad_scale, x_kept: see GroupedExperts
        (x_kept: fused_experts; keep_input_copy overrides it)."""
        with record_function("moe.experts_fused"):
            return fused_experts(x, weights, *self.local_weights(grad_scale), plan, self.spec(x.device), rows_q,
                                 x_kept and not self.keep_input_copy)

    def dispatch_float8(self, x_send: Tensor, out_splits: list, in_splits: list, group):
        """Expert parallelism with dispatch_dtype "float8": quantize the rows to send (x_send [M, D], grouped
        by destination rank) for the receiver's first grouped GEMM, send them as bytes, return (x_recv: their
        exact dequantization, with autograd; (data, scale): the float8 rows for `routed(..., rows_q=...)`)."""
        spec = self.spec(x_send.device)
        with torch.no_grad():
            data, scale = quantize_dispatch_rows(x_send.detach(), spec)
        x_recv, r_data, r_scale = _float8_all_to_all(x_send, data, scale, out_splits, in_splits, group, spec)
        return x_recv, (r_data, r_scale)
