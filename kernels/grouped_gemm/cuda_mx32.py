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
Build: the CUTLASS/CuTe headers and nvcc as for the CUTLASS backend (cutlass_backend.cutlass_include_dir /
nvcc_path; CutlassUnavailable names what is missing), cached under $TITAN_FP8_CUTLASS_BUILD_DIR.
"""
from __future__ import annotations

import hashlib
import os

import torch

from .cutlass_backend import CutlassUnavailable, cutlass_include_dir, nvcc_path

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


def _build_dir(include: str, variant: str) -> str:
    h = hashlib.sha256((include + "|" + variant).encode())
    for name in SOURCES + HEADERS:
        with open(os.path.join(SRC_DIR, name), "rb") as f:
            h.update(f.read())
    root = os.environ.get("TITAN_FP8_CUTLASS_BUILD_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                         "titan_fp8")
    path = os.path.join(root, f"cuda_mx32_{h.hexdigest()[:12]}")
    os.makedirs(path, exist_ok=True)
    return path


def _load(variant: str):
    include = cutlass_include_dir()
    nvcc = nvcc_path()
    if not torch.cuda.is_available():
        raise CutlassUnavailable("the CUDA mx32 grouped GEMM needs a CUDA device (sm_90); none is available")
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None:
        cpp_extension.CUDA_HOME = os.path.dirname(os.path.dirname(nvcc))
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
             "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-U__CUDA_NO_HALF2_OPERATORS__", "-DNDEBUG"] + _defines(variant)
    tag = hashlib.sha256(variant.encode()).hexdigest()[:8] if variant else ""
    try:
        return cpp_extension.load(
            name="titan_fp8_cuda_mx32" + (f"_{tag}" if tag else ""),
            sources=[os.path.join(SRC_DIR, s) for s in SOURCES],
            extra_include_paths=[SRC_DIR, include], extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=flags,
            build_directory=_build_dir(include, variant), verbose=os.environ.get("TITAN_FP8_CUTLASS_VERBOSE") == "1")
    except (RuntimeError, OSError, ImportError) as e:
        raise CutlassUnavailable(f"building the CUDA mx32 grouped GEMM failed ({type(e).__name__}): {e}") from e


def load(variant: str = ""):
    """The compiled extension (built on first call, cached; a failure is cached too). variant: compile-time
    settings for measurements ("STAGES=4,BLOCK_STAGES=4"; default: the file's)."""
    key = (os.environ.get("CUTLASS_INCLUDE_DIR"), os.environ.get("CUDA_HOME"), variant)
    if key not in _LOADED:
        try:
            _LOADED[key] = _load(variant)
        except CutlassUnavailable as e:
            _LOADED[key] = e
    got = _LOADED[key]
    if isinstance(got, CutlassUnavailable):
        raise got
    return got


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
    M, R = a.shape
    E, C, _ = b.shape
    out = torch.empty(M, C, dtype=out_dtype, device=a.device)
    if M == 0 or C == 0:
        return out
    if R == 0:
        return out.zero_()
    reason = unsupported_reason(a, sa, b, sb, out_dtype)
    if reason:
        raise ValueError(f"{who}: {reason}")
    load(variant).nt(a, sa, b, sb, offs, out, group_m)
    return out
