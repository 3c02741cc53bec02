"""MoE expert-path kernels (kernels/moe): ours vs torch.compile of the same reference vs a plain copy of the same
bytes, in one run, at the issue-9 layer shapes.

Per shape (dsv3_layer: 16384 tokens, D 7168, H 2048; llama_moe: 8192 tokens, D 4096, H 2816; 8 experts, top-2,
uneven routing) and op (dispatch_quantize, combine, combine_backward, swiglu_quantize, swiglu_quantize_backward)
x recipe (mxfp8 block 32 / 128, fp8_rowwise):
  ours      the public function (Triton kernels)
  ref       kernels/moe/reference.py's function under torch.compile (what inductor makes of the plain PyTorch path)
  copy      a device-to-device copy of the op's byte count (half read, half written)
Bytes = what the op must move at least: every input element read once (the gathered rows of x / dout / y: N*k
rows), every output byte written once (data, scales, dweights). fp8_rowwise's token-major copy reads its input a
second time (per-group scales need the group's amax first), so its % of copy tops out near 4/6 of mxfp8's.
% of copy = (bytes / time) / (copy bytes / copy time). Timing: `calls` launches captured in one CUDA graph,
replays timed with events, median of 7 (no host cost, no L2 flush; every tensor is far larger than L2).

    python benchmarks/moe_kernels.py [--out DIR] [--budget SECONDS] [--no-compile]
    python benchmarks/moe_kernels.py --smoke     # CPU, Triton interpreter, tiny shapes, no timing claims
Ours and copy are timed for every row first; the compiled peers follow (dsv3_layer first) while --budget lasts.
Writes <out>/moe_kernels-<device>-<date>.json (after every row) and prints a table.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if "--smoke" in sys.argv or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is decorated

import kernels.moe as km  # noqa: E402
from kernels.moe import reference as ref  # noqa: E402

SHAPES = {"dsv3_layer": (16384, 7168, 2048, 8, 2), "llama_moe": (8192, 4096, 2816, 8, 2)}  # N, D, H, E, k
RECIPES = [("mxfp8", 32, 32), ("mxfp8", 128, 128), ("fp8_rowwise", 32, 16)]  # recipe, block, token_group_align


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--budget", type=float, default=240.0, help="seconds; compiled peers stop being added after it")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--smoke", action="store_true")
    return p.parse_args()


ARGS = parse()
DEV = "cpu" if ARGS.smoke else "cuda"
if ARGS.smoke:
    SHAPES = {"tiny": (24, 128, 128, 4, 2)}


def graph_ms(fn, calls=10, replays=7):
    """Median over replays of (one replay of a CUDA graph holding `calls` launches of fn) / calls."""
    fn()
    if DEV == "cpu":  # smoke: one wall-clock call
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    del g
    return sorted(times)[len(times) // 2]


def copy_ms(nbytes):
    """The same byte count moved by a device-to-device copy (half read, half written)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return graph_ms(lambda: dst.copy_(src))


