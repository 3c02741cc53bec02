"""CUTLASS backend of the "mx128" MXFP8 grouped GEMMs (sm_90a), built at first use.

The kernels (cutlass_sm90/) are CUTLASS 4.2's sm_90 blockwise-scaled ptr-array grouped GEMM, instantiated per
output dtype (bf16: fprop, dgrad, wgrad; fp32: wgrad) and kernel (schedule and cluster shape, see SCHEDULES),
with the tile scheduler's raster order and swizzle chosen per call: A with one scale
per 1x128 along the reduction axis, B with one scale per 128x128 tile, promotion into fp32 every 128 of the
reduction. Our operands are the usual MXFP8 pairs (E8M0 bytes per 1x32 block) declared block=128 and
w_tile / a_tile = 128; one small CUDA kernel per call turns offs and the E8M0 bytes into CUTLASS's per-group
problem shapes, pointers and fp32 scale arrays on the device, so a call never syncs with the host.

The GEMMs are torch ops (titan_fp8::mx128_grouped_mm_{rows,rows_into,wgrad}_cutlass, and
titan_fp8::mx128_dgrad_in_parts_cutlass: dgrad from the bf16 weight, its float8 W^T quantized by the extension part
by part) whose CUDA kernels are C++ (cutlass_sm90/bindings.cpp): a compiled graph calls them with no Python.

Contracts are those of kernels.grouped_gemm (same operands, same results up to fp32 summation order), with
these limits, checked by `unsupported_reason` (auto falls back to Triton on them; a named "cutlass" raises):
  reduction length (K for fprop, N for dgrad) a multiple of 128; output columns a multiple of 8 (TMA);
  wgrad: every group starts on a multiple of 128 tokens (asserted on the device, no host sync; the MoE pads
  groups to token_group_align = 128 under mx128), tokens % 32 == 0 as for every wgrad.

Build: torch.utils.cpp_extension.load with nvcc (CUDA_HOME or nvcc on PATH) and the CUTLASS headers from
$CUTLASS_INCLUDE_DIR or the installed `cutlass_library` package (`pip install nvidia-cutlass==4.2.0.0`); cached
in $TITAN_FP8_CUTLASS_BUILD_DIR (default ~/.cache/titan_fp8/) keyed by a hash of the sources and headers' path.
A missing compiler or header raises CutlassUnavailable with one line naming what is missing and how to get it.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil

import torch

SRC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cutlass_sm90")
_KERNEL_ID = {"cooperative": 0, "pingpong": 1, "cooperative_2x1": 2, "cooperative_1x1": 3, "cooperative_lpt": 4,
              "cooperative_n256_2x1": 5, "cooperative_lpt_n256_2x1": 6}
_KERNEL_TU = {"cooperative": "coop", "pingpong": "pp", "cooperative_2x1": "coop2x1", "cooperative_1x1": "coop1x1",
              "cooperative_lpt": "cooplpt", "cooperative_n256_2x1": "coopn256x2",
              "cooperative_lpt_n256_2x1": "cooplptn256x2"}
_WIDE_IDS = (5, 6)  # kernels whose output tiles are WIDE_N columns wide (the raster rule counts their tiles)
WIDE_N = 256
SOURCES = ("bindings.cpp", "wt_tile_quant.cu") + tuple(f"blockwise_grouped_{dt}_{tu}.cu" for tu in _KERNEL_TU.values()
                                    for dt in ("bf16", "f32"))
HEADERS = ("blockwise_grouped.cuh", "grouped_problem.h", "lpt_group_scheduler.h", "wt_tile_quant.h")
INSTALL_HINT = "pip install nvidia-cutlass==4.2.0.0"
GRAN = 128  # the one granularity these kernels serve (1x128 activations, 128x128 tiles)
# CUTLASS kernel configuration per pass: "<kernel>[:along_m|:along_n][:swizzle=S]".
#   kernel (cutlass_sm90/grouped_problem.h): "cooperative" = 128x128x128 tiles, both consumer warpgroups on one
#     tile, cluster 1x2; "pingpong" = 64x128x128 tiles, warpgroups alternate so epilogues overlap mainloops;
#     "cooperative_2x1" / "cooperative_1x1" = cooperative with a 2x1 cluster (weight tiles multicast) / none;
#     "cooperative_lpt" = cooperative, cluster 1x2, with a dynamic tile scheduler (cutlass_sm90/
#     lpt_group_scheduler.h): wgrad groups longest token count first, every tile after the first wave taken from
#     a global ticket counter by the first cluster free, so one long expert no longer leaves a static share of
#     long tiles on a few CTAs; "cooperative_n256_2x1" = cooperative with 128x256x128 tiles (each k-block's
#     partial formed one 128-column half at a time, so the registers are those of a 128x192 tile) and a 2x1
#     cluster (weight tiles multicast to two row tiles), same bits as the 128x128 kernels;
#     "cooperative_lpt_n256_2x1" = those tiles and cluster with the dynamic scheduler of "cooperative_lpt"; both
#     128x256 kernels store their output one consumer warpgroup at a time (64-row sub-tiles, no barrier across
#     the warpgroups; grouped_problem.h);
#   along_m / along_n: the order in which the persistent scheduler walks a group's output tiles. Left out: along
#     the dimension with FEWER tiles per group (along N when a group's output has more 128-row tiles than
#     128-column tiles), so each wave of CTAs re-reads the smaller operand (the one the long side walks)
#     from L2 rather than the larger one from HBM. In the H100 sweep (benchmarks/results/
#     mxfp8_grouped_gemm_backends-h100-2026-11-23.md, session 8) this order was the faster of the two in 17 of
#     18 (shape, routing, pass) cells, by 3-9% where it differs from along M (the 18th: -4%, at 64 x 56
#     tiles); CUTLASS's grouped scheduler itself always walks along M;
#   swizzle=S (1, 2, 4, 8): tiles visited in runs of S.
# The configuration is read at call time (inside the ops, C++ and Python alike), so $TITAN_FP8_CUTLASS_SCHEDULE
# also reaches graphs torch.compile already traced; it overrides SCHEDULES (see schedule_id). The C++ ops resolve
# each new value of the variable once (schedules_for_env): change SCHEDULES before the first call, not after.
# Every pass: cooperative_lpt_n256_2x1. History (H100): 128x192 tiles with a 2x1 cluster were 1.05-1.07x the
# 128x128 cooperative kernel in all six fprop/dgrad cells at identical bits (benchmarks/results/issue10_n192_s19/);
# with the dynamic scheduler, as a wgrad tile costs its group's token count, 1.005-1.050x cooperative_lpt in all
# six wgrad cells and up to 1.045x the static order under skewed routing, +0.2-1.4% for fprop/dgrad
# (issue10_lpt_n192_s20; bit for bit, the dgrad-in-parts op included: benchmarks/results/issue9_s21/); 128x256
# tiles on those: 1.00-1.06x in 18 of 18 (shape, routing, pass) cells, same bits (issue10_s33/).
SCHEDULES = {"fprop": "cooperative_lpt_n256_2x1", "dgrad": "cooperative_lpt_n256_2x1",
             "wgrad": "cooperative_lpt_n256_2x1"}
_ALONG_N_BIT = 1 << 4


@functools.lru_cache(maxsize=256)
def _parse_config(config: str, origin: str) -> tuple[int, str]:
    """(kernel and swizzle bits, raster "auto" / "m" / "n") of a configuration string; ValueError naming the part."""
    kernel, *opts = config.split(":")
    if kernel not in _KERNEL_ID:
        raise ValueError(f"{origin} {config!r}: kernel {kernel!r} unknown; allowed: {', '.join(_KERNEL_ID)}")
    bits, raster = _KERNEL_ID[kernel], "auto"
    for opt in opts:
        if opt in ("along_m", "along_n"):
            raster = opt[-1]
        elif opt.startswith("swizzle=") and opt[8:] in ("1", "2", "4", "8"):
            bits |= (int(opt[8:]).bit_length() - 1) << 8
        else:
            raise ValueError(f"{origin} {config!r}: option {opt!r} unknown; allowed: along_m, along_n, "
                             f"swizzle=1|2|4|8")
    return bits, raster


def config_id(config: str, origin: str = "CUTLASS config", m_tiles: float = 0.0, n_tiles: float = 0.0) -> int:
    """The int the extension takes (bindings.cpp launch(): bits 0-3 kernel, bit 4 along N, bits 8-11 log2 swizzle)
    for a configuration string and a call whose groups have about m_tiles x n_tiles output tiles."""
    bits, raster = _parse_config(config, origin)
    if bits & 15 in _WIDE_IDS:  # callers count 128-column tiles (as bindings.cpp call_config does)
        n_tiles *= 128.0 / WIDE_N
    if raster == "n" or (raster == "auto" and m_tiles > n_tiles):
        bits |= _ALONG_N_BIT
    return bits


def schedule_config(pass_: str, env: str | None = None) -> tuple[str, str]:
    """(configuration string, where it came from) of `pass_`: SCHEDULES, or $TITAN_FP8_CUTLASS_SCHEDULE (or `env`,
    its value), either one configuration for every pass or per pass as "fprop=<config>;dgrad=<config>;
    wgrad=<config>" (passes left out keep SCHEDULES)."""
    env = os.environ.get("TITAN_FP8_CUTLASS_SCHEDULE") if env is None else env
    if not env:
        return SCHEDULES[pass_], f"SCHEDULES[{pass_!r}]"
    if "=" not in env.split(":")[0]:
        return env, "TITAN_FP8_CUTLASS_SCHEDULE"
    per_pass = {}
    for part in filter(None, env.split(";")):
        name, _, cfg = part.partition("=")
        if name not in SCHEDULES:
            raise ValueError(f"TITAN_FP8_CUTLASS_SCHEDULE {env!r}: pass {name!r} unknown; allowed: "
                             f"{', '.join(SCHEDULES)}")
        per_pass[name] = cfg
    if pass_ not in per_pass:
        return SCHEDULES[pass_], f"SCHEDULES[{pass_!r}]"
    return per_pass[pass_], f"TITAN_FP8_CUTLASS_SCHEDULE ({pass_})"


