"""One MoE layer fwd+bwd, torch.compile'd, one GPU: bf16 vs torchao's fp8 rowwise MoE path vs our fused float8
expert path (fp8_rowwise, mxfp8 mx128 / mx32). Issue 9, acceptance 2.

Layer = titan_fp8.models.moe.MoE: router (fp32 gate), dispatch plan, routed experts (w13 -> SwiGLU -> w2),
weighted combine, and the shared expert where the shape has one (bf16 nn.Linear in every variant: the comparison
is about the routed experts). Variants of the SAME layer (deep copies, same weights, same routing):
  bf16            GroupedExperts (torch._grouped_mm), token_group_align 1
  torchao_fp8     torchao 0.18 prototype moe_training: quantize_(experts, Float8TrainingOpConfig(
                  pad_token_groups_for_grouped_mm=False)) swaps w13/w2 for its weight subclass, which turns
                  torch._grouped_mm into _to_fp8_rowwise_then_scaled_grouped_mm; groups padded to 16 by our plan
  fp8_rowwise     Float8GroupedExperts (fused op; torch._scaled_grouped_mm)
  mxfp8_mx128     Float8GroupedExperts, mxfp8 "mx128" (kernels.grouped_gemm)
  mxfp8_mx32      Float8GroupedExperts, mxfp8 "mx32"
  <ours>@ref      (optional) the same with kernels.moe's plain PyTorch ops (inductor) instead of its Triton kernels
  <mxfp8>+triton  (optional) the mxfp8 GEMMs on a named kernels.grouped_gemm backend ("+triton", "+cutlass");
                  plain names use "auto" (CUTLASS for mx128 on sm_90 where it builds, else Triton)
  <ours>%traced   (optional) every kernels.moe launch as its torch.library.triton_op twin, which torch.compile
  <ours>%opaque   writes into its generated code, or none (opaque custom ops); plain names use kernels.moe's
                  default TRACED_LAUNCH (traced for mxfp8). Set around each of this variant's steps.
  <mx128>^<cfg>   (optional) the mxfp8 mx128 CUTLASS GEMMs under that kernel configuration (one for every pass, or
                  "fprop=<cfg>;dgrad=<cfg>;wgrad=<cfg>": kernels/grouped_gemm/cutlass_backend.py SCHEDULES)
  <ours>~copy     (optional) [float8] moe_keep_input_copy = true: the experts keep x's float8 token-major copy
                  from forward to backward (the default, since session 20, remakes it in backward from x, which
                  the router keeps anyway)
  tw:<variant>    (optional) the shared expert's three Linears in float8 tensorwise as well, as a run with
                  `recipe_name = "tensorwise"` converts them: titan_fp8's Float8Linear for bf16 / ours, torchao's
                  float8 Linear (convert_to_float8_training, recipe "tensorwise") for torchao_fp8; so "tw:bf16" is
                  tensorwise Linears with bf16 experts. Only for shapes with a shared expert.
Timing: CUDA events around each fwd+bwd step, `--iters` steps per variant per round, variants interleaved over
`--rounds` rounds after warm-up; median over all steps. Memory: peak allocated during a step above what was
allocated before it (parameters of every variant stay resident; their gradients are freed before each step, so
a step's gradient buffers count). Time split: torch.profiler over `--prof-steps` steps, CUDA kernels binned by
name (see `CATEGORIES`): gemm / quant / swiglu / dispatch_combine / other. Compilation: static shapes (each
shape compiles on its own, as a training run's one shape does; `--dynamic` for torch.compile's dynamic shapes),
`--inductor-option KEY=VALUE` for inductor configs (e.g. reorder_for_peak_memory=False).

GPU:   python benchmarks/moe_layer.py [--shapes dsv3_layer,llama_moe] [--variants ...]
CPU:   python benchmarks/moe_layer.py --smoke     (tiny shapes, emulated float8, no torchao; checks it runs)
Writes benchmarks/results/moe_layer-<device>-<date>.json (or --out DIR) after every variant (partial results
survive a timeout).
"""
from __future__ import annotations

import argparse
import ast
import copy
import datetime as dt
import json
import linecache
import os
import platform
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import kernels.moe as kernels_moe  # noqa: E402
from titan_fp8.models.moe import GroupedExperts, MoE, MoEArgs  # noqa: E402

