"""CUDA C++ (CuTe) MXFP8 grouped GEMMs for sm_90a, built at first use: fprop / dgrad (cuda_mx/).

Same contract as gluon_mx.launch_nt: out[g] = A[g] @ B[e]^T with A [M, R] e4m3 (E8M0 scales sa [M, R/32]), B
[E, C, R] e4m3 whose scales sb [E, C, R/32] are constant over 128-row tiles (declared by the caller), offs int32
cumulative group ends; rows at or after offs[-1] come out as zeros. Two kernels, picked by `block`:
- block=32 ("mx32", true 1x32 scales on A; cuda_mx/mx32_grouped.cu): the Gluon kernels' bits (same promotion
  order). Measured 10-15% SLOWER than the Gluon kernel (H100, session 18: 0.79-0.86x bf16 against Gluon's
  0.87-0.95x in the same runs; benchmarks/results/issue10_cuda_mx32_s18/NOTE.md), so no backend switch routes to
  it; benchmarks/mxfp8_grouped_gemm_gluon.py --cuda times it.
- block=128 ("mx128", A's scales constant over 128 of R; cuda_mx/mx128_grouped.cu): the CUTLASS backend's 128x192
  kernels' arithmetic and bits in a mainloop of our own (2-CTA clusters sharing the weight tile, the scales
  copied with each stage, stages released as soon as their wgmmas finish). Measured at 0.80-0.85x of the CUTLASS
  kernels (H100, session 22: 1.25-1.41x bf16 against 1.54-1.68x; benchmarks/results/issue10_s22/NOTE.md), so no
  backend switch routes to it; benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cuda and
  benchmarks/cuda_mx128_probe.py time it.

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

SRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_mx")
SOURCES = ("mx32_grouped.cu", "mx128_grouped.cu", "bindings.cpp")
HEADERS = ("grouped_nt.h", "mx_common.cuh")
GROUP_M = 8  # m-tiles (mx128: pairs of m-tiles) per run of the persistent tile order (as the Gluon default)
_LOADED: dict = {}


VARIANT_NAMES = ("STAGES", "BLOCK_STAGES", "MX128_STAGES", "MX128_BLOCK_STAGES", "MX128_SPLIT_N")


def _defines(variant: str) -> list[str]:
    """Compile-time variant "NAME=V,..." -> nvcc -D flags. mx32: STAGES, BLOCK_STAGES (-> MX32_<NAME>); mx128:
    MX128_STAGES, MX128_BLOCK_STAGES, MX128_SPLIT_N (as written). E.g. "STAGES=4,BLOCK_STAGES=4"."""
    out = []
    for part in filter(None, variant.split(",")):
        name, _, val = part.partition("=")
        if name not in VARIANT_NAMES or not val.isdigit():
            raise ValueError(f"cuda mx variant {variant!r}: {part!r} is not NAME=<n> with NAME in {VARIANT_NAMES}")
        out.append(f"-D{name}={val}" if name.startswith("MX128_") else f"-DMX32_{name}={val}")
    return out


def _load(variant: str):
    tag = hashlib.sha256(variant.encode()).hexdigest()[:8] if variant else ""
    return build_extension("titan_fp8_cuda_mx", SRC_DIR, SOURCES, HEADERS, "CUDA mx grouped GEMMs",
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


def launch_nt(a, sa, b, sb, offs, out_dtype, group_m: int = GROUP_M, variant: str = "", block: int = 32):
    """out [M, C] = grouped A @ B^T (see the module docstring); B contiguous, sb any strided view. block: 32 (true
    1x32 scales on A) or 128 (A's scales constant over 128 of R, as quant.to_mxfp8_blocked(..., 128, 1) writes)."""
    if block not in (32, 128):
        raise ValueError(f"mxfp8 grouped GEMM (cuda): block={block}; 32 or 128")
    who = f"mxfp8 grouped GEMM (cuda mx{block})"
    out, done = nt_output(a, b, out_dtype)
    if done:
        return out
    reason = unsupported_reason(a, sa, b, sb, out_dtype)
    if reason:
        raise ValueError(f"{who}: {reason}")
    load(variant).nt(a, sa, b, sb, offs, out, group_m, _sm_count(a.device), block)
    return out