def schedule_id(pass_: str, m_tiles: float = 0.0, n_tiles: float = 0.0) -> int:
    """The extension's int for `pass_` (schedule_config) on a call with about m_tiles x n_tiles tiles per group."""
    return config_id(*schedule_config(pass_), m_tiles, n_tiles)


_RASTER_CODE = {"auto": 0, "m": 1, "n": 2}


def schedules_for_env(env: str) -> tuple:
    """What the extension's ops launch with for a value of $TITAN_FP8_CUTLASS_SCHEDULE ("" = unset): per pass
    (fprop, dgrad, wgrad), (kernel and swizzle bits, raster 0 auto / 1 along M / 2 along N); the ops add the along-N
    bit for "auto" from each call's shapes (config_id's rule). A bad value raises ValueError naming it, from the
    op's call. Registered with the extension by load(), which calls it whenever the variable's value changes."""
    out = []
    for pass_ in ("fprop", "dgrad", "wgrad"):  # the extension's pass indices 0, 1, 2
        bits, raster = _parse_config(*schedule_config(pass_, env))
        out.append((bits, _RASTER_CODE[raster]))
    return tuple(out)


class CutlassUnavailable(RuntimeError):
    """The CUTLASS backend cannot run here (toolchain, headers, device or a failed build)."""


