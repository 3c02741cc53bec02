"""Float8 Linear fwd+bwd speedup vs bf16 on one GPU: every titan_fp8 recipe and torchao's Float8Linear
(tensorwise, rowwise), all compiled with torch.compile, at the llama_moe linear shapes and torchao's two
documented examples (M, K, N = 1024x2048x1024: torchao reports 0.80x; 4096x8192x16384: 1.39x).

The table feeds filter_fqns = ["auto_filter_small_kn"]: `--update-roofline` writes the measured speedups into
titan_fp8/float8/roofline.json (a measured (recipe, K, N) wins over the analytic formula).

GPU:   python benchmarks/float8_linear.py --update-roofline    (6 shapes x 7 variants, each compiled: ~5-8 min
       on one H200; split with --shapes llama_moe / torchao_docs if the 10-minute limit is near)
CPU:   python benchmarks/float8_linear.py --smoke              (tiny shapes, emulate, eager: checks it runs)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from titan_fp8.float8 import Float8Config, convert_to_float8_training  # noqa: E402

# (label, M tokens, K in_features, N out_features)
LLAMA_MOE = [
    ("wq/wo 4096x4096", 8192, 4096, 4096),
    ("wk/wv 4096->1024", 8192, 4096, 1024),
    ("shared w1/w3 4096->2816", 8192, 4096, 2816),
    ("shared w2 2816->4096", 8192, 2816, 4096),
]
TORCHAO_DOCS = [
    ("torchao doc 1024x2048x1024 (0.80x)", 1024, 2048, 1024),
    ("torchao doc 4096x8192x16384 (1.39x)", 4096, 8192, 16384),
]
SMOKE = [("smoke 256x256x256", 256, 256, 256), ("smoke 128x512x256", 128, 512, 256)]
SHAPE_SETS = {"all": LLAMA_MOE + TORCHAO_DOCS, "llama_moe": LLAMA_MOE, "torchao_docs": TORCHAO_DOCS,
              "acceptance": LLAMA_MOE[:1], "llama_moe_rest": LLAMA_MOE[1:]}
OURS = ["tensorwise", "rowwise", "blockwise", "mxfp8", "mxfp8_mx128"]
# variant name -> Float8Config keys ("mxfp8" alone keeps its default linear_granularity).
# mx128 experiments (module switches, set before every step of the variant; dynamo guards on them):
#   mxfp8_mx128_opaque  the quantizer called as an opaque custom op (dispatcher per call) instead of a triton op
#                       whose launch torch.compile traces into its code: what the traced launch saves in host time
#   mxfp8_mx128_w16     the quantizer with 16 warps per 128x128 tile instead of 8
#   mxfp8_mx128_xt1x128 grad-weight's x^T operand in 1x128 blocks along tokens instead of 128x128 tiles
#                       (linear.MX128_WGRAD_X_TILES = False; the 2026-11-23 results call the tiled default
#                       "mxfp8_mx128_xtiles" and this one "mxfp8_mx128", from before the default changed)
#   mxfp8_mx32          linear_granularity "mx32" (1x32 blocks, 128x128 weight tiles; GEMMs on kernels.grouped_gemm)
#   mxfp8_mx32_tile32   linear_granularity "mx32_tile32" (32x32 weight tiles, dequantized GEMMs; what "mxfp8"
#                       ran before 2026-11-27). "mxfp8" alone runs the default linear_granularity.
MX128 = dict(recipe_name="mxfp8", linear_granularity="mx128")
VARIANT_KEYS = {"mxfp8_mx128": MX128, "mxfp8_mx128_opaque": MX128, "mxfp8_mx128_w16": MX128,
                "mxfp8_mx128_xt1x128": MX128,
                "mxfp8_mx32": dict(recipe_name="mxfp8", linear_granularity="mx32"),
                "mxfp8_mx32_tile32": dict(recipe_name="mxfp8", linear_granularity="mx32_tile32")}
SWITCH_DEFAULTS = {("kernels.grouped_gemm.quant_triton", "TRACED_LAUNCH"): True,
                   ("kernels.grouped_gemm.quant_triton", "BLOCKWISE_NUM_WARPS"): 8,
                   ("titan_fp8.float8.linear", "MX128_WGRAD_X_TILES"): True}
VARIANT_SWITCHES = {
    "mxfp8_mx128_opaque": {("kernels.grouped_gemm.quant_triton", "TRACED_LAUNCH"): False},
    "mxfp8_mx128_w16": {("kernels.grouped_gemm.quant_triton", "BLOCKWISE_NUM_WARPS"): 16},
    "mxfp8_mx128_xt1x128": {("titan_fp8.float8.linear", "MX128_WGRAD_X_TILES"): False},
}


def switches_setter(variant):
    """A function that sets the module switches for `variant` (the defaults for every other variant)."""
    import importlib
    values = {**SWITCH_DEFAULTS, **VARIANT_SWITCHES.get(variant, {})}

    def set_switches():
        for (mod, attr), v in values.items():
            try:
                setattr(importlib.import_module(mod), attr, v)
            except ImportError:  # no triton on this machine: no mx128 GPU quantizer either
                pass
    return set_switches
TORCHAO = ["tensorwise", "rowwise"]


def time_fn(fn, device, warmup, iters, reps=5):
    """Median ms per step. CUDA: `iters` steps back to back between two events (the CPU runs ahead, as in
    training), repeated `reps` times. CPU smoke: wall clock per step."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        per_step = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                fn()
            e.record()
            e.synchronize()
            per_step.append(s.elapsed_time(e) / iters)
        return statistics.median(per_step)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gpu_kernel_time(fn, steps=5, top=12):
    """(GPU ms per step summed over every kernel / memcpy / memset, [(kernel, calls/step, us/step)] of the
    costliest): the step's device time with the CPU's launch gaps taken out (what torchao's roofline also
    compares). Read with the torch profiler over `steps` steps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    by_name = {}
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA:
            n, us = by_name.get(ev.name, (0, 0.0))
            by_name[ev.name] = (n + 1, us + ev.time_range.elapsed_us())
    total_ms = sum(us for _, us in by_name.values()) / steps / 1e3
    kernels = sorted(((k[:90], n / steps, round(us / steps, 1)) for k, (n, us) in by_name.items()),
                     key=lambda r: -r[2])
    return total_ms, kernels[:top]


def make_variant(kind, recipe, K, N, device, dtype, emulate):
    lin = nn.Sequential(nn.Linear(K, N, bias=False, device=device, dtype=dtype))
    if kind == "ours":
        keys = VARIANT_KEYS.get(recipe, dict(recipe_name=recipe))
        convert_to_float8_training(lin, Float8Config(**keys, emulate=emulate, filter_fqns=()))
    elif kind == "torchao":
        from torchao.float8 import Float8LinearConfig
        from torchao.float8 import convert_to_float8_training as ao_convert
        import dataclasses
        cfg = Float8LinearConfig.from_recipe_name(recipe)
        if emulate:
            cfg = dataclasses.replace(cfg, emulate=True)
        ao_convert(lin, config=cfg)
    return lin


def make_step(lin, M, K, device, dtype, compile_mode, set_switches=lambda: None):
    """One fwd+bwd step of `lin` on a fixed random input (compiled if asked)."""
    x = torch.randn(M, K, device=device, dtype=dtype, requires_grad=True)

    def forward(x):
        return lin(x)

    # a private code object per variant: torch.compile caches compiled code per code object and checks the
    # cached entries' guards in turn, so with every variant of a shape alive (interleaved rounds) a shared
    # nn.Sequential.forward made each call pay for the other variants' guards, in host time
    forward = types.FunctionType(forward.__code__.replace(co_name=f"step_{id(lin)}"), forward.__globals__,
                                 f"step_{id(lin)}", None, forward.__closure__)
    model = torch.compile(forward) if compile_mode == "inductor" else lin
    gy = None

    def step():
        nonlocal gy
        set_switches()  # read while tracing (and guarded) and in eager calls
        y = model(x)
        if gy is None:
            gy = torch.randn_like(y)
        y.backward(gy)
        x.grad = None
        for p in lin.parameters():
            p.grad = None

    return step


def print_table(rows, shapes, torchao_note):
    # short table: speedup vs bf16 from back-to-back wall time / from summed GPU kernel time
    print("\ncells: fwd+bwd speedup vs bf16, wall (steps back to back) / GPU kernel time (profiler)")
    print(f"\n{'shape':38s} " + " ".join(f"{v:>18s}" for v in dict.fromkeys(r['variant'] for r in rows)))
    for label, *_ in shapes:
        cells = {r["variant"]: r for r in rows if r["shape"] == label}
        line = []
        for v in dict.fromkeys(r['variant'] for r in rows):
            r = cells.get(v)
            if r is None or "error" in r:
                line.append(f"{'ERR':>18s}")
            else:  # "wall x / GPU-kernel-time x"
                line.append(f"{r['speedup']:.3f}/{r.get('speedup_gpu') or 0:.3f}x".rjust(18))
        print(f"{label:38s} " + " ".join(line))
    if torchao_note:
        print(torchao_note)


def write_json(args, rows, versions, torchao_note, device, compile_mode, smoke):
    """Written after every shape, so a run cut short by a time limit still leaves its finished shapes."""
    dev = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu"
    result = dict(benchmark="float8_linear", device=dev, date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  versions=versions, command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                  compile=compile_mode, smoke=smoke, note=torchao_note, results=rows)
    os.makedirs(args.out, exist_ok=True)
    tag = "smoke" if smoke else dev.replace(" ", "_")
    if args.shapes != "all" and not smoke:
        tag = f"{args.shapes}-{tag}"
    path = os.path.join(args.out, f"float8_linear-{tag}-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return path, result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, emulate=True, eager")
    ap.add_argument("--recipes", default=",".join(OURS))
    ap.add_argument("--shapes", default="all", choices=list(SHAPE_SETS),
                    help="acceptance: issue 10's 8192x4096->4096 only; llama_moe_rest: the other llama_moe shapes")
    ap.add_argument("--no-torchao", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per shape (median)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--update-roofline", action="store_true",
                    help="write measured speedups into titan_fp8/float8/roofline.json")
    args = ap.parse_args()

    smoke = args.smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    emulate = smoke
    compile_mode = "none" if (smoke or args.no_compile) else "inductor"
    shapes = SMOKE if smoke else SHAPE_SETS[args.shapes]
    iters, warmup, rounds = (3, 1, 1) if smoke else (args.iters, args.warmup, args.rounds)
    recipes = [r for r in args.recipes.split(",") if r]

    versions = {"torch": torch.__version__}
    try:
        import triton
        versions["triton"] = triton.__version__
    except Exception:
        versions["triton"] = None
    torchao_note = None
    try:
        if args.no_torchao:
            raise ImportError("--no-torchao")
        import torchao
        versions["torchao"] = torchao.__version__
    except Exception as e:  # pragma: no cover - GPU image without the torchao wheel
        versions["torchao"] = None
        torchao_note = f"torchao rows skipped: {e!r}"

    # torch.compile guards each module instance: every variant of a shape is one more compile of the same code
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    rows = []
    for label, M, K, N in shapes:
        variants = [("bf16", None)] + [("ours", r) for r in recipes]
        if versions["torchao"]:
            variants += [("torchao", r) for r in TORCHAO]
        # build, compile and warm every variant of the shape, then time them in interleaved rounds (the median
        # per variant): GPU clocks drift over a run, and back-to-back variants would carry that into the ratios
        steps, result = {}, {}
        for kind, recipe in variants:
            name = kind if recipe is None else f"{kind}_{recipe}"
            result[name] = dict(shape=label, M=M, K=K, N=N, variant=name)
            try:
                torch.manual_seed(0)
                lin = make_variant(kind, recipe, K, N, device, dtype, emulate)
                steps[name] = make_step(lin, M, K, device, dtype, compile_mode,
                                        switches_setter(recipe) if device.type == "cuda" else lambda: None)
                for _ in range(warmup):
                    steps[name]()
            except Exception as e:
                result[name]["error"] = repr(e)[:300]
        wall, gpu, kern = {n: [] for n in steps}, {n: [] for n in steps}, {}
        for _ in range(rounds):
            for name, step in steps.items():
                try:
                    wall[name].append(time_fn(step, device, 1, iters, reps=1))
                    if device.type == "cuda":
                        g_ms, kern[name] = gpu_kernel_time(step)
                        gpu[name].append(g_ms)
                except Exception as e:
                    result[name]["error"] = repr(e)[:300]
        base = statistics.median(wall["bf16"]) if wall.get("bf16") else None
        base_gpu = statistics.median(gpu["bf16"]) if gpu.get("bf16") else None
        for name, row in result.items():
            if "error" not in row and wall.get(name):
                ms = statistics.median(wall[name])
                row["ms"] = round(ms, 4)
                row["tflops"] = round(6 * M * K * N / ms / 1e9, 1)
                row["speedup"] = round(base / ms, 3) if base else None
                if gpu.get(name):
                    g_ms = statistics.median(gpu[name])
                    row["gpu_ms"] = round(g_ms, 4)
                    row["gpu_ms_rounds"] = [round(v, 4) for v in gpu[name]]
                    row["speedup_gpu"] = round(base_gpu / g_ms, 3) if base_gpu else None
                    row["kernels"] = kern[name]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        del steps
        write_json(args, rows, versions, torchao_note, device, compile_mode, smoke)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        torch._dynamo.reset()

    path, result = write_json(args, rows, versions, torchao_note, device, compile_mode, smoke)
    print_table(rows, shapes, torchao_note)
    print(f"wrote {path}")

    if args.update_roofline and not smoke:
        from titan_fp8.float8.roofline import TABLE
        table = json.load(open(TABLE))
        measured = [dict(recipe=r["variant"][5:], M=r["M"], K=r["K"], N=r["N"],
                         speedup=r.get("speedup_gpu") or r["speedup"])
                    for r in rows if r["variant"].startswith("ours_") and r.get("speedup")]
        keep = [m for m in table.get("measured", [])
                if (m["recipe"], m["K"], m["N"]) not in {(x["recipe"], x["K"], x["N"]) for x in measured}]
        table["measured"] = keep + measured
        table["measured_source"] = f"{os.path.relpath(path, ROOT)} ({result['device']}, {result['date']})"
        with open(TABLE, "w") as f:
            json.dump(table, f, indent=1)
        print(f"updated {TABLE} with {len(measured)} measured rows")


if __name__ == "__main__":
    main()
