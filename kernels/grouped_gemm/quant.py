"""MXFP8 with coarser scale sharing, for the fast grouped-GEMM paths (plain PyTorch, any device).

`to_mxfp8_blocked(x, dim, block, tile)` returns an ordinary MXFP8 pair in kernels.mxfp8's layout (data
e4m3fn with x's shape, one E8M0 byte per 1x32 block along `dim`), but computes ONE scale for every
`block` elements along `dim` x `tile` rows of the other of the last two axes, from that region's amax with
the format's own rule (kernels.mxfp8.reference: e = ceil(log2(amax / 448)), exact), and writes it into each
1x32 block it covers. block=32, tile=1 is exactly kernels.mxfp8.to_mxfp8. Every 1x32 block still has its
scale, so any MXFP8 reader decodes the result; the scale is just shared more widely (less precision for
small values next to large ones: a coarser quantization, stated wherever it is used).

Since e is monotone in amax, the shared scale equals the largest of the 1x32 scales it covers.
"""

from __future__ import annotations

import torch

from kernels.mxfp8.reference import BLOCK, _quantize_blocks, check_input


def to_mxfp8_blocked(x: torch.Tensor, dim: int = -1, block: int = 32, tile: int = 1):
    """Quantize x ([..., R, C], 2-D or more) along dim (one of the last two) with scales shared over
    block (along dim, a multiple of 32) x tile (across, >= 1). Returns (data, scale) as to_mxfp8 does."""
    if x.ndim < 2:
        raise ValueError(f"to_mxfp8_blocked: x must have at least 2 dims, got shape {tuple(x.shape)}")
    d = check_input(x, dim, "to_mxfp8_blocked")
    if d < x.ndim - 2:
        raise ValueError(f"to_mxfp8_blocked: dim={dim} must be one of the last two dims of shape {tuple(x.shape)}")
    if block % BLOCK or block <= 0:
        raise ValueError(f"to_mxfp8_blocked: block={block} must be a positive multiple of {BLOCK}")
    if tile < 1:
        raise ValueError(f"to_mxfp8_blocked: tile={tile} must be >= 1")
    along_rows = d == x.ndim - 2
    xt = x.transpose(-1, -2) if along_rows else x  # scaled axis last
    *lead, R, C = xt.shape
    pr, pc = (-R) % tile, (-C) % block
    xf = xt.to(torch.float32)
    if pr or pc:
        xf = torch.nn.functional.pad(xf, (0, pc, 0, pr))  # zeros leave every amax unchanged
    Rp, Cp = R + pr, C + pc
    t = xf.reshape(*lead, Rp // tile, tile, Cp // block, block).transpose(-3, -2)
    t = t.reshape(*lead, Rp // tile, Cp // block, tile * block)
    amax = t.abs().amax(-1) if t.numel() else t.new_zeros(t.shape[:-1])
    nonfinite = ~torch.isfinite(t).all(-1)
    data, s = _quantize_blocks(t, amax, nonfinite)  # data uint8 [..., Rp/t, Cp/b, t*b], s [..., Rp/t, Cp/b]
    data = data.reshape(*lead, Rp // tile, Cp // block, tile, block).transpose(-3, -2)
    data = data.reshape(*lead, Rp, Cp)[..., :R, :C]
    scale = s.repeat_interleave(tile, dim=-2).repeat_interleave(block // BLOCK, dim=-1)[..., :R, : C // BLOCK]
    if along_rows:
        data, scale = data.transpose(-1, -2), scale.transpose(-1, -2)
    return data.contiguous().view(torch.float8_e4m3fn), scale.contiguous()


def blockwise_scale_buffers(R: int, C: int, tile: bool, device):
    """fp32 scale tensors for fp8 data [R, C] in the layouts cuBLAS's blockwise GEMMs read (torch's F.scaled_mm
    checks them exactly). Returns (base, scale, stride_i, stride_j): `base` is a CONTIGUOUS tensor (what a kernel
    writes: no compiler can re-lay it out under the kernel), `scale` the view handed on, region (i, j) at
    base + i * stride_i + j * stride_j:
      tile=False  1x128 along C: scale [R, C/128] with strides (1, R) (outer-dim-major) = base [C/128, R] transposed
      tile=True   128x128: base = scale, row-major [R/128, round_up(C/128, 4)], 1.0 in the padding columns (cuBLAS
                  reads its transpose: K-block-major with a 16-byte aligned column stride)"""
    if tile:
        L4 = -(-(C // 128) // 4) * 4
        base = torch.ones((R // 128, L4), dtype=torch.float32, device=device)
        return base, base, L4, 1
    base = torch.empty((C // 128, R), dtype=torch.float32, device=device)
    return base, base.t(), 1, R


def to_mxfp8_blocked_rowcol_reference(x: torch.Tensor, *, row_block: int = 128, row_tile: int = 1,
                                      col_block: int = 128, col_tile: int = 1, do_row: bool = True,
                                      do_col: bool = True, limit: torch.Tensor | None = None):
    """Plain PyTorch twin of quant_triton.to_mxfp8_blocked_rowcol for x [M, K] (bit for bit, same layouts):
    (row_data [M, K], row_scale [M, K/32], col_data [K, MC], col_scale [K, MC/32]), a copy not asked for None.
    The column copy is x'^T with x' = x with rows at or past limit[0] (a device scalar; no host sync; an empty
    limit, e.g. offs[-1:] of no groups: every row) zeroed and zero rows appended up to MC = M rounded up to 32."""
    rd = rs = cd = cs = None
    if do_row:
        rd, rs = to_mxfp8_blocked(x, -1, row_block, row_tile)
    if do_col:
        if limit is not None:
            end = limit.reshape(-1)[:1] if limit.numel() else limit.new_zeros(1)
            keep = torch.arange(x.shape[0], device=x.device) < end
            x = torch.where(keep.unsqueeze(1), x, torch.zeros((), dtype=x.dtype, device=x.device))
        x = torch.nn.functional.pad(x, (0, 0, 0, (-x.shape[0]) % 32))
        cd, cs = to_mxfp8_blocked(x.t(), -1, col_block, col_tile)
    return rd, rs, cd, cs


def to_mx128_blockwise_reference(x: torch.Tensor, tile: bool, do_row: bool = True, do_col: bool = True,
                                 col_tile: bool | None = None):
    """Plain PyTorch twin of quant_triton.to_mx128_blockwise (bit for bit, same layouts): x [M, K] ->
    ((row_data [M, K], row_scale), (col_data [K, M], col_scale)), MXFP8 numbers shared over 1x128 blocks
    (tile=False) or 128x128 tiles (tile=True), scales as fp32 factors 2^e in cuBLAS's blockwise layouts
    (blockwise_scale_buffers; a copy not asked for is (None, None))."""
    from kernels.mxfp8.reference import e8m0_to_fp32

    col_tile = tile if col_tile is None else col_tile

    def one(t, tile):  # t [R, C] scaled along C -> (data, scale in its cuBLAS layout)
        R, C = t.shape
        T = 128 if tile else 1
        q, s = to_mxfp8_blocked(t, -1, 128, T)
        f = e8m0_to_fp32(s[::T, ::128 // BLOCK])  # one factor per region
        _, buf, _, _ = blockwise_scale_buffers(R, C, tile, t.device)
        (buf[:, : C // 128] if tile else buf).copy_(f)
        return q, buf

    row = one(x, tile) if do_row else (None, None)
    col = one(x.t(), col_tile) if do_col else (None, None)
    return row, col