SHAPES = {
    # name: (dim, expert hidden, experts, top_k, shared hidden (0 = none), tokens)
    "dsv3_layer": (7168, 2048, 8, 2, 0, 16384),
    "llama_moe": (4096, 2816, 8, 2, 2816, 8192),
    "smoke": (128, 256, 4, 2, 128, 256),
}
VARIANTS = ("bf16", "torchao_fp8", "fp8_rowwise", "mxfp8_mx128", "mxfp8_mx32")

# kernel-name bins, first match wins (names of cuBLAS/CUTLASS/our Triton kernels and inductor's fused kernels,
# whose names list the fused aten ops)
CATEGORIES = [
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|wgmma|_mx_grouped_mm_kernel|_mx_grouped_wgrad_kernel|"
                        r"grouped_mm|sm90|scaled_mm|cublas|Kernel2|^_nt_grouped_kernel|^_wgrad_kernel", re.I)),
    ("swiglu", re.compile(r"silu|sigmoid", re.I)),
    # kernels.moe's fused kernels: _mx_kernel / _f8_* quantize what dispatch, SwiGLU and combine backward write
    ("quant", re.compile(r"amax|fp8|float8|mxfp8|rowcol|scale|clamp|_to_copy_abs|e4m3|quant|jagged|colwise|rowwise|"
                         r"^_mx_kernel|^_f8_", re.I)),
    ("dispatch_combine", re.compile(r"index|gather|scatter|sort|searchsorted|cumsum|cat|embedding|topk|softmax|"
                                    r"arange|radix|combine", re.I)),
]


def classify(name: str) -> str:
    for cat, rx in CATEGORIES:
        if rx.search(name):
            return cat
    return "other"


class _Cfg:  # what Float8GroupedExperts.from_grouped_experts reads of a Float8Config
    def __init__(self, recipe, granularity, emulate):
        self.moe_recipe_name, self.moe_granularity, self.emulate = recipe, granularity, emulate


def gemm_backend_may_use_cutlass(backend: str) -> bool:
    return backend in ("auto", "cutlass")


def split_variant(name: str) -> tuple[str, bool, bool | None]:
    """(the experts' variant, shared expert in float8 tensorwise ("tw:"), kernels.moe's launches: True "%traced",
    False "%opaque", None the default)."""
    tw = name.startswith("tw:")
    name = name[3:] if tw else name
    traced = True if "%traced" in name else False if "%opaque" in name else None
    return name.replace("%traced", "").replace("%opaque", ""), tw, traced


