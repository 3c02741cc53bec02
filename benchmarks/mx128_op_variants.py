"""The mx128 expert op (titan_fp8.float8.experts.mxfp8_grouped_mm, granularity "mx128") rebuilt with two changes,
to time as whole autograd ops beside it (benchmarks/mxfp8_grouped_gemm_backends.py --ops op_mx128_cutlass_w1,
op_mx128_deepgemm_w1; DeepGEMM through benchmarks/deepgemm_device_run.sh's DG_BACKENDS_ARGS):

  w1        both weight copies (W for fprop, W^T for dgrad) from ONE read of bf16 W in forward, the fp8 W^T kept
            for backward. The op reads W twice (forward, backward) and keeps nothing; this holds E*N*K bytes from
            forward to backward.
  deepgemm  fprop and dgrad on DeepGEMM's sm_90 m-grouped kernel (deep_gemm.m_grouped_fp8_gemm_nt_contiguous,
            the published Hopper anchor: bit-identical to our CUTLASS kernels on these operands and 2-9% faster
            on an H200, benchmarks/results/issue10_s41/). Its fp32 scale layouts and per-row group index are made
            inside the timed op; wgrad stays ours (1.3x faster than DeepGEMM's).

Not product code: the measurement that decides whether a DeepGEMM backend would carry the op to issue 10's 1.5x
bar (session 41's estimate from kernel times: ~1.45-1.48x at even routing). Every group must be a multiple of 128
rows (DeepGEMM's contiguous layout; the benchmark's routings are). gemm="reference" runs the same plumbing on the
emulated twin (CPU), which tests/cpu/test_mx128_op_variants.py compares with the op itself.
"""
from __future__ import annotations

import torch

import kernels.grouped_gemm as gg
from kernels.mxfp8.reference import e8m0_to_fp32
from titan_fp8.float8 import experts

G = experts.GRANULARITIES["mx128"]
GEMMS = ("cutlass", "deepgemm", "reference")


def deepgemm_scales(scale: torch.Tensor, tile: int) -> torch.Tensor:
    """E8M0 bytes [..., R, C/32], equal over 4 blocks (and over `tile` rows) -> fp32 [..., R/tile, C/128]: one
    factor per 1x128 block (tile 1) or 128x128 tile, the values DeepGEMM reads (2^e exactly)."""
    s = e8m0_to_fp32(scale[..., ::4])
    return s[..., ::tile, :].contiguous() if tile > 1 else s


def mn_major(sf: torch.Tensor) -> torch.Tensor:
    """[R, C] -> the same values with strides (1, R): DeepGEMM's MN-major activation scales (R % 4 == 0)."""
    return sf.t().contiguous().t()


def row_groups(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """int32 [rows]: each row's group (offs: cumulative END rows), -1 at or past offs[-1] (DeepGEMM skips those)."""
    r = torch.arange(rows, device=offs.device, dtype=offs.dtype)
    g = torch.searchsorted(offs, r, right=True)
    return torch.where(g < offs.shape[0], g, -1).to(torch.int32)


def _deepgemm_rows(a, sa, b, sb, groups):
    """out[M, N] = a @ b[e]^T per row group on DeepGEMM: b [E, N, K] data (K contiguous), 128x128-tile scales."""
    import deep_gemm

    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, mn_major(deepgemm_scales(sa, 1))),
                                               (b, deepgemm_scales(sb, 128)), out, groups,
                                               disable_ue8m0_cast=True)
    return out


def _weights_one_read(w, emulated):
    """(W data [E, N, K], scale, W^T data [E, K, N], scale), 128x128 tiles, from one read of w (GPU)."""
    if emulated:
        return experts._quant_weight(w, G, False, "emulated") + experts._quant_weight(w, G, True, "emulated")
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol

    return to_mxfp8_blocked_rowcol(w, row_block=G.block, row_tile=G.weight_tile, col_block=G.block,
                                   col_tile=G.weight_tile)


class _Mx128OpVariant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offs, gemm):
        emulated = gemm == "reference"
        backend = "emulated" if emulated else "cutlass"
        kw = dict(block=G.block, w_tile=G.weight_tile, validate=False, backend="cutlass")
        xd, xs, xtd, xts = experts._quant_act(x, offs, G, True, True, G.wgrad_x_tile, backend)
        wd, ws, wtd, wts = _weights_one_read(w, emulated)
        groups = row_groups(offs, x.shape[0]) if gemm == "deepgemm" else None
        if gemm == "deepgemm":
            out = _deepgemm_rows(xd, xs, wd, ws, groups)
        elif emulated:
            out = gg.grouped_mm_fprop_reference(xd, xs, wd, ws, offs, out_dtype=x.dtype)
        else:
            out = gg.mxfp8_grouped_mm_fprop(xd, xs, wd, ws, offs, x.dtype, **kw)
        ctx.save_for_backward(xtd, xts, wtd, wts, offs, groups)
        ctx.gemm, ctx.x_dtype, ctx.w_dtype = gemm, x.dtype, w.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        xtd, xts, wtd, wts, offs, groups = ctx.saved_tensors
        gemm = ctx.gemm
        emulated = gemm == "reference"
        kw = dict(block=G.block, validate=False, backend="cutlass")
        dd, ds, dtd, dts = experts._quant_act(dout, offs, G, True, True, 1, "emulated" if emulated else "cutlass")
        wn_data, wn_scale = wtd.transpose(1, 2), wts.transpose(1, 2)  # [E, N, K] view of W^T, as the op passes it
        if gemm == "deepgemm":
            dx = _deepgemm_rows(dd, ds, wtd, wts, groups)  # W^T [E, K, N]: N contiguous, DeepGEMM's K-major B
        elif emulated:
            dx = gg.grouped_mm_dgrad_reference(dd, ds, wn_data, wn_scale, offs, out_dtype=ctx.x_dtype)
        else:
            dx = gg.mxfp8_grouped_mm_dgrad(dd, ds, wn_data, wn_scale, offs, ctx.x_dtype, w_tile=G.weight_tile, **kw)
        if emulated:
            dw = gg.grouped_mm_wgrad_reference(dtd, dts, xtd, xts, offs, out_dtype=torch.float32)
        else:  # bf16 dW from the kernel, as the op writes it for bf16 weights
            dw = gg.mxfp8_grouped_mm_wgrad(dtd, dts, xtd, xts, offs, torch.bfloat16, a_tile=G.wgrad_x_tile,
                                           token_align=128, **kw)
        return dx, dw.to(ctx.w_dtype), None, None


def mx128_op_variant(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, gemm: str = "cutlass") -> torch.Tensor:
    """x [T, in] bf16, w [E, out, in], offs int32 [E] (every group a multiple of 128 rows): the mx128 op with both
    weight copies from one read and fprop / dgrad on `gemm` (GEMMS)."""
    if gemm not in GEMMS:
        raise ValueError(f"mx128_op_variant: gemm={gemm!r}; allowed: {', '.join(GEMMS)}")
    return _Mx128OpVariant.apply(x, w, offs, gemm)
