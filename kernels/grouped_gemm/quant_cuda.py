"""CUDA C++ one-read quantizer for the expert op's activation and gradient copies (sm_90a, built at first use).

    rowcol(x, row_block, col_block, col_tile, limit) -> (row_data, row_scale, col_data, col_scale)

The bytes of quant_triton.to_mxfp8_blocked_rowcol(x, row_block=, col_block=, col_tile=, limit=) with do_row and
do_col (both copies, row_tile 1) for a contiguous bf16 x [M, K], K % 32 == 0, in the four layouts the expert op
makes (LAYOUTS: mx128 x and dO, mx32 x and dO). cuda_quant/rowcol_quant.cu says how it differs from the Triton
kernel (fewer instructions per element, the next tile's loads in flight; 1.05-1.19x its speed on an H100). Which
one runs is quant_triton's switch (TITAN_FP8_ROWCOL_QUANT); this module only builds, checks and launches.

Build: nvcc as for the CUTLASS backend (cutlass_backend.build_extension without the CUTLASS headers), cached under
$TITAN_FP8_CUTLASS_BUILD_DIR; what is missing is one CutlassUnavailable line.
"""
from __future__ import annotations

import os

import torch

from .cutlass_backend import CutlassUnavailable, build_extension, cached_build

SRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_quant")
SOURCES = ("rowcol_quant.cu",)
# (row_block, col_block, col_tile): mx128 x (1x128 rows, 128x128 x^T tiles), mx128 dO (1x128 both ways), mx32 x
# (1x32 rows, 32-token x 128-feature x^T regions), mx32 dO (1x32 both ways)
LAYOUTS = ((128, 128, 128), (128, 128, 1), (32, 32, 128), (32, 32, 1))
_LOADED: dict = {}
# The grid: 0 = one CTA per 128 x 128 tile (the default since session 44: 1.08-1.24x on an H200), N > 0 = a
# persistent grid of N CTAs per SM walking the tiles (sessions 30-43). Benchmarks switch it for A/B timing.
CTAS_PER_SM = 0


def load():
    """The compiled extension (built on the first call, cached; a failed build is cached and raised again)."""
    return cached_build(_LOADED, ("rowcol",), lambda: build_extension(
        "titan_fp8_rowcol_quant", SRC_DIR, SOURCES, (), "CUDA rowcol quantizer", cutlass=False))


def load_source(path: str, tag: str, defines=()):
    """Another revision's rowcol_quant.cu (same launcher signature: ctas_per_sm from session 44 on), or this one
    with build-time `defines` (-DNAME[=VALUE]), built as a separate extension, for A/B timing in one process
    (benchmarks/quant_rowcol_cuda.py --base-src / --variant)."""
    return build_extension("titan_fp8_rowcol_quant", os.path.dirname(os.path.abspath(path)),
                           (os.path.basename(path),), (), f"CUDA rowcol quantizer ({path})", defines=tuple(defines),
                           cutlass=False, tag=tag)


def unsupported_reason(x: torch.Tensor, row_block: int, row_tile: int, col_block: int, col_tile: int,
                       do_row: bool, do_col: bool) -> str | None:
    """Why this call is not one the CUDA kernel makes (a short phrase naming what), or None."""
    if not (do_row and do_col):
        return "only the fused row + column copies"
    if (row_block, col_block, col_tile) not in LAYOUTS or row_tile != 1:
        return (f"layout row {row_block} x {row_tile}, column {col_block} x {col_tile} is not one of "
                f"{LAYOUTS} (row_block, col_block, col_tile) with row_tile 1")
    if not x.is_cuda:
        return f"x is on {x.device}"
    if torch.cuda.get_device_capability(x.device) != (9, 0):
        return f"device capability {torch.cuda.get_device_capability(x.device)}; built for sm_90a only"
    if x.dtype != torch.bfloat16:
        return f"x.dtype is {x.dtype}; bf16 only"
    if x.ndim != 2 and not (x.ndim == 3 and x.shape[0] == 1):
        return f"x has shape {tuple(x.shape)}; [M, K] only"
    M, K = x.shape[-2:]
    mc = (M + 31) // 32 * 32
    if max(M, mc) * K >= 2 ** 31:
        return f"x [{M}, {K}] needs 64-bit offsets"
    return None


def rowcol(x: torch.Tensor, row_block: int, col_block: int, col_tile: int, limit: torch.Tensor | None = None,
           group_m: int = 0, diag: int = 0, ext=None, ctas_per_sm: int | None = None):
    """See the module docstring; x [M, K] or [1, M, K] (outputs shaped as x's rank). Raises ValueError naming what
    does not fit, CutlassUnavailable when the kernel cannot be built here. group_m: the tile order (0: along K
    first; G > 0: runs of G 128-token tiles, K-tile by K-tile; same bytes); diag (measurements only, WRONG
    bytes): 1 skips the column copy's data stores, 2 the row copy's. ext: the extension to launch (default load();
    benchmarks time another revision's build, see load_source). ctas_per_sm: the grid (default CTAS_PER_SM; same
    bytes either way)."""
    why = unsupported_reason(x, row_block, 1, col_block, col_tile, True, True)
    if why:
        raise ValueError(f"quant_cuda.rowcol: {why}")
    if x.shape[-1] % 32:
        raise ValueError(f"quant_cuda.rowcol: x.shape[-1] = {x.shape[-1]} is not a multiple of 32")
    x2 = x.reshape(x.shape[-2:]).contiguous()
    if x2.data_ptr() % 16:
        x2 = x2.clone()
    M, K = x2.shape
    MC = (M + 31) // 32 * 32
    dev, u8 = x2.device, torch.uint8
    qr = torch.empty((M, K), dtype=u8, device=dev)
    sr = torch.empty((M, K // 32), dtype=u8, device=dev)
    qc = torch.empty((K, MC), dtype=u8, device=dev)
    sc = torch.empty((K, MC // 32), dtype=u8, device=dev)
    ctas = CTAS_PER_SM if ctas_per_sm is None else ctas_per_sm
    if not isinstance(ctas, int) or ctas < 0:
        raise ValueError(f"quant_cuda.rowcol: ctas_per_sm = {ctas!r}; 0 (one CTA per tile) or a positive int")
    (ext or load()).rowcol(x2, qr, sr, qc, sc, limit, row_block, col_block, col_tile, group_m, diag, ctas)
    f8 = torch.float8_e4m3fn
    out = (qr.view(f8), sr, qc.view(f8), sc)
    return out if x.ndim == 2 else tuple(t.unsqueeze(0) for t in out)


SOURCE_PATH = os.path.join(SRC_DIR, SOURCES[0])

__all__ = ["rowcol", "load", "load_source", "unsupported_reason", "LAYOUTS", "CutlassUnavailable"]
