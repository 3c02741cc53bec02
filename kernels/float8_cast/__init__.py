"""Rowwise float8 casts (E4M3, one power-of-two scale per row or per column): the operands of a rowwise-scaled
float8 linear, each read from high precision once.

Public entry points (contracts; reference.py has the exact rule):
  to_float8_rowwise(x, backend="auto") -> (data e4m3 [M, N], scale fp32 [M, 1], col_amax fp32 [N])
      rows of x [M, N] cast with one scale each; col_amax = max |x| per column (NaN counted as inf), measured
      in the same read, for a later to_float8_colwise_transposed of the same x.
  to_float8_colwise_transposed(x, col_amax, backend="auto") -> (data_t e4m3 [N, M] row-major, scale fp32 [1, N])
      columns of x cast with one scale each, stored transposed (the layout a float8 GEMM reads for the
      grad-weight operands and the column-major weight).
  to_float8_transposed(x, scale, float8_dtype=e4m3, backend="auto") -> data_t [N, M] row-major
      tensorwise: to_float8(x, scale, dtype).t().contiguous() in one pass (the grad-weight operand).
  to_float8_with_transpose(x, scale, float8_dtype=e4m3, backend="auto") -> (data [M, N], data_t [N, M])
      tensorwise, both layouts from one read (the output gradient, e5m2: grad-input and grad-weight).
  to_float8_tensorwise(x, scale, float8_dtype=e4m3, backend="auto") -> data, x's shape
      to_float8(x, scale, dtype) in one pass, for EAGER callers (FSDP2's float8 all-gather casts the weight
      shards in its hooks, outside any compiled region): a plain Triton launch, not a triton op.
  to_float8_tensorwise_many(xs, scales, float8_dtype=e4m3, backend="auto") -> [data of x, x's shape, ...]
      [to_float8(x, scales[i], dtype) for each x] in ONE launch (the outputs are views into one buffer): FSDP2's
      float8 all-gather casts a block's weight shards together, one Python launch instead of one per weight.
  amax_to_scale, to_float8: the amax -> scale rule and the plain cast every non-MX recipe uses.

backend: "auto" = Triton on CUDA tensors (rows up to kernels.float8_cast.triton._MAX_ROW elements), reference
elsewhere; "reference" = plain PyTorch; "triton" = the Triton kernels (on CPU only under TRITON_INTERPRET=1).
The Triton paths are torch.library triton ops (titan_fp8::to_float8_rowwise, ::to_float8_colwise_transposed,
::to_float8_transposed, ::to_float8_with_transpose): torch.compile traces their launches into its generated
code (no Python launcher or dispatcher per call; as custom ops they cost ~0.25 ms of host time per call on
torch 2.11, which at these kernels' 10-60 us made a compiled rowwise linear host-bound).
Outputs never require grad (the casts run under no_grad).
"""
import torch

from .reference import (  # noqa: F401
    E4M3,
    E5M2,
    EPS,
    abs_amax,
    amax_to_scale,
    to_float8,
    to_float8_colwise_transposed_reference,
    to_float8_rowwise_reference,
)

__all__ = ["to_float8_rowwise", "to_float8_colwise_transposed", "to_float8_transposed", "to_float8_with_transpose",
           "to_float8_tensorwise", "to_float8_tensorwise_many", "amax_to_scale", "to_float8",
           "to_float8_rowwise_reference", "to_float8_colwise_transposed_reference"]

_BACKENDS = ("auto", "reference", "triton")
_MAX_ROW = 16384  # kept equal to kernels.float8_cast.triton._MAX_ROW (tests check), without importing triton


def _triton():
    from . import triton as _t  # lazily: TRITON_INTERPRET must be set first; the reference needs no triton
    return _t


def _use_triton(x: torch.Tensor, backend: str, row_len: int) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"float8_cast: backend={backend!r}; allowed: {', '.join(map(repr, _BACKENDS))}")
    if x.numel() == 0:
        return False
    if backend == "auto":
        return x.is_cuda and row_len <= _MAX_ROW
    return backend == "triton"