def shared_expert_to_tensorwise(moe: MoE, torchao_peer: bool, emulate: bool) -> None:
    if moe.shared_expert is None:
        raise ValueError("tw:<variant>: this shape has no shared expert (nothing to convert)")
    if torchao_peer:
        from torchao.float8 import Float8LinearConfig
        from torchao.float8 import convert_to_float8_training as ao_convert
        ao_convert(moe.shared_expert, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    else:
        from titan_fp8.float8.config import Float8Config
        from titan_fp8.float8.convert import convert_to_float8_training
        convert_to_float8_training(moe.shared_expert, Float8Config(recipe_name="tensorwise", emulate=emulate,
                                                                   filter_fqns=()))


CUTLASS_ENV = "TITAN_FP8_CUTLASS_SCHEDULE"


def build_variant(base: MoE, full_name: str, emulate: bool) -> MoE:
    hold_copy = "~copy" in full_name
    if hold_copy and full_name.removeprefix("tw:").split("~")[0] in ("bf16", "torchao_fp8"):
        raise ValueError(f"variant {full_name!r}: ~copy is for our float8 variants (the fused experts)")
    moe = _build_variant_cfg(base, full_name.replace("~copy", ""), emulate)
    if hold_copy:
        moe.experts.keep_input_copy = True  # [float8] moe_keep_input_copy
    return moe


def _build_variant_cfg(base: MoE, full_name: str, emulate: bool) -> MoE:
    full_name, _, cutlass_cfg = full_name.partition("^")
    if cutlass_cfg:
        from kernels.grouped_gemm.cutlass_backend import SCHEDULES, schedule_id
        if not full_name.split("%")[0].removeprefix("tw:").startswith("mxfp8_mx128"):
            raise ValueError(f"variant {full_name}^{cutlass_cfg}: ^<config> is for mxfp8_mx128 (CUTLASS kernels)")
        saved = os.environ.get(CUTLASS_ENV)
        os.environ[CUTLASS_ENV] = cutlass_cfg
        try:
            for p in SCHEDULES:  # check the string now: a typo is an error here, not inside torch.compile
                schedule_id(p)
        finally:
            if saved is None:
                os.environ.pop(CUTLASS_ENV)
            else:
                os.environ[CUTLASS_ENV] = saved
    moe = _build_variant(base, full_name, emulate)
    moe.cutlass_schedule = cutlass_cfg or None
    return moe


def _build_variant(base: MoE, full_name: str, emulate: bool) -> MoE:
    name, tw, traced = split_variant(full_name)
    if traced is not None and name in ("bf16", "torchao_fp8"):
        raise ValueError(f"variant {full_name!r}: %traced / %opaque are for our float8 variants (kernels.moe "
                         f"launches)")
    if traced and emulate:
        raise ValueError(f"variant {full_name!r}: %traced needs CUDA (the interpreter runs the opaque ops only)")
    moe = _build_experts_variant(base, name, emulate)
    if tw:
        shared_expert_to_tensorwise(moe, name == "torchao_fp8", emulate)
    moe.traced_launch = traced
    return moe


def _build_experts_variant(base: MoE, name: str, emulate: bool) -> MoE:
    moe = copy.deepcopy(base)
    if name == "bf16":
        return moe
    if name == "torchao_fp8":
        from torchao.prototype.moe_training.config import Float8TrainingOpConfig
        from torchao.quantization import quantize_
        quantize_(moe.experts, Float8TrainingOpConfig(pad_token_groups_for_grouped_mm=False),
                  filter_fn=lambda m, fqn: isinstance(m, GroupedExperts))
        # the subclass intercepts torch._grouped_mm (our grouped_mm's alignment checks read data_ptr, which the
        # wrapper subclass does not have, so the experts call torch._grouped_mm directly, as torchtitan does)
        moe.experts.mm = lambda x, w, offs: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        moe.token_group_align = 16  # its fp8 wgrad needs groups in multiples of 16
        return moe
    from titan_fp8.float8.experts import Float8GroupedExperts
    name, _, gemm = name.partition("+")  # "<variant>+triton" / "+cutlass": the mxfp8 GEMM backend by name
    base_name, _, act = name.partition("@")  # "<variant>@ref": kernels.moe's torch-op references (inductor)
    recipe, gran = {"fp8_rowwise": ("fp8_rowwise", None), "mxfp8_mx128": ("mxfp8", "mx128"),
                    "mxfp8_mx32": ("mxfp8", "mx32"), "mxfp8_mx32_plain": ("mxfp8", "mx32_plain")}[base_name]
    moe.experts = Float8GroupedExperts.from_grouped_experts(moe.experts, _Cfg(recipe, gran, emulate))
    if act == "ref":
        moe.experts.act_backend = "reference"
    elif act:
        raise ValueError(f"variant {name!r}: unknown suffix @{act}; allowed: @ref")
    if gemm:
        moe.experts.backend = gemm
    if recipe == "mxfp8" and not emulate and gemm_backend_may_use_cutlass(moe.experts.backend):
        # build (or load) the CUTLASS extension before torch.compile traces the op's backend choice
        from kernels.grouped_gemm import cutlass_backend
        try:
            cutlass_backend.load()
            moe.gemm_note = f"mxfp8 GEMM backend {moe.experts.backend!r}; CUTLASS extension loaded"
        except cutlass_backend.CutlassUnavailable as e:
            moe.gemm_note = f"mxfp8 GEMM backend {moe.experts.backend!r}; CUTLASS unavailable: {e}"[:300]
        print(moe.gemm_note, flush=True)
    moe.token_group_align = moe.experts.token_group_align
    return moe


def cuda_step_times(step, iters):
    """(GPU ms per step between events, host ms to issue each step): the step starts on an idle GPU, so where
    the host takes longer to launch a step than the GPU to run it, the two are about equal (host-bound)."""
    times, host = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        step()
        b.record()
        host.append((time.perf_counter() - t0) * 1e3)
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times, host


def pipelined_ms(step, iters):
    """ms per step with `iters` steps issued back to back (no sync between them), as a training loop runs
    layers: the host may run ahead of the GPU, so only a host slower than the GPU shows here."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


def python_top(step, steps, n):
    """The n Python functions with the most own time per step (cProfile; autograd's backward runs on the
    calling thread meanwhile, so the custom ops' Python that backward calls is seen too)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        prof.enable()
        for _ in range(steps):
            step()
        prof.disable()
        torch.cuda.synchronize()
    st = pstats.Stats(prof).stats
    rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:n]
    return [{"fn": f"{os.path.basename(k[0])}:{k[1]}({k[2]})"[:90], "calls_per_step": round(v[1] / steps, 1),
             "own_ms": round(v[2] * 1e3 / steps, 3), "cum_ms": round(v[3] * 1e3 / steps, 3)} for k, v in rows]


def host_top(step, steps, n):
    """The n host-side ops with the most self CPU time per step (torch.profiler, CPU activity): where a
    host-bound step spends its launch time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    evs = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:n]
    return [{"op": e.key[:90], "calls_per_step": round(e.count / steps, 1),
             "self_cpu_ms": round(e.self_cpu_time_total / 1e3 / steps, 3)} for e in evs]


def live_at_peak(step, top):
    """The `top` largest allocations alive when one step's allocated memory peaked (the step recorded with
    torch.cuda.memory._record_memory_history; what was allocated before the step is not counted, as `peak_step_gib`
    does not count it): [{"mb", "where"}], "where" = the innermost frame in titan_fp8 / kernels / inductor's generated
    code. Says what a float8 variant's peak holds that bf16's does not."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
    try:
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live, cur, best, at_best = {}, 0, -1, {}
    for ev in snap["device_traces"][torch.cuda.current_device()]:
        if ev["action"] == "alloc":
            live[ev["addr"]] = ev
            cur += ev["size"]
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])["size"]
        else:
            continue
        if cur > best:
            best, at_best = cur, dict(live)

    def frame(ev):
        frames = ev.get("frames") or []
        for f in frames:
            if any(k in f["filename"] for k in ("titan_fp8/", "kernels/", "torchinductor", "benchmarks/")):
                return f
        return frames[0] if frames else None

    def where(ev):
        f = frame(ev)
        return f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"[:80] if f else "?"

    def code(ev):
        """The allocating line of generated code and the next line that launches something: names the buffer and
        the op that writes it (inductor's output code says neither in its file name)."""
        f = frame(ev)
        if not f or "torchinductor" not in f["filename"]:
            return None
        lines = [linecache.getline(f["filename"], f["line"] + i).strip() for i in range(12)]
        launch = next((ln for ln in lines[1:] if re.search(r"\.run\(|torch\.ops\.|extern_kernels\.|aten\.", ln)),
                      "")
        return f"{lines[0][:110]}  ->  {launch[:150]}"

    rows = sorted(at_best.values(), key=lambda e: -e["size"])[:top]
    return {"peak_mb": round(best / 2**20, 1),
            "top": [{"mb": round(e["size"] / 2**20, 1), "where": where(e), "code": code(e)} for e in rows]}


