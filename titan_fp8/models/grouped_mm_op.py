"""torch._grouped_mm as an opaque custom op, for inductor's C++ wrapper on a torch whose C shim lacks it.

Inductor's C++ wrapper ([compile] cpp_wrapper) calls aten ops through torch's C shim. torch 2.11's shim has no
_grouped_mm (`aoti_torch_cuda__grouped_mm` arrives in 2.12), so the wrapper of a compiled block with bf16 experts
fails to build (benchmarks/results/issue10_s38/call4_cppw_option_h200x2/bf16_cppw_error.txt). A custom op reaches
the kernel through the dispatcher instead. moe.grouped_mm takes this route only while it is compiled with the C++
wrapper on such a torch; the kernel, and so every number, is torch._grouped_mm's.

Imports only torch.
"""
from __future__ import annotations

import torch
from torch import Tensor

# the C shim entry's first release (torchgen/aoti/fallback_ops.py: "aten._grouped_mm.default" since 2.12)
C_SHIM_HAS_GROUPED_MM = torch.__version__ >= "2.12"


@torch.library.custom_op("titan_fp8::grouped_mm", mutates_args=())
def opaque_grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """torch._grouped_mm(a, b, offs=offs): a [T, K] x b [E, K, N] -> [T, N] (groups of rows), or a [M, T] x
    b [T, N] -> [E, M, N] (groups along T). Differentiable in the first form."""
    return torch._grouped_mm(a, b, offs=offs).contiguous()


@opaque_grouped_mm.register_fake
def _(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    if b.dim() == 3:
        return a.new_empty(a.shape[0], b.shape[2])
    return a.new_empty(offs.shape[0], a.shape[0], b.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    a, b, offs = inputs
    if b.dim() != 3:
        raise NotImplementedError("titan_fp8::grouped_mm: only a [T, K] x b [E, K, N] is differentiable")
    ctx.save_for_backward(a, b, offs)


def _backward(ctx, grad: Tensor):
    a, b, offs = ctx.saved_tensors
    da = opaque_grouped_mm(grad, b.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
    db = opaque_grouped_mm(a.t(), grad, offs) if ctx.needs_input_grad[1] else None
    return da, db, None


opaque_grouped_mm.register_autograd(_backward, setup_context=_setup_context)


def needs_opaque_grouped_mm() -> bool:
    """True while torch.compile traces for inductor's C++ wrapper on a torch whose C shim lacks _grouped_mm."""
    if C_SHIM_HAS_GROUPED_MM or not torch.compiler.is_compiling():
        return False
    import torch._inductor.config as inductor_config  # (imported by now: dynamo is tracing)

    return bool(inductor_config.cpp_wrapper)
