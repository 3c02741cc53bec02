"""CUDA C++ (CuTe) true-1x32 ("mx32") grouped GEMM for sm_90a, built at first use: fprop / dgrad (cuda_mx32/).

Same contract as gluon_mx.launch_nt: out[g] = A[g] @ B[e]^T with A [M, R] e4m3 (1x32 E8M0 scales sa [M, R/32]), B
[E, C, R] e4m3 whose scales sb [E, C, R/32] are constant over 128-row tiles (declared by the caller), offs int32
cumulative group ends; rows at or after offs[-1] come out as zeros. Results equal the Gluon kernels' bit for bit
(same promotion order). Why a CUDA kernel beside the Gluon one, and how it is built: cuda_mx32/mx32_grouped.cu.

Status: measured 10-15% SLOWER than the Gluon kernel (H100, session 18: 0.79-0.86x bf16 against Gluon's
0.87-0.95x in the same runs; benchmarks/results/issue10_cuda_mx32_s18/NOTE.md), so no backend switch routes to it;
benchmarks/mxfp8_grouped_gemm_gluon.py --cuda times it. Kept as the CuTe base for the next attempt (NOTES.md).

Limits (one-line ValueError naming the operand): R % 128 == 0, C % 8 == 0, A rows and B contiguous along R and
16-byte aligned (TMA), sa with contiguous steps and 4-byte aligned rows, 32-bit indexing.
Build: the CUTLASS/CuTe headers and nvcc as for the CUTLASS backend (cutlass_backend.build_extension;
CutlassUnavailable names what is missing), cached under $TITAN_FP8_CUTLASS_BUILD_DIR.
"""
from __future__ import annotations

import functools
import hashlib
import os

import torch

from .cutlass_backend import build_extension, cached_build
from .nt_output import nt_output

SRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_mx32")
SOURCES = ("mx32_grouped.cu", "mx32_bindings.cpp")
HEADERS = ("mx32_grouped.h",)
GROUP_M = 8  # m-tiles per run of the persistent tile order (as the Gluon default)
_LOADED: dict = {}


def _defines(variant: str) -> list[str]:
    """Compile-time variant "NAME=V,..." (MX32_<NAME>, e.g. "STAGES=4,BLOCK_STAGES=4") -> nvcc -D flags."""
    out = []
    for part in filter(None, variant.split(",")):
        name, _, val = part.partition("=")
        if name not in ("STAGES", "BLOCK_STAGES") or not val.isdigit():
            raise ValueError(f"cuda mx32 variant {variant!r}: {part!r} is not STAGES=<n> or BLOCK_STAGES=<n>")
        out.append(f"-DMX32_{name}={val}")
    return out


def _load(variant: str):
    tag = hashlib.sha256(variant.encode()).hexdigest()[:8] if variant else ""
    return build_extension("titan_fp8_cuda_mx32", SRC_DIR, SOURCES, HEADERS, "CUDA mx32 grouped GEMM",
                           defines=_defines(variant), tag=tag)


def load(variant: str = ""):
    """The compiled extension (built on first call, cached; a failure is cached too). variant: compile-time
    settings for measurements ("STAGES=4,BLOCK_STAGES=4"; default: the file's)."""
    return cached_build(_LOADED, (variant,), lambda: _load(variant))


@functools.lru_cache(maxsize=16)
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def unsupported_reason(a, sa, b, sb, out_dtype) -> str | None:
    """Why these operands do not fit the kernel (a short phrase naming the operand), or None."""
    M, R = a.shape
    E, C, _ = b.shape
    if R % 128:
        return f"reduction length {R} is not a multiple of 128"
    if C % 8:
        return f"output columns {C} not a multiple of 8"
    for name, t in (("A", a), ("B", b)):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 16 for s in t.stride()[:-1]):
            return f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) is not TMA-compatible"
    if sa.stride(-1) != 1 or sa.stride(0) % 4 or sa.data_ptr() % 4:
        return f"A's scales (strides {sa.stride()}) need contiguous steps and 4-byte aligned rows"
    if out_dtype not in (torch.bfloat16, torch.float32):
        return f"out_dtype={out_dtype}; bf16 or fp32 only"
    if max(M * R, E * C * R, M * C) >= 2 ** 31:
        return "operands beyond 2^31 elements need 64-bit indexing"
    return None


def launch_nt(a, sa, b, sb, offs, out_dtype, group_m: int = GROUP_M, variant: str = ""):
    """out [M, C] = grouped A @ B^T (see the module docstring); B contiguous, sb any strided view."""
    who = "mxfp8 grouped GEMM (cuda mx32)"
    out, done = nt_output(a, b, out_dtype)
    if done:
        return out
    reason = unsupported_reason(a, sa, b, sb, out_dtype)
    if reason:
        raise ValueError(f"{who}: {reason}")
    load(variant).nt(a, sa, b, sb, offs, out, group_m, _sm_count(a.device))
    return out
