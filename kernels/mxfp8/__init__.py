"""MXFP8 (E4M3 elements, one E8M0 power-of-two scale per 32 elements): the format's one home.

Public entry points (contracts; see reference.py for the exact rule):
  to_mxfp8(x, dim=-1, backend="auto") -> (data float8_e4m3fn [x.shape], scale uint8 [x.shape, dim/32])
  from_mxfp8(data, scale, dim=-1, dtype=torch.float32) -> tensor
  to_mxfp8_rowcol(x, col_transposed=True, backend="auto") -> (data_row, scale_row, data_col, scale_col)
      x [M, K]; row: along K, scale [M, K/32]. col_transposed=True: data_col [K, M], scale_col [K, M/32]
      (== to_mxfp8(x.t(), -1)); False: data_col [M, K], scale_col [M/32, K] (== to_mxfp8(x, 0)).
      The Triton kernel reads x once for both.
  to_mxfp8_expert_weights(w, dim=-1, backend="auto") -> (data [E, N, K], scale [E, N, K/32] or [E, N/32, K])
  to_mxfp8_tiles32(w, backend="auto") -> (data [..., N, K], scale_k [..., N, K/32], scale_n [..., N/32, K])
      one scale per 32x32 tile, stored expanded both ways (transpose-invariant weight).
  e8m0_to_fp32(scale) -> fp32 factors 2^(b-127), 0xFF -> NaN.

Quantization is not differentiable: every entry point detaches its input, so outputs never require grad
(the autograd ops in titan_fp8/float8 decide what gradients flow).

backend: "auto" = Triton on CUDA tensors, reference elsewhere; "reference" = plain PyTorch; "triton" = the
Triton kernels (on CPU only under TRITON_INTERPRET=1). Triton paths go through torch.library custom ops
(titan_fp8::to_mxfp8, ::to_mxfp8_rowcol, ::to_mxfp8_tiles32) with fake implementations, so torch.compile
and FSDP2 see through them.
"""

import torch

from .reference import (  # noqa: F401
    BLOCK,
    E4M3_MAX,
    E4M3_NAN_BYTE,
    E8M0_NAN,
    check_input,
    e8m0_to_fp32,
    from_mxfp8_reference,
    scale_shape,
    to_mxfp8_reference,
    to_mxfp8_rowcol_reference,
    to_mxfp8_tiles32_reference,
)

__all__ = [
    "to_mxfp8", "from_mxfp8", "to_mxfp8_rowcol", "to_mxfp8_expert_weights", "to_mxfp8_tiles32",
    "e8m0_to_fp32", "to_mxfp8_reference", "from_mxfp8_reference", "to_mxfp8_rowcol_reference",
    "to_mxfp8_tiles32_reference", "BLOCK", "E4M3_MAX",
]

_BACKENDS = ("auto", "reference", "triton")


def _triton():
    # Imported lazily: TRITON_INTERPRET must be set before the kernels are decorated, and the reference
    # path must work where triton is missing.
    from . import triton as _t
    return _t


def _use_triton(x: torch.Tensor, backend: str) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"mxfp8: backend={backend!r}; allowed: {', '.join(map(repr, _BACKENDS))}")
    if backend == "auto":
        return x.is_cuda
    return backend == "triton"


# ------------------------------------------------------------------------------------------ custom ops
@torch.library.custom_op("titan_fp8::to_mxfp8", mutates_args=())
def _to_mxfp8_op(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _triton().to_mxfp8_triton(x, dim)


@_to_mxfp8_op.register_fake
def _(x, dim):
    d = dim % x.ndim
    return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(scale_shape(x.shape, d), dtype=torch.uint8, device=x.device))


@torch.library.custom_op("titan_fp8::to_mxfp8_rowcol", mutates_args=())
def _to_mxfp8_rowcol_op(x: torch.Tensor, col_transposed: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                           torch.Tensor, torch.Tensor]:
    return _triton().to_mxfp8_rowcol(x, col_transposed)