def cutlass_include_dir() -> str:
    """Directory holding cutlass/ and cute/ headers, or CutlassUnavailable naming what is missing."""
    env = os.environ.get("CUTLASS_INCLUDE_DIR")
    if env:
        path, origin = env, f"CUTLASS_INCLUDE_DIR={env}"
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or spec.origin is None:
            raise CutlassUnavailable("CUTLASS headers not found: no CUTLASS_INCLUDE_DIR and no `cutlass_library` "
                                     f"package; install them with `{INSTALL_HINT}`")
        path = os.path.join(os.path.dirname(spec.origin), "source", "include")
        origin = f"the cutlass_library package ({path})"
    if not os.path.isfile(os.path.join(path, "cutlass", "cutlass.h")) or \
            not os.path.isfile(os.path.join(path, "cute", "tensor.hpp")):
        raise CutlassUnavailable(f"CUTLASS headers not found: {origin} has no cutlass/cutlass.h or cute/tensor.hpp; "
                                 f"install them with `{INSTALL_HINT}` or point CUTLASS_INCLUDE_DIR at its include/")
    return path


def nvcc_path() -> str:
    """nvcc from CUDA_HOME (env, else torch's guess), or CutlassUnavailable."""
    from torch.utils import cpp_extension
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or cpp_extension.CUDA_HOME
    if home:
        nvcc = os.path.join(home, "bin", "nvcc")
        if os.path.isfile(nvcc):
            return nvcc
        raise CutlassUnavailable(f"nvcc not found: {nvcc} does not exist (CUDA_HOME={home}); install the CUDA "
                                 f"toolkit (nvcc >= 12.3 for sm_90a) or set CUDA_HOME")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CutlassUnavailable("nvcc not found: no CUDA_HOME and no nvcc on PATH; install the CUDA toolkit "
                                 "(nvcc >= 12.3 for sm_90a) or set CUDA_HOME")
    return nvcc