def kernel_sequence(step, pattern: str) -> list:
    """Every GPU kernel of one step whose name matches `pattern`, in issue order, with its time (us): tells apart
    the launches of one kernel name (kernels.moe's _mx_kernel serves dispatch, SwiGLU, combine backward and
    dSwiGLU) that kernel_split adds up."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rx = re.compile(pattern)
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and rx.search(e.name)]
    evs.sort(key=lambda e: e.time_range.start)
    return [{"kernel": e.name[:90], "us": round(e.time_range.elapsed_us(), 1)} for e in evs]


def kernel_split(step, steps):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    split, top, launches = {}, {}, 0
    for ev in prof.key_averages():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = ev.device_time_total / 1e3 / steps  # ms per step
        if t <= 0:
            continue
        launches += ev.count
        cat = classify(ev.key)
        split[cat] = split.get(cat, 0.0) + t
        top[ev.key[:90]] = (cat, t)
    top = sorted(top.items(), key=lambda kv: -kv[1][1])[:12]
    # GPU work items per step (kernels and copies): with steps issued back to back, the step's time above the sum of
    # its kernels is mostly the gaps between dependent launches, so this count says how much fusion could win
    return ({k: round(v, 3) for k, v in sorted(split.items())},
            [{"kernel": k, "cat": c, "ms": round(t, 3)} for k, (c, t) in top], round(launches / steps, 1))


def gpu_gaps(step, steps, top=8):
    """Where the GPU idles inside a step: `steps` steps, each issued on an idle GPU and synced (as `ms` times
    them), profiled with host and CUDA activity; benchmarks/trace_gaps.py reads the Chrome trace. Returns the busy
    share and the host work the longest idle stretches (>= 20 us) fell under."""
    import importlib.util
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    spec = importlib.util.spec_from_file_location("_trace_gaps", os.path.join(ROOT, "benchmarks", "trace_gaps.py"))
    tg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tg)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        events = tg.load_events(path)
    span, busy, gaps = tg.gpu_gaps(events)
    # the stretches between steps (host sync + the next step's first launches) count too: `ms` includes them
    rows = tg.attribute(events, gaps, 20.0)[:top]
    return {"span_ms": round(span / 1e3 / steps, 3), "busy_ms": round(busy / 1e3 / steps, 3),
            "idle_ms": round((span - busy) / 1e3 / steps, 3),
            "by_host_op": [dict(r, idle_ms=round(r["idle_ms"] / steps, 3)) for r in rows]}


def versions():
    v = {"torch": torch.__version__, "python": platform.python_version()}
    for mod in ("triton", "torchao"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # not installed: say so
            v[mod] = f"unavailable ({type(e).__name__})"
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="dsv3_layer,llama_moe")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prof-steps", type=int, default=2)
    ap.add_argument("--py-top", type=int, default=0,
                    help="also list the N Python functions with the most own time per step (cProfile)")
    ap.add_argument("--host-top", type=int, default=0,
                    help="also list the N host ops with the most self CPU time per step (CPU profiler)")
    ap.add_argument("--gaps", action="store_true",
                    help="also profile host + GPU activity and list the host work the GPU's idle time falls under "
                         "(benchmarks/trace_gaps.py), per step")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--dynamic", action="store_true",
                    help="compile with dynamic shapes (default: static, each shape compiles on its own)")
    ap.add_argument("--inductor-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an inductor config for every variant's torch.compile (repeatable; VALUE a Python literal), "
                         "e.g. reorder_for_peak_memory=False")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (e.g. reduce-overhead: CUDA graphs, the bound on removing launch cost)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, emulated float8, no torchao")
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="stop building variants / timing rounds once this many seconds have passed (0: never)")
    ap.add_argument("--mem-peak", type=int, default=0,
                    help="also record one step's allocations and list the N largest alive at its peak (GPU)")
    ap.add_argument("--kernel-seq", default="",
                    help="also list every launch of one step whose kernel name matches this regex, in order (GPU)")
    ap.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results)")
    args = ap.parse_args()

    inductor_options = {}
    for kv in args.inductor_option:
        key, sep, value = kv.partition("=")
        if not sep or not hasattr(torch._inductor.config, key):
            raise SystemExit(f"--inductor-option {kv!r}: expected KEY=VALUE with KEY an inductor config name")
        inductor_options[key] = ast.literal_eval(value)
    # every variant and shape compiles MoE.forward anew (new module, new shapes): lift dynamo's recompile limit,
    # which otherwise silently runs the later variants eagerly
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 512
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    shapes = ["smoke"] if args.smoke else args.shapes.split(",")
    variants = [v for v in args.variants.split(",") if not (args.smoke and v == "torchao_fp8")]
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    out_dir = args.out or os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"moe_layer-{re.sub(r'[^A-Za-z0-9]+', '_', dev_name)}-{dt.date.today()}.json")
    report = {"device": dev_name, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "settings": vars(args), "results": []}

    def save():
        with open(path, "w") as f:
            json.dump(report, f, indent=1)

    t_start = time.time()
    traced_default = kernels_moe.TRACED_LAUNCH

    def late():
        return args.deadline_s and time.time() - t_start > args.deadline_s

    for shape in shapes:
        if late():
            report["results"].append({"shape": shape, "error": "skipped: --deadline-s reached"})
            break
        dim, hid, E, k, shared, T = SHAPES[shape]
        torch.manual_seed(0)
        margs = MoEArgs(num_experts=E, top_k=k, hidden_dim=hid, load_balance="none",
                        num_shared_experts=1 if shared else 0, shared_hidden_dim=shared)
        with torch.device(device):
            base = MoE(dim, margs)
            base.init_weights(0.02)
        base = base.to(torch.bfloat16)
        x = torch.randn(1, T, dim, device=device, dtype=torch.bfloat16)
        dout = torch.randn(1, T, dim, device=device, dtype=torch.bfloat16)
        runs = {}
        for name in variants:
            t0 = time.time()
            if late():
                report["results"].append({"shape": shape, "variant": name, "error": "skipped: --deadline-s reached"})
                continue
            try:
                moe = build_variant(base, name, emulate=not cuda)
                # static shapes, as a training run's one shape compiles: with torch.compile's default (automatic
                # dynamic) the second shape of a run compiled with a symbolic token count (runs up to 2026-11-26:
                # dsv3_layer after llama_moe; its router-backward kernel alone took 0.64 ms instead of ~0.3)
                fwd = moe if args.no_compile else torch.compile(moe, mode=args.compile_mode,
                                                                 dynamic=True if args.dynamic else False,
                                                                 options=inductor_options or None)
                xi = x.clone().requires_grad_()

                def step(moe=moe, fwd=fwd, xi=xi):
                    for p in moe.parameters():
                        p.grad = None
                    xi.grad = None
                    kernels_moe.TRACED_LAUNCH = (traced_default if moe.traced_launch is None  # read while compiling
                                                 else moe.traced_launch)
                    # the CUTLASS configuration is read while compiling (baked into the graph) and in eager calls
                    if moe.cutlass_schedule:
                        os.environ[CUTLASS_ENV] = moe.cutlass_schedule
                    else:
                        os.environ.pop(CUTLASS_ENV, None)
                    fwd(xi).backward(dout)

                for _ in range(args.warmup if cuda else 1):
                    step()
                if cuda:
                    for p in moe.parameters():
                        p.grad = None
                    xi.grad = None
                    torch.cuda.synchronize()
                    mem_before = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    step()
                    torch.cuda.synchronize()
                    peak = (torch.cuda.max_memory_allocated() - mem_before) / 2**30
                    split, top, launches = kernel_split(step, args.prof_steps)
                    htop = host_top(step, args.prof_steps, args.host_top) if args.host_top else []
                    htop += python_top(step, args.prof_steps, args.py_top) if args.py_top else []
                    gaps = gpu_gaps(step, args.prof_steps) if args.gaps else None
                    mem = live_at_peak(step, args.mem_peak) if args.mem_peak else None
                    seq = kernel_sequence(step, args.kernel_seq) if args.kernel_seq else None
                else:
                    peak, split, top, htop, gaps, launches, mem, seq = None, {}, [], [], None, None, None, None
                runs[name] = dict(step=step, times=[], host=[], peak=peak, split=split, top=top, htop=htop, gaps=gaps,
                                  launches=launches, mem=mem, seq=seq,
                                  setup_s=round(time.time() - t0, 1), note=getattr(moe, "gemm_note", None))
                print(f"[{shape}] {name}: ready in {time.time() - t0:.0f} s", flush=True)
            except Exception as e:  # a variant that cannot run is reported, the others still run
                report["results"].append({"shape": shape, "variant": name, "error": f"{type(e).__name__}: {e}"[:600]})
                print(f"[{shape}] {name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                save()
        for rnd in range(args.rounds if cuda else 1):
            if rnd and late():
                break
            for name, r in runs.items():
                if cuda:
                    gpu_ms, host_ms = cuda_step_times(r["step"], args.iters)
                    r["times"] += gpu_ms
                    r["host"] += host_ms
                    r.setdefault("pipelined", []).append(pipelined_ms(r["step"], args.iters))
                else:
                    t0 = time.perf_counter()
                    r["step"]()
                    r["times"].append((time.perf_counter() - t0) * 1e3)
        kernels_moe.TRACED_LAUNCH = traced_default
        base_ms = statistics.median(runs["bf16"]["times"]) if "bf16" in runs else None
        for name, r in runs.items():
            ms = statistics.median(r["times"])
            peer = "tw:torchao_fp8" if name.startswith("tw:") else "torchao_fp8"  # same shared-expert precision
            ao_ms = statistics.median(runs[peer]["times"]) if peer in runs else None
            report["results"].append({
                "shape": shape, "variant": name, "tokens": T, "dim": dim, "hidden": hid, "experts": E, "top_k": k,
                "shared_hidden": shared, "ms": round(ms, 3), "ms_min": round(min(r["times"]), 3),
                "steps_timed": len(r["times"]),
                "vs_bf16": round(base_ms / ms, 3) if base_ms else None,
                "vs_torchao_fp8": round(ao_ms / ms, 3) if ao_ms else None,
                "host_ms": round(statistics.median(r["host"]), 3) if r["host"] else None,
                "pipelined_ms": round(statistics.median(r["pipelined"]), 3) if r.get("pipelined") else None,
                "pipelined_rounds_ms": [round(v, 3) for v in r.get("pipelined", [])],
                "peak_step_gib": round(r["peak"], 3) if r["peak"] is not None else None,
                "host_top": r["htop"], "gpu_gaps": r["gaps"],
                "split_ms": r["split"], "launches_per_step": r["launches"], "top_kernels": r["top"],
                "live_at_peak": r["mem"], "kernel_seq": r["seq"],
                "setup_s": r["setup_s"], "note": r["note"]})
        save()
        del runs
        if cuda:
            torch.cuda.empty_cache()

    print(f"\n{'shape':<11} {'variant':<24} {'ms':>8} {'x bf16':>7} {'x ao':>6} {'host':>6} {'piped':>6} "
          f"{'peak GiB':>8}  split ms (gemm/quant/swiglu/disp+comb/other)")
    for r in report["results"]:
        if "error" in r:
            print(f"{r['shape']:<11} {r.get('variant', '-'):<24} ERROR {r['error'][:80]}")
            continue
        s = r["split_ms"]
        split = "/".join(f"{s.get(c, 0):.2f}" for c in ("gemm", "quant", "swiglu", "dispatch_combine", "other"))
        print(f"{r['shape']:<11} {r['variant']:<24} {r['ms']:>8.3f} {r['vs_bf16'] or 0:>7.3f} "
              f"{r['vs_torchao_fp8'] or 0:>6.3f} {r['host_ms'] or 0:>6.2f} {r['pipelined_ms'] or 0:>6.2f} "
              f"{r['peak_step_gib'] or 0:>8.3f}  {split}")
    for r in report["results"]:
        for h in r.get("host_top") or []:
            ms, what = (h["self_cpu_ms"], h["op"]) if "op" in h else (h["own_ms"], f"py {h['fn']} cum {h['cum_ms']}")
            print(f"  host {r['shape']} {r['variant']}: {ms:7.3f} ms  x{h['calls_per_step']:<5} {what}")
    for r in report["results"]:
        g = r.get("gpu_gaps")
        if g:
            print(f"  gaps {r['shape']} {r['variant']}: GPU span {g['span_ms']:.2f} ms/step, busy {g['busy_ms']:.2f}, "
                  f"idle {g['idle_ms']:.2f}")
            for h in g["by_host_op"]:
                print(f"       {h['idle_ms']:7.3f} ms in {h['gaps']:3d} gaps under {h['host'][:110]}")
    for r in report["results"]:
        m = r.get("live_at_peak")
        if m:
            print(f"  peak {r['shape']} {r['variant']}: {m['peak_mb']:.0f} MB above the step's start; largest alive:")
            for e in m["top"]:
                print(f"       {e['mb']:8.1f} MB  {e['where']}")
                if e.get("code"):
                    print(f"                    {e['code']}")
    for r in report["results"]:
        for i, e in enumerate(r.get("kernel_seq") or []):
            print(f"  seq {r['shape']} {r['variant']} #{i:<3} {e['us']:8.1f} us  {e['kernel']}")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