@_to_mxfp8_rowcol_op.register_fake
def _(x, col_transposed):
    M, K = x.shape
    f8, u8 = torch.float8_e4m3fn, torch.uint8
    dr = torch.empty((M, K), dtype=f8, device=x.device)
    sr = torch.empty((M, K // BLOCK), dtype=u8, device=x.device)
    if col_transposed:
        # scale_col: [K, M/32] viewing a row-major [M/32, K] buffer (see kernels.mxfp8.triton.to_mxfp8_rowcol)
        return dr, sr, torch.empty((K, M), dtype=f8, device=x.device), torch.empty_strided(
            (K, M // BLOCK), (1, K), dtype=u8, device=x.device)
    return dr, sr, torch.empty((M, K), dtype=f8, device=x.device), torch.empty((M // BLOCK, K), dtype=u8,
                                                                                device=x.device)


@torch.library.custom_op("titan_fp8::to_mxfp8_tiles32", mutates_args=())
def _to_mxfp8_tiles32_op(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _triton().to_mxfp8_tiles32_triton(w)


@_to_mxfp8_tiles32_op.register_fake
def _(w):
    return (torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device),
            torch.empty(scale_shape(w.shape, w.ndim - 1), dtype=torch.uint8, device=w.device),
            torch.empty(scale_shape(w.shape, w.ndim - 2), dtype=torch.uint8, device=w.device))


# ------------------------------------------------------------------------------------------ public API
def to_mxfp8(x: torch.Tensor, dim: int = -1, backend: str = "auto"):
    """Quantize x to MXFP8 along `dim` -> (data float8_e4m3fn, scale uint8 E8M0). See reference.py."""
    d = check_input(x, dim)
    x = x.detach()  # quantization is not differentiable: outputs never require grad (autograd lives apart)
    if _use_triton(x, backend):
        return _to_mxfp8_op(x, d)
    return to_mxfp8_reference(x, d)


def from_mxfp8(data: torch.Tensor, scale: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.float32):
    """Decode MXFP8 to `dtype` (plain PyTorch; runs anywhere, compiles under torch.compile)."""
    return from_mxfp8_reference(data, scale, dim, dtype)


def to_mxfp8_rowcol(x: torch.Tensor, col_transposed: bool = True, backend: str = "auto"):
    """x [M, K] -> (data_row [M, K], scale_row [M, K/32], data_col, scale_col); see the module docstring."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"to_mxfp8_rowcol: x must be 2-D [M, K], got shape "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    check_input(x, 0, "to_mxfp8_rowcol")
    check_input(x, 1, "to_mxfp8_rowcol")
    x = x.detach()
    if _use_triton(x, backend):
        return _to_mxfp8_rowcol_op(x, bool(col_transposed))
    return to_mxfp8_rowcol_reference(x, col_transposed)


def to_mxfp8_expert_weights(w: torch.Tensor, dim: int = -1, backend: str = "auto"):
    """Expert weights w [E, N, K] along K (dim=-1 / 2: scale [E, N, K/32]) or along N (dim=-2 / 1:
    scale [E, N/32, K]). Same format as to_mxfp8; named for the call sites."""
    if not isinstance(w, torch.Tensor) or w.ndim != 3:
        raise ValueError(f"to_mxfp8_expert_weights: w must be 3-D [E, N, K], got shape "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    d = check_input(w, dim, "to_mxfp8_expert_weights", "w")
    if d == 0:
        raise ValueError("to_mxfp8_expert_weights: dim=0 would scale across experts; use dim=-1 (K) or -2 (N)")
    return to_mxfp8(w, d, backend)


def to_mxfp8_tiles32(w: torch.Tensor, backend: str = "auto"):
    """w [..., N, K] -> (data, scale_k [..., N, K/32], scale_n [..., N/32, K]) with one scale per 32x32 tile."""
    if not isinstance(w, torch.Tensor) or w.ndim < 2:
        raise ValueError(f"to_mxfp8_tiles32: w must be [..., N, K] with at least 2 dims, got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    check_input(w, -2, "to_mxfp8_tiles32", "w")
    check_input(w, -1, "to_mxfp8_tiles32", "w")
    w = w.detach()
    if _use_triton(w, backend):
        return _to_mxfp8_tiles32_op(w)
    return to_mxfp8_tiles32_reference(w)
