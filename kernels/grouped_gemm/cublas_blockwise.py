"""cuBLAS's blockwise-scaled fp8 GEMM (DeepSeek's 1x128 x 128x128 and 1x128 x 1x128 recipes, sm_90) as one op:

    titan_fp8::blockwise_scaled_mm(a_q, a_s, b_q, b_s, b_is_tile, inverse=False) -> bf16 a @ b.T

a_q [M, K] e4m3 with 1x128 scales a_s [M, K/128] along K; b_q [N, K] with 128x128 tile scales (b_is_tile) or 1x128
scales along K. Scales are ours (data = x * scale) or, inverse=True, the factors cuBLAS multiplies by, normally in
its layouts already (mx128's quantizers write them so); blockwise_scaled_mm_args lays them out. The op is opaque to
torch.compile so inductor cannot re-stride the padded / outer-major scale tensors that torch checks exactly.

Its CUDA kernel (switch TITAN_FP8_BLOCKWISE_MM, picked once per process by load_backend()):
  "auto"    the C++ kernel, cublas_blockwise/blockwise_mm.cpp: the same layouts, then aten::_scaled_mm_v2. Host code
            only, built at first use with the C++ compiler and ninja torch uses (no nvcc), cached under
            $TITAN_FP8_CUTLASS_BUILD_DIR; where it cannot build, the Python kernel, logged once.
  "cpp"     the C++ kernel; raises BlockwiseBindingUnavailable (one line) when it cannot build.
  "python"  the Python kernel below (F.scaled_mm): ~40 us more host time a call. The CPU tests check it against
            torch's argument checks and the C++ layouts against it (blockwise_scaled_mm_layouts).
Why C++: the mx128 Linears call the op ~170 times a llama_moe step, and at the shipped batch the float8 steps are
host-paced (benchmarks/results/issue10_s34/NOTE.md). Until load_backend() has run, a call runs the Python kernel
and says so once ("cpp" raises): call load_backend() before torch.compile traces the op (titan_fp8's
Float8Linear.prepare_backend does; an eager call does it by itself).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil

import torch
import torch.nn.functional as F

BLOCK = 128
BLOCKWISE_MM_BACKENDS = ("auto", "cpp", "python")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cublas_blockwise", "blockwise_mm.cpp")
_log = logging.getLogger(__name__)


class BlockwiseBindingUnavailable(RuntimeError):
    """The C++ kernel of titan_fp8::blockwise_scaled_mm cannot be built or loaded here (one line: what is missing)."""


# ------------------------------------------------------------------------------------------ layouts (Python twin)
def scale_outer_major(s: torch.Tensor) -> torch.Tensor:
    """1x128 scale [rows, K/128] -> the same values with strides (1, rows): cuBLAS reads VEC128 scales
    outer-dim-major (each K-block's column of per-row scales contiguous)."""
    return s.t().contiguous().t()


def pad_tile_factors(s: torch.Tensor) -> torch.Tensor:
    """128x128 factors [N/128, K/128] -> the contiguous [N/128, L4] buffer, L4 = K/128 rounded up to a multiple
    of 4 (kernels.grouped_gemm.quant.blockwise_scale_buffers' tile layout; cuBLAS reads its transpose). The pad
    slots are K-blocks past the data, which no product uses; they hold 1.0 (as torchao pads, and as the mx128
    quantizers write them) so that even a read of them stays finite."""
    k_blocks = s.shape[1]
    return F.pad(s, (0, -(-k_blocks // 4) * 4 - k_blocks), value=1.0).contiguous()  # no pad: F.pad may alias s


def blockwise_scaled_mm_args(a_q, a_s, b_q, b_s, b_is_tile: bool, inverse: bool = False):
    """Positional arguments of F.scaled_mm(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b) computing
    a @ b.T on cuBLAS (see the module docstring for the operands). inverse=True passes factors already in
    cuBLAS's layouts through uncopied (a 128x128 b_s comes as the padded [N/128, round_up(K/128, 4)] buffer).
    Layouts torch (2.11 .. 2.13, aten ScaledBlas.cpp) requires of mat_a [M, K] row-major, mat_b [K, N]
    column-major:
      scale_a                [M, K/128]                strides (1, M)
      scale_b, 1x128         [N, K/128]                strides (1, N)   (the weight-gradient GEMM)
      scale_b, 128x128       [round_up(K/128, 4), N/128] strides (1, round_up(K/128, 4))
    tests/cpu/test_float8_blockwise_layout.py checks these against torch 2.11's checks and this torch's meta
    kernel at the model's shapes; tests/cpu/test_cublas_blockwise.py the C++ kernel's layouts against these."""
    from torch.nn.functional import ScalingType
    mat_a = a_q.contiguous()
    mat_b = b_q.contiguous().t()
    inv = (lambda s: s) if inverse else torch.reciprocal
    scale_a = scale_outer_major(inv(a_s))  # no copy when the strides are right already
    if b_is_tile:
        k_blocks = b_q.shape[1] // BLOCK
        if inverse and b_s.shape[1] == -(-k_blocks // 4) * 4:  # the padded buffer: cuBLAS reads its transpose
            scale_b = b_s.contiguous().t()
        else:
            scale_b = pad_tile_factors(inv(b_s)).t()
        recipe_b = ScalingType.BlockWise128x128
    else:
        scale_b, recipe_b = scale_outer_major(inv(b_s)), ScalingType.BlockWise1x128
    return mat_a, mat_b, scale_a, ScalingType.BlockWise1x128, scale_b, recipe_b


def cublas_blockwise_mm(a_q, a_s, b_q, b_s, b_is_tile: bool, inverse: bool = False) -> torch.Tensor:
    """The Python kernel: bf16 a @ b.T through F.scaled_mm (fp32 parameters get their gradient converted
    afterwards by the caller)."""
    return F.scaled_mm(*blockwise_scaled_mm_args(a_q, a_s, b_q, b_s, b_is_tile, inverse),
                       output_dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------------ the op
_LIB = torch.library.Library("titan_fp8", "FRAGMENT")
_LIB.define("blockwise_scaled_mm(Tensor a_q, Tensor a_s, Tensor b_q, Tensor b_s, bool b_is_tile, "
            "bool inverse=False) -> Tensor")


@torch.library.impl(_LIB, "blockwise_scaled_mm", "CPU")
def _cpu_kernel(a_q, a_s, b_q, b_s, b_is_tile, inverse=False):
    return cublas_blockwise_mm(a_q, a_s, b_q, b_s, b_is_tile, inverse)


@torch.library.register_fake("titan_fp8::blockwise_scaled_mm", lib=_LIB)
def _(a_q, a_s, b_q, b_s, b_is_tile, inverse=False):
    return a_q.new_empty(a_q.shape[0], b_q.shape[0], dtype=torch.bfloat16)


_STATE = {"backend": None, "cpp_loaded": False, "warned": False}


def _python_cuda_kernel(a_q, a_s, b_q, b_s, b_is_tile, inverse=False):
    if _STATE["backend"] is None:  # nobody called load_backend(): a compiled graph whose trace came first
        if blockwise_mm_backend() == "cpp":
            raise RuntimeError("TITAN_FP8_BLOCKWISE_MM=cpp, but titan_fp8::blockwise_scaled_mm ran before "
                               "kernels.grouped_gemm.cublas_blockwise.load_backend() loaded the C++ kernel; call it "
                               "before torch.compile traces the op (Float8Linear.prepare_backend does)")
        if not _STATE["warned"]:
            _STATE["warned"] = True
            _log.warning("titan_fp8::blockwise_scaled_mm: running its Python kernel (~40 us more host time a call): "
                         "load_backend() was not called before this first call; call it before torch.compile")
    return cublas_blockwise_mm(a_q, a_s, b_q, b_s, b_is_tile, inverse)


# The Python CUDA kernel in a Library of its own: load_cpp() drops it just before the C++ library registers its
# kernel, and registers it again (a new Library) when the build fails.
_PY_CUDA: list = [None]


def _register_python_cuda_kernel() -> None:
    lib = torch.library.Library("titan_fp8", "IMPL")
    lib.impl("blockwise_scaled_mm", _python_cuda_kernel, "CUDA")
    _PY_CUDA[0] = lib


def _drop_python_cuda_kernel() -> None:
    if _PY_CUDA[0] is not None:
        _PY_CUDA[0]._destroy()
        _PY_CUDA[0] = None


_register_python_cuda_kernel()


def blockwise_scaled_mm(a_q, a_s, b_q, b_s, b_is_tile: bool, inverse: bool = False) -> torch.Tensor:
    """titan_fp8::blockwise_scaled_mm (see the module docstring)."""
    return torch.ops.titan_fp8.blockwise_scaled_mm(a_q, a_s, b_q, b_s, b_is_tile, inverse)


# ------------------------------------------------------------------------------------------ the switch
def blockwise_mm_backend() -> str:
    """$TITAN_FP8_BLOCKWISE_MM ("auto" when unset); ValueError naming a bad value."""
    v = os.environ.get("TITAN_FP8_BLOCKWISE_MM", "auto")
    if v not in BLOCKWISE_MM_BACKENDS:
        raise ValueError(f"TITAN_FP8_BLOCKWISE_MM={v!r}; allowed: {', '.join(BLOCKWISE_MM_BACKENDS)}")
    return v


def _compiler() -> str:
    cxx = os.environ.get("CXX") or "c++"  # what torch.utils.cpp_extension runs
    found = shutil.which(cxx)
    if not found:
        origin = "CXX" if os.environ.get("CXX") else "torch's default"
        raise BlockwiseBindingUnavailable(f"C++ compiler not found: {cxx!r} ({origin}) is not an executable; "
                                          f"install one (e.g. `apt install g++`) or point CXX at it")
    return found


def load_cpp(src: str = SRC) -> str:
    """Build (or take from the cache) and load the C++ kernels: the op's CUDA kernel and the CPU-testable
    titan_fp8::blockwise_scaled_mm_layouts / _recipes. Returns the library's path; BlockwiseBindingUnavailable
    (one line) when the source, the compiler or ninja is missing or the build fails. Loaded once per process."""
    if _STATE["cpp_loaded"]:
        return _STATE["cpp_loaded"]
    if not os.path.isfile(src):
        raise BlockwiseBindingUnavailable(f"C++ source not found: {src}")
    _compiler()
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available():
        raise BlockwiseBindingUnavailable("ninja not found: torch builds C++ extensions with it; `pip install ninja`")
    with open(src, "rb") as f:
        digest = hashlib.sha256(f.read() + torch.__version__.encode()).hexdigest()[:12]
    root = os.environ.get("TITAN_FP8_CUTLASS_BUILD_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                         "titan_fp8")
    build_dir = os.path.join(root, f"blockwise_mm_{digest}")
    os.makedirs(build_dir, exist_ok=True)
    had_python = _PY_CUDA[0] is not None
    _drop_python_cuda_kernel()  # before the library registers its kernel (no "overriding a kernel" warning)
    try:
        cpp_extension.load(name="titan_fp8_blockwise_mm", sources=[src], extra_cflags=["-O2", "-std=c++17"],
                           build_directory=build_dir, is_python_module=False,
                           verbose=os.environ.get("TITAN_FP8_CUTLASS_VERBOSE") == "1")
    except Exception as e:  # torch raises RuntimeError / OSError / ImportError / CalledProcessError here
        if had_python:
            _register_python_cuda_kernel()  # back as it was
        msg = str(e).strip().splitlines()
        raise BlockwiseBindingUnavailable(f"building the C++ blockwise_scaled_mm kernel failed "
                                          f"({type(e).__name__}): {msg[-1] if msg else ''} (build dir {build_dir}; "
                                          f"TITAN_FP8_CUTLASS_VERBOSE=1 shows the compiler's output)") from e
    want = [int(F.ScalingType.BlockWise1x128.value), int(F.ScalingType.BlockWise128x128.value)]
    got = list(torch.ops.titan_fp8.blockwise_scaled_mm_recipes())
    if got != want:  # the C++ enum and torch's Python one disagree: this torch differs from the headers
        raise BlockwiseBindingUnavailable(f"the C++ kernel's ScalingType values {got} differ from "
                                          f"torch.nn.functional.ScalingType's {want}")
    _STATE["cpp_loaded"] = os.path.join(build_dir, "titan_fp8_blockwise_mm.so")
    return _STATE["cpp_loaded"]


def load_backend() -> str:
    """Pick the op's CUDA kernel once per process ("cpp" or "python", by TITAN_FP8_BLOCKWISE_MM) and return it.
    Call it before torch.compile traces the op. "auto" logs what it picked; "cpp" raises BlockwiseBindingUnavailable
    when the C++ kernel cannot be built; a later call asking for another backend than the one picked raises."""
    want = blockwise_mm_backend()
    picked = _STATE["backend"]
    if picked is not None:
        if want not in ("auto", picked):
            raise RuntimeError(f"TITAN_FP8_BLOCKWISE_MM={want}, but this process already runs the {picked} kernel "
                               f"of titan_fp8::blockwise_scaled_mm; set the variable before its first use")
        return picked
    if want == "python":
        if _STATE["cpp_loaded"]:
            raise RuntimeError("TITAN_FP8_BLOCKWISE_MM=python, but this process has loaded the C++ kernel of "
                               "titan_fp8::blockwise_scaled_mm already (load_cpp)")
        picked = "python"
    else:
        try:
            load_cpp()
            picked = "cpp"
        except BlockwiseBindingUnavailable as e:
            if want == "cpp":
                raise
            _log.warning("titan_fp8::blockwise_scaled_mm: auto picked the Python kernel (%s)", e)
            picked = "python"
    if picked == "cpp":
        _log.info("titan_fp8::blockwise_scaled_mm: %s picked the C++ kernel (%s)", want, _STATE["cpp_loaded"])
    _STATE["backend"] = picked
    return picked