def out_bytes(P, C, E, recipe):
    scales = (2 * P * C // 32) if recipe == "mxfp8" else 4 * (P + E * C)
    return 2 * P * C + scales


def cases(shape, recipe, block, align):
    N, D, H, E, k = SHAPES[shape]
    torch.manual_seed(0)
    logits = torch.randn(N, E, device=DEV) + torch.linspace(0, 1, E, device=DEV)
    plan = km_plan(logits.topk(k, dim=1).indices, E, align)
    P, R = plan.src.shape[0], N * k  # buffer rows, real rows
    bf = torch.bfloat16
    x, dout = torch.randn(N, D, device=DEV, dtype=bf), torch.randn(N, D, device=DEV, dtype=bf)
    y = torch.randn(P, D, device=DEV, dtype=bf)
    h13, da = torch.randn(P, 2 * H, device=DEV, dtype=bf), torch.randn(P, H, device=DEV, dtype=bf)
    w = torch.rand(N, k, device=DEV)
    idx = 8 * P + 4 * E
    return P, [
        ("dispatch_quantize", km.dispatch_quantize, ref.dispatch_quantize_reference,
         (x, plan.src, plan.offs, recipe, block), 2 * R * D + idx + out_bytes(P, D, E, recipe)),
        ("combine_backward", km.combine_backward, ref.combine_backward_reference,
         (dout, y, plan.pos, w, plan.src, plan.offs, recipe, block),
         2 * N * D + 2 * R * D + idx + 12 * R + out_bytes(P, D, E, recipe) + 4 * R),
        ("swiglu_quantize", km.swiglu_quantize, ref.swiglu_quantize_reference, (h13, plan.offs, recipe, block),
         2 * P * 2 * H + out_bytes(P, H, E, recipe)),
        ("swiglu_quantize_backward", km.swiglu_quantize_backward, ref.swiglu_quantize_backward_reference,
         (da, h13, plan.offs, recipe, block), 2 * P * H + 2 * P * 2 * H + out_bytes(P, 2 * H, E, recipe)),
    ] + ([("combine", km.combine, ref.combine_reference, (y, plan.pos, w), 2 * R * D + 12 * R + 2 * N * D)]
         if (recipe, block) == ("mxfp8", 32) else [])


def km_plan(experts, E, align):
    from titan_fp8.models.moe import dispatch_plan
    return dispatch_plan(experts, E, align)


def main():
    args = ARGS
    assert torch.cuda.is_available() or args.smoke, "benchmarks/moe_kernels.py needs a GPU (or --smoke)"
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.recompile_limit = 256
    t0 = time.time()
    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu-interpreter-smoke"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"moe_kernels-{dev.lower().replace(' ', '-')}-{datetime.date.today().isoformat()}.json")
    rows = []

    def dump():
        result = dict(benchmark="moe_kernels", device=dev, date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                      torch=torch.__version__, triton=__import__("triton").__version__, command=" ".join(sys.argv),
                      commit=commit, seconds=round(time.time() - t0, 1), rows=rows)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def show(row):
        label = f"{row['recipe']}{'/' + str(row['block']) if row['recipe'] == 'mxfp8' else ''}"
        print(f"{row['shape']:11} {row['op']:25} {label:12} {row['bytes'] / 1e6:7.0f} {row['ours_ms']:8.3f} "
              f"{row['pct_of_copy']:6.1f}% {row.get('ref_compiled_ms', float('nan')):8.3f} "
              f"{row.get('speedup_vs_ref', float('nan')):8.2f} {row.get('ref_error', '')}", flush=True)

    header = f"{'shape':11} {'op':25} {'recipe':12} {'MB':>7} {'ours ms':>8} {'% copy':>7} {'ref ms':>8} {'ref/ours':>8}"
    print(header)
    for phase in ("ours", "ref"):
        if phase == "ref":
            if args.no_compile or args.smoke:
                break
            print("-- compiled references (torch.compile of kernels/moe/reference.py) --")
            print(header)
        i = 0
        for shape in SHAPES:
            for recipe, block, align in RECIPES:
                if phase == "ref" and time.time() - t0 > args.budget:
                    break
                P, runs = cases(shape, recipe, block, align)
                for name, ours, reference, a, nbytes in runs:
                    if phase == "ours":
                        ms = graph_ms(lambda f=ours, a=a: f(*a))
                        cms = copy_ms(nbytes)
                        rows.append(dict(shape=shape, op=name, recipe=recipe, block=block if recipe == "mxfp8" else None,
                                         P=P, bytes=nbytes, ours_ms=round(ms, 4),
                                         ours_TBps=round(nbytes / ms / 1e9, 3), copy_ms=round(cms, 4),
                                         pct_of_copy=round(100 * cms / ms, 1)))
                        show(rows[-1])
                    else:
                        row = rows[i]
                        if time.time() - t0 > args.budget:
                            row["ref_error"] = "skipped: time budget"
                        else:
                            try:
                                cf = torch.compile(reference)
                                rms = graph_ms(lambda cf=cf, a=a: cf(*a))
                                row.update(ref_compiled_ms=round(rms, 4), speedup_vs_ref=round(rms / row["ours_ms"], 2))
                            except Exception as e:  # a peer that fails keeps the row, with the reason
                                row["ref_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                                torch.cuda.synchronize()
                        show(row)
                    i += 1
                    dump()
                del runs
                if DEV == "cuda":
                    torch.cuda.empty_cache()
    dump()
    print("wrote", path)


if __name__ == "__main__":
    main()