def build_extension(name: str, src_dir: str, sources, headers, what: str, defines=(), tag: str = "",
                    cutlass: bool = True):
    """Build (or load from the cache) a torch C++/CUDA extension for sm_90a with the CUTLASS/CuTe headers (unless
    cutlass=False: plain CUDA such as quant_cuda.py's): the CUTLASS backend here and cuda_mx.py. Cached in $TITAN_FP8_CUTLASS_BUILD_DIR (default ~/.cache/titan_fp8/),
    keyed by a hash of the sources, headers, include path and defines. CutlassUnavailable (one line) when the
    headers, nvcc or a device are missing, or the build fails; `what` names the extension in those messages."""
    include = cutlass_include_dir() if cutlass else ""
    nvcc = nvcc_path()
    if not torch.cuda.is_available():
        raise CutlassUnavailable(f"{what} needs a CUDA device (sm_90); none is available")
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None:  # torch reads CUDA_HOME once at import; tell it what we found
        cpp_extension.CUDA_HOME = os.path.dirname(os.path.dirname(nvcc))
    h = hashlib.sha256((include + "|" + " ".join(defines)).encode())
    for fname in tuple(sources) + tuple(headers):
        with open(os.path.join(src_dir, fname), "rb") as f:
            h.update(f.read())
    root = os.environ.get("TITAN_FP8_CUTLASS_BUILD_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                         "titan_fp8")
    build_dir = os.path.join(root, f"{name}_{h.hexdigest()[:12]}")
    os.makedirs(build_dir, exist_ok=True)
    cuda_flags = [
        "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
        # torch adds -D__CUDA_NO_*; CUTLASS's numeric types want the CUDA half/bf16 operators back
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__", "-DNDEBUG", *defines,
    ]
    try:
        return cpp_extension.load(
            name=name + (f"_{tag}" if tag else ""),
            sources=[os.path.join(src_dir, s_) for s_ in sources],
            extra_include_paths=[src_dir] + ([include] if include else []),
            extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=cuda_flags,
            build_directory=build_dir,
            verbose=os.environ.get("TITAN_FP8_CUTLASS_VERBOSE") == "1",
        )
    except (RuntimeError, OSError, ImportError) as e:
        raise CutlassUnavailable(f"building the {what} failed ({type(e).__name__}): {e}") from e


def _load():
    ext = build_extension("titan_fp8_cutlass_mx128", SRC_DIR, SOURCES, HEADERS, "CUTLASS mx128 grouped GEMM")
    ext.set_schedule_resolver(schedules_for_env)
    return ext


_LOADED: dict = {}


def load():
    """The compiled extension (built on first call, cached); CutlassUnavailable if it cannot be (the failure is
    cached too, so "auto" does not retry a failed build on every call)."""
    return cached_build(_LOADED, (), _load)


def load_variant(tag: str, defines) -> object:
    """The extension built from the same sources with extra `defines` (e.g. ("-DTITAN_MX_RELEASE_LATE",)) under the
    module name suffix `tag`, for timing kernel revisions side by side in one process (benchmarks). It registers
    no op kernels (-DTITAN_MX_NO_OPS: the default build's are the ops); call its grouped_rows / grouped_red.
    ValueError for a tag that cannot name a module or a define that is not -DNAME[=VALUE]."""
    if not isinstance(tag, str) or not tag.isidentifier():
        raise ValueError(f"load_variant: tag must be an identifier (it names the module), got {tag!r}")
    if isinstance(defines, str):
        raise ValueError(f"load_variant: defines must be a sequence of -DNAME[=VALUE] strings, got the string "
                         f"{defines!r}")
    bad = [d for d in defines if not (isinstance(d, str) and d.startswith("-D") and d[2:3].isidentifier())]
    if bad:
        raise ValueError(f"load_variant: defines must be -DNAME[=VALUE], got {bad!r}")
    defines = ("-DTITAN_MX_NO_OPS", *defines)
    return cached_build(_LOADED, (tag, defines), lambda: build_extension(
        "titan_fp8_cutlass_mx128", SRC_DIR, SOURCES, HEADERS, f"CUTLASS mx128 grouped GEMM ({tag})", defines, tag))


def cached_build(cache: dict, key: tuple, build):
    """build() once per key and toolchain environment (CUTLASS_INCLUDE_DIR, CUDA_HOME); a CutlassUnavailable is
    cached and raised again, so "auto" callers do not retry a failed build on every call."""
    key = (os.environ.get("CUTLASS_INCLUDE_DIR"), os.environ.get("CUDA_HOME")) + tuple(key)
    if key not in cache:
        try:
            cache[key] = build()
        except CutlassUnavailable as e:
            cache[key] = e
    got = cache[key]
    if isinstance(got, CutlassUnavailable):
        raise got
    return got


def device_reason(t: torch.Tensor) -> str | None:
    """Why the CUTLASS kernels cannot run on t's device, or None."""
    if not t.is_cuda:
        return f"tensors are on {t.device}, the CUTLASS kernels need a CUDA device"
    cap = torch.cuda.get_device_capability(t.device)
    if cap != (9, 0):
        return f"device capability {cap}; the CUTLASS blockwise kernels are built for sm_90a (Hopper) only"
    return None


def unsupported_reason(pass_: str, block: int, tile: int, reduction: int, out_cols: int, out_dtype) -> str | None:
    """Why these operands do not fit the CUTLASS mx128 kernels (a short phrase), or None."""
    if block != GRAN or tile != GRAN:
        tname = "a_tile" if pass_ == "wgrad" else "w_tile"
        return f"block={block}, {tname}={tile}; the CUTLASS kernels serve block=128 with {tname}=128 only"
    if pass_ != "wgrad" and reduction % GRAN:
        return f"reduction length {reduction} is not a multiple of 128"
    if out_cols % 8:
        return f"output columns {out_cols} not a multiple of 8 (TMA rows need 16-byte alignment)"
    want = (torch.float32, torch.bfloat16) if pass_ == "wgrad" else (torch.bfloat16,)
    if out_dtype not in want:
        return f"out_dtype={out_dtype}; the CUTLASS {pass_} is built for {' / '.join(map(str, want))} only"
    return None


def check_sm_carveout(t: torch.Tensor) -> None:
    """torch's SM carve-out must leave the persistent grid at least one 2-CTA cluster (the launch rounds the rest
    down to whole clusters); else a ValueError naming it, before any launch. Not while torch.compile traces (a
    graph break there): compiled graphs meet the ops' own C++ check."""
    if torch.compiler.is_compiling():
        return
    carve = torch._C._get_sm_carveout_experimental()
    if carve is not None:
        sms = torch.cuda.get_device_properties(t.device).multi_processor_count
        if sms - carve < 2:
            raise ValueError(f"CUTLASS mx128 grouped GEMM: the SM carve-out ({carve}, torch._C."
                             f"_set_sm_carveout_experimental / [comm] matmul_sm_carveout) leaves fewer than 2 of this "
                             f"GPU's {sms} SMs")


# ------------------------------------------------------------------------------------------ the ops
# titan_fp8::mx128_grouped_mm_{rows,rows_into,wgrad}_cutlass. Their CUDA kernels are C++ (cutlass_sm90/bindings.cpp,
# registered when load() loads the extension): a compiled graph calls them through the dispatcher with no Python per
# call; they resolve the configuration per call like the Python below (schedules_for_env). The CPU kernels are that
# Python (no GEMM runs on a CPU: load() raises CutlassUnavailable there; tests substitute the extension), and the
# fake ones give torch.compile the shapes.
_LIB = torch.library.Library("titan_fp8", "FRAGMENT")
_LIB.define("mx128_grouped_mm_rows_cutlass(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor offs, str pass_) "
            "-> Tensor")
_LIB.define("mx128_grouped_mm_rows_into_cutlass(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor offs, "
            "Tensor(a!) out, int first_group, str pass_) -> ()")
_LIB.define("mx128_grouped_mm_wgrad_cutlass(Tensor x, Tensor sx, Tensor y, Tensor sy, Tensor offs, "
            "ScalarType out_dtype, str pass_) -> Tensor")
_LIB.define("mx128_dgrad_in_parts_cutlass(Tensor dq, Tensor ds, Tensor w, Tensor offs, int parts) -> Tensor")


def _launch_rows(a, sa, b, sb, offs, out, first_group, pass_):
    """The rows GEMM of the experts first_group .. first_group + b.shape[0] - 1 of offs into out (see the ops)."""
    if out.numel() == 0:
        return
    if a.shape[1] == 0 or offs.numel() == 0:
        out.zero_()
        return
    config = schedule_id(pass_, a.shape[0] / max(offs.shape[0], 1) / GRAN, b.shape[1] / GRAN)
    check_sm_carveout(a)
    load().grouped_rows(a.view(torch.uint8), sa, b.view(torch.uint8), sb, offs, out, config, first_group)


@torch.library.impl(_LIB, "mx128_grouped_mm_rows_cutlass", "CPU")
def _rows_cpu(a, sa, b, sb, offs, pass_):
    """out[g] = A[g] @ B[e]^T; a [M, R], sa [M, R/32] (any strides), b [E, C, R] (R contiguous), sb [E, C, R/32].
    pass_ ("fprop" / "dgrad") names the configuration (schedule_config), read at call time."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    _launch_rows(a, sa, b, sb, offs, out, 0, pass_)
    return out


@torch.library.register_fake("titan_fp8::mx128_grouped_mm_rows_cutlass", lib=_LIB)
def _(a, sa, b, sb, offs, pass_):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16)


@torch.library.impl(_LIB, "mx128_grouped_mm_rows_into_cutlass", "CPU")
def _rows_into_cpu(a, sa, b, sb, offs, out, first_group, pass_):
    """The rows op for the experts first_group .. first_group + b.shape[0] - 1 of offs, written into out's rows of
    those groups (and out's zero rows past offs[-1] when they include the last expert); other rows untouched."""
    _launch_rows(a, sa, b, sb, offs, out, first_group, pass_)


@torch.library.register_fake("titan_fp8::mx128_grouped_mm_rows_into_cutlass", lib=_LIB)
def _(a, sa, b, sb, offs, out, first_group, pass_):
    return None


@torch.library.impl(_LIB, "mx128_grouped_mm_wgrad_cutlass", "CPU")
def _red_cpu(x, sx, y, sy, offs, out_dtype, pass_):
    """dW[e] = X[:, tokens of e] @ Y[:, tokens of e]^T; x [N, T], y [K, T] token-major, scales [*, T/32]."""
    out = torch.empty(offs.shape[0], x.shape[0], y.shape[0], dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.shape[1] == 0:
        return out.zero_()
    config = schedule_id(pass_, x.shape[0] / GRAN, y.shape[0] / GRAN)
    check_sm_carveout(x)
    load().grouped_red(x.view(torch.uint8), sx, y.view(torch.uint8), sy, offs, out, config)
    return out


@torch.library.register_fake("titan_fp8::mx128_grouped_mm_wgrad_cutlass", lib=_LIB)
def _(x, sx, y, sy, offs, out_dtype, pass_):
    return x.new_empty((offs.shape[0], x.shape[0], y.shape[0]), dtype=out_dtype)


@torch.library.register_fake("titan_fp8::mx128_dgrad_in_parts_cutlass", lib=_LIB)
def _(dq, ds, w, offs, parts):
    return dq.new_empty((dq.shape[0], w.shape[2]), dtype=torch.bfloat16)


_ROWS = torch.ops.titan_fp8.mx128_grouped_mm_rows_cutlass.default
_ROWS_INTO = torch.ops.titan_fp8.mx128_grouped_mm_rows_into_cutlass.default
_RED = torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default
_DGRAD_IN_PARTS = torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default


# The wrappers below check torch's SM carve-out in Python before eager calls of the ops: the ops' C++ kernels read
# the carve-out too, but cannot raise there: on the GPU image (torch 2.11) that error, thrown from the extension,
# crashed the process (benchmarks/results/issue9_host_s16/call7_error_probe/), so they run on one 2-CTA cluster
# instead; tests/gpu/test_grouped_gemm_cutlass_gpu.py::test_op_errors_reach_python checks both in subprocesses.
def fprop(a_data, a_scale, w_data, w_scale, offs):
    check_sm_carveout(a_data)
    a = a_data if a_data.stride(-1) == 1 else a_data.contiguous()
    w = w_data if w_data.stride(-1) == 1 else w_data.contiguous()
    return _ROWS(a, a_scale, w, w_scale, offs, "fprop")


def _dgrad_operands(do_data, do_scale, w_data, w_scale):
    check_sm_carveout(do_data)
    do = do_data if do_data.stride(-1) == 1 else do_data.contiguous()
    wt = w_data.transpose(1, 2)  # [E, K, N]: rows k, reduction n (N contiguous for a transposed view)
    if wt.stride(-1) != 1:
        wt = wt.contiguous()
    return do, do_scale, wt, w_scale.transpose(1, 2)


def dgrad(do_data, do_scale, w_data, w_scale, offs):
    return _ROWS(*_dgrad_operands(do_data, do_scale, w_data, w_scale), offs, "dgrad")


def dgrad_into(do_data, do_scale, w_data, w_scale, offs, out, first_group):
    """dgrad of the experts first_group .. first_group + w_data.shape[0] - 1 of offs into out's rows of them."""
    _ROWS_INTO(*_dgrad_operands(do_data, do_scale, w_data, w_scale), offs, out, first_group, "dgrad")
    return out


def dgrad_in_parts(dq, ds, w, offs, parts):
    """dx = dq @ w[e] per group (mx128 dgrad from the bf16 weight), w [E, N, K] bf16 contiguous (N, K multiples of
    128), dq [M, N] float8 with 1x128 E8M0 runs ds [M, N/32], offs int32 [E]: over the experts in `parts` launches
    into one [M, K] bf16 output, each part's float8 W^T (128 x 128 tiles, quant_triton's bytes) quantized by the
    extension right before its GEMM and freed after it, so only 1/parts of the float8 W^T exists at a time (the
    fused MoE backward's largest transient). One op, C++ throughout: no Python per call in a compiled graph. (The
    parts as traced graph code instead let inductor keep both parts' operands alive: llama_moe mx128 layer peak
    0.96 -> 1.14 GiB, benchmarks/results/issue9_host_s16/call5_prep_traced_parts/.) ValueError for operands it
    cannot take."""
    who = "dgrad_in_parts"
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype != torch.bfloat16 or w.shape[1] % GRAN \
            or w.shape[2] % GRAN:
        raise ValueError(f"{who}: w must be a bf16 [E, N, K] with N, K multiples of 128, got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    E, N, K = w.shape
    if dq.dim() != 2 or dq.shape[1] != N or dq.dtype != torch.float8_e4m3fn \
            or tuple(ds.shape) != (dq.shape[0], N // 32):
        raise ValueError(f"{who}: dq must be float8_e4m3fn [M, N={N}] with ds [M, {N // 32}], got {dq.dtype} "
                         f"{tuple(dq.shape)} and ds {tuple(ds.shape)}")
    if offs.dtype != torch.int32 or tuple(offs.shape) != (E,):
        raise ValueError(f"{who}: offs must be int32 [E={E}], got {offs.dtype} {tuple(offs.shape)}")
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"{who}: parts must be an int >= 1, got {parts!r}")
    reason = device_reason(dq)
    if reason:
        raise CutlassUnavailable(f"{who}: {reason}")
    check_sm_carveout(dq)
    return _DGRAD_IN_PARTS(dq if dq.stride(-1) == 1 else dq.contiguous(), ds, w.contiguous(), offs, parts)


def wgrad(do_t_data, do_t_scale, a_t_data, a_t_scale, offs, out_dtype=torch.float32):
    check_sm_carveout(do_t_data)
    x = do_t_data if do_t_data.stride(-1) == 1 else do_t_data.contiguous()
    y = a_t_data if a_t_data.stride(-1) == 1 else a_t_data.contiguous()
    # the scale grid of both operands is the global 128-token grid: every group must start on it
    torch._assert_async((offs % GRAN == 0).all(), "mxfp8_grouped_mm_wgrad (cutlass): every group must start and "
                                                  "end on a multiple of 128 tokens (pad groups to 128)")
    return _RED(x, do_t_scale, y, a_t_scale, offs, out_dtype, "wgrad")
