"""MXFP8 grouped GEMM for MoE experts: the autograd op that GroupedExperts.mm becomes under float8.

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

"mx128" is the one faster than bf16 on H200 (1.07-1.29x; NOTES.md); it is DeepSeek-V3's 1x128 / 128x128
granularity with power-of-two (E8M0) scales, plus 128x128 tiles for x^T in wgrad. "mx32" keeps the OCP MX
1x32 blocks on every activation and gradient. Token blocks for wgrad lie on the global token grid (from row
0), so a block that straddles two experts' rows has one scale for both. Rows at or past offs[-1] are
zeroed before the token-axis quantization so padding garbage (torch._grouped_mm leaves such rows
uninitialised) cannot reach a real token's scale.

CUDA tensors run the Triton kernels (quantization: kernels/grouped_gemm/quant_triton.py, one read of x / dO
for both copies; GEMMs: kernels/grouped_gemm); anything else runs the emulated twin (the same quantization in
plain PyTorch, kernels/grouped_gemm/quant.py, then the float64 dequantize-then-matmul references), which
tests compare with the kernels.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from kernels.grouped_gemm import (
    grouped_mm_dgrad_reference,
    grouped_mm_fprop_reference,
    grouped_mm_wgrad_reference,
    mxfp8_grouped_mm_dgrad,
    mxfp8_grouped_mm_fprop,
    mxfp8_grouped_mm_wgrad,
)
from kernels.grouped_gemm.quant import to_mxfp8_blocked

__all__ = ["Granularity", "GRANULARITIES", "mxfp8_grouped_mm", "make_mxfp8_grouped_mm"]


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
    if backend not in ("auto", "triton", "gluon", "emulated"):
        raise ValueError(f"mxfp8_grouped_mm: backend={backend!r}; allowed: 'auto', 'triton', 'gluon', 'emulated'")
    if backend == "auto":
        return "triton" if t.is_cuda else "emulated"
    return backend


def _zero_padding_rows(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x with rows at or past offs[-1] set to 0 (no host sync)."""
    if offs.numel() == 0:
        return torch.zeros_like(x)
    rows = torch.arange(x.shape[0], device=x.device)
    return torch.where((rows < offs[-1]).unsqueeze(1), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _token_major(x: torch.Tensor, offs: torch.Tensor, block: int, tile: int):
    """MXFP8 of x^T [C, T'] along tokens (T' = T rounded up to 32, zero rows appended)."""
    x = _zero_padding_rows(x, offs)
    pad = (-x.shape[0]) % 32
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    return to_mxfp8_blocked(x.t(), -1, block, tile)


def _quant_act(t, offs, g, row, col, col_tile, backend):
    """Row copy of t [T, C] along C (1 x block) and token-major copy along tokens (block x col_tile), padding
    rows zeroed for the latter. Triton: one read of t; emulated: plain PyTorch, same bytes."""
    if backend != "emulated":
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
        return to_mxfp8_blocked_rowcol(t, row_block=g.block, col_block=g.block, col_tile=col_tile, do_row=row,
                                       do_col=col, limit=offs[-1:])
    rd, rs = to_mxfp8_blocked(t, -1, g.block, 1) if row else (None, None)
    cd, cs = _token_major(t, offs, g.block, col_tile) if col else (None, None)
    return rd, rs, cd, cs


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
    if backend != "emulated":  # "triton" or "gluon" (kernels/grouped_gemm/gluon_mx.py; needs weight_tile 128)
        return mxfp8_grouped_mm_fprop(xd, xs, wd, ws, offs, out_dtype, block=g.block, w_tile=g.weight_tile,
                                      validate=False, backend=backend)
    return grouped_mm_fprop_reference(xd, xs, wd, ws, offs, out_dtype=out_dtype)


class _MXFP8GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offs, g, backend):
        # x along in, and (only if w needs a gradient) the token-major copy wgrad reads: float8 is what is
        # saved for backward, not bf16 x
        xd, xs, xtd, xts = _quant_act(x, offs, g, True, ctx.needs_input_grad[1], g.wgrad_x_tile, backend)
        wd, ws = _quant_weight(w, g, False, backend)
        out = _fprop(xd, xs, wd, ws, offs, x.dtype, g, backend)
        ctx.save_for_backward(xtd, xts, w, offs)
        ctx.g, ctx.backend, ctx.x_dtype, ctx.T = g, backend, x.dtype, x.shape[0]
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
                dw = mxfp8_grouped_mm_wgrad(dtd, dts, xtd, xts, offs, torch.float32, block=g.block,
                                            a_tile=g.wgrad_x_tile, validate=False, backend=backend)
            else:
                dw = grouped_mm_wgrad_reference(dtd, dts, xtd, xts, offs, out_dtype=torch.float32)
            dw = dw.to(w.dtype)
        return dx, dw, None, None, None


def mxfp8_grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *,
                     granularity: str = DEFAULT_GRANULARITY, backend: str = "auto") -> torch.Tensor:
    """MXFP8 grouped GEMM with autograd: x [T, in] (bf16/fp32), w [E, out, in], offs int32 [E]."""
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
    return _MXFP8GroupedMM.apply(x, w, offs, GRANULARITIES[granularity], _backend(x, backend))


def make_mxfp8_grouped_mm(granularity: str = DEFAULT_GRANULARITY, backend: str = "auto"):
    """A (x, w, offs) callable for GroupedExperts.mm with the granularity fixed."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"make_mxfp8_grouped_mm: granularity={granularity!r}; allowed: {', '.join(GRANULARITIES)}")
    return functools.partial(mxfp8_grouped_mm, granularity=granularity, backend=backend)