@torch.library.triton_op("titan_fp8::to_float8_rowwise", mutates_args=())
def _rowwise_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _triton().to_float8_rowwise_triton(x)


@torch.library.triton_op("titan_fp8::to_float8_colwise_transposed", mutates_args=())
def _colwise_t_op(x: torch.Tensor, col_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _triton().to_float8_colwise_transposed_triton(x, col_amax)


@torch.library.triton_op("titan_fp8::to_float8_transposed", mutates_args=())
def _transposed_op(x: torch.Tensor, scale: torch.Tensor, e5m2: bool) -> torch.Tensor:
    return _triton().to_float8_transposed_triton(x, scale, E5M2 if e5m2 else E4M3)


@torch.library.triton_op("titan_fp8::to_float8_with_transpose", mutates_args=())
def _with_transpose_op(x: torch.Tensor, scale: torch.Tensor, e5m2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _triton().to_float8_with_transpose_triton(x, scale, E5M2 if e5m2 else E4M3)


def _check_2d(x, who, name="x"):
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"{who}: {name} must be a 2-D tensor [M, N], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not x.is_floating_point() or x.dtype in (E4M3, E5M2):
        raise ValueError(f"{who}: {name} must be a high-precision float tensor, got dtype {x.dtype}")


def to_float8_rowwise(x: torch.Tensor, backend: str = "auto"):
    """x [M, N] -> (data e4m3 [M, N], scale fp32 [M, 1], col_amax fp32 [N]); see the module docstring."""
    _check_2d(x, "to_float8_rowwise")
    with torch.no_grad():  # (not x.detach(): see to_float8_transposed)
        if _use_triton(x, backend, x.shape[1]):
            return _rowwise_op(x.contiguous())
        return to_float8_rowwise_reference(x)


def to_float8_colwise_transposed(x: torch.Tensor, col_amax: torch.Tensor, backend: str = "auto"):
    """x [M, N], col_amax [N] -> (data_t e4m3 [N, M], scale fp32 [1, N]); see the module docstring."""
    _check_2d(x, "to_float8_colwise_transposed")
    if col_amax.shape != (x.shape[1],) or col_amax.dtype != torch.float32:
        raise ValueError(f"to_float8_colwise_transposed: col_amax must be fp32 [{x.shape[1]}] (one per column of "
                         f"x {tuple(x.shape)}), got {col_amax.dtype} {tuple(col_amax.shape)}")
    with torch.no_grad():
        if _use_triton(x, backend, 0):  # any row length: the kernel tiles both dims
            return _colwise_t_op(x.contiguous(), col_amax)
        return to_float8_colwise_transposed_reference(x, col_amax)


def _check_tensorwise(x, scale, float8_dtype, who):
    _check_2d(x, who)
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError(f"{who}: scale must be ONE fp32 value, got {scale.dtype} {tuple(scale.shape)}")
    if float8_dtype not in (E4M3, E5M2):
        raise ValueError(f"{who}: float8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {float8_dtype}")


def to_float8_transposed(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype = E4M3,
                         backend: str = "auto") -> torch.Tensor:
    """x [M, N], scale fp32 with one element -> data_t [N, M] row-major (tensorwise, one pass)."""
    _check_tensorwise(x, scale, float8_dtype, "to_float8_transposed")
    # Quantization is not differentiable: no_grad, not x.detach(), which in a compiled backward made the
    # partitioner keep the forward's float8 copy of x alive for backward (tests/cpu/test_float8_memory.py)
    with torch.no_grad():
        if _use_triton(x, backend, 0):
            return _transposed_op(x.contiguous(), scale, float8_dtype == E5M2)
        # transpose first: under torch.compile this stays a different node from a forward cast of the same x,
        # so it is not merged with it (and the partitioner does not keep that float8 copy for backward either)
        return to_float8(x.t().contiguous(), scale, float8_dtype)


def to_float8_with_transpose(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype = E4M3,
                             backend: str = "auto"):
    """x [M, N], scale fp32 with one element -> (data [M, N], data_t [N, M] row-major) from one read (the
    output gradient: grad-input reads it row-major, grad-weight transposed)."""
    _check_tensorwise(x, scale, float8_dtype, "to_float8_with_transpose")
    with torch.no_grad():
        if _use_triton(x, backend, 0):
            return _with_transpose_op(x.contiguous(), scale, float8_dtype == E5M2)
        data = to_float8(x, scale, float8_dtype)
        return data, data.t().contiguous()


def to_float8_tensorwise(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype = E4M3,
                         backend: str = "auto") -> torch.Tensor:
    """to_float8(x, scale, float8_dtype) (x any shape, scale fp32 with one element) in one pass; for eager
    callers (see the module docstring). Under torch.compile use to_float8: inductor fuses it."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype in (E4M3, E5M2):
        raise ValueError(f"to_float8_tensorwise: x must be a high-precision float tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)}")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError(f"to_float8_tensorwise: scale must be ONE fp32 value, got {scale.dtype} {tuple(scale.shape)}")
    if float8_dtype not in (E4M3, E5M2):
        raise ValueError(f"to_float8_tensorwise: float8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got "
                         f"{float8_dtype}")
    with torch.no_grad():
        if _use_triton(x, backend, 0):
            return _triton().to_float8_tensorwise_triton(x.contiguous(), scale, float8_dtype)
        return to_float8(x, scale, float8_dtype)


def to_float8_tensorwise_many(xs, scales: torch.Tensor, float8_dtype: torch.dtype = E4M3,
                              backend: str = "auto") -> list:
    """[to_float8(x, scales[i], float8_dtype) for i, x in enumerate(xs)] (xs: high-precision tensors of one dtype
    and device, any shapes; scales fp32 [len(xs)] on that device) in one pass over all of them and ONE launch on
    CUDA; for eager callers (see the module docstring). Empty tensors give empty results."""
    who = "to_float8_tensorwise_many"
    if not isinstance(xs, (list, tuple)) or not xs or not all(isinstance(x, torch.Tensor) for x in xs):
        raise ValueError(f"{who}: xs must be a non-empty list of tensors")
    dtypes, devices = {x.dtype for x in xs}, {x.device for x in xs}
    if len(dtypes) != 1 or len(devices) != 1:
        raise ValueError(f"{who}: xs must share one dtype and device, got {sorted(map(str, dtypes))} on "
                         f"{sorted(map(str, devices))}")
    if not xs[0].is_floating_point() or xs[0].dtype in (E4M3, E5M2):
        raise ValueError(f"{who}: xs must be high-precision float tensors, got {xs[0].dtype}")
    if scales.dtype != torch.float32 or scales.shape != (len(xs),) or scales.device != xs[0].device:
        raise ValueError(f"{who}: scales must be fp32 [{len(xs)}] on {xs[0].device}, got {scales.dtype} "
                         f"{tuple(scales.shape)} on {scales.device}")
    if float8_dtype not in (E4M3, E5M2):
        raise ValueError(f"{who}: float8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {float8_dtype}")
    if backend not in _BACKENDS:
        raise ValueError(f"float8_cast: backend={backend!r}; allowed: {', '.join(map(repr, _BACKENDS))}")
    with torch.no_grad():
        if backend == "triton" or (backend == "auto" and xs[0].is_cuda):
            if not all(x.is_contiguous() for x in xs):
                raise ValueError(f"{who}: the Triton path needs contiguous tensors")
            return _triton().to_float8_tensorwise_many_triton(list(xs), scales.contiguous(), float8_dtype)
        return [to_float8(x, scales[i], float8_dtype) for i, x in enumerate(xs)]
