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
    python benchmarks/moe_kernels.py --shapes dsv3_layer --recipes fp8_rowwise,mxfp8/128 --sweep --no-compile
--shapes / --recipes pick rows; mxfp8 dispatch / SwiGLU rows run with col_tile=128 (what the fused mx128 / mx32
path asks for: wgrad's block x 128 token-major operand). --sweep (after the table): kernels.moe's launch configs
(fp8_rowwise pass 1 / pass 2 per mode, mxfp8 block-128 SwiGLU warps and MODE 3 halves) timed one change at a
time against the defaults at the first shape; "best" per pass is what to set in kernels/moe/triton.py.
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
from benchmarks.cuda_timing import graph_ms  # noqa: E402
from kernels.moe import reference as ref  # noqa: E402

SHAPES = {"dsv3_layer": (16384, 7168, 2048, 8, 2), "llama_moe": (8192, 4096, 2816, 8, 2)}  # N, D, H, E, k
RECIPES = [("mxfp8", 32, 32), ("mxfp8", 128, 128), ("fp8_rowwise", 32, 16)]  # recipe, block, token_group_align


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--budget", type=float, default=240.0, help="seconds; compiled peers stop being added after it")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--shapes", default=None, help="comma list of SHAPES keys (default: all)")
    p.add_argument("--recipes", default=None, help="comma list of fp8_rowwise, mxfp8/32, mxfp8/128 (default: all)")
    p.add_argument("--sweep", action="store_true", help="time alternative launch configs (see the docstring)")
    return p.parse_args()


ARGS = parse()
DEV = "cpu" if ARGS.smoke else "cuda"
if ARGS.smoke:
    SHAPES = {"tiny": (24, 128, 128, 4, 2)}
elif ARGS.shapes:
    SHAPES = {k: SHAPES[k] for k in ARGS.shapes.split(",")}
if ARGS.recipes:
    _want = ARGS.recipes.split(",")
    RECIPES = [r for r in RECIPES if (r[0] if r[0] == "fp8_rowwise" else f"{r[0]}/{r[1]}") in _want]


def timed_ms(fn, calls=10):
    """ms per call: benchmarks.cuda_timing.graph_ms (CUDA graph of `calls` launches); smoke: one wall-clock call."""
    fn()
    if DEV == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return graph_ms(fn, calls)


def copy_ms(nbytes):
    """The same byte count moved by a device-to-device copy (half read, half written)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return timed_ms(lambda: dst.copy_(src))


def out_bytes(P, C, E, recipe):
    scales = (2 * P * C // 32) if recipe == "mxfp8" else 4 * (P + E * C)
    return 2 * P * C + scales


def reread_bytes(shape, op, P):
    """fp8_rowwise's second read of its inputs (pass 2): what its floor adds to the one-read byte count."""
    N, D, H, E, k = SHAPES[shape]
    return {"dispatch_quantize": 2 * N * k * D, "combine_backward": 2 * N * k * D, "swiglu_quantize": 2 * P * 2 * H,
            "swiglu_quantize_backward": 2 * P * 3 * H}.get(op, 0)


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
    ct = 128 if recipe == "mxfp8" else 1  # the fused mxfp8 path's x^T / a^T tiles

    def with_ct(f):
        return lambda *a: f(*a, col_tile=ct)

    return P, [
        ("dispatch_quantize", with_ct(km.dispatch_quantize), with_ct(ref.dispatch_quantize_reference),
         (x, plan.src, plan.offs, recipe, block), 2 * R * D + idx + out_bytes(P, D, E, recipe)),
        ("combine_backward", km.combine_backward, ref.combine_backward_reference,
         (dout, y, plan.pos, w, plan.src, plan.offs, recipe, block),
         2 * N * D + 2 * R * D + idx + 12 * R + out_bytes(P, D, E, recipe) + 4 * R),
        ("swiglu_quantize", with_ct(km.swiglu_quantize), with_ct(ref.swiglu_quantize_reference),
         (h13, plan.offs, recipe, block),
         2 * P * 2 * H + out_bytes(P, H, E, recipe)),
        ("swiglu_quantize_backward", km.swiglu_quantize_backward, ref.swiglu_quantize_backward_reference,
         (da, h13, plan.offs, recipe, block), 2 * P * H + 2 * P * 2 * H + out_bytes(P, 2 * H, E, recipe)),
    ] + ([("combine", km.combine, ref.combine_reference, (y, plan.pos, w), 2 * R * D + 12 * R + 2 * N * D)]
         if (recipe, block) == ("mxfp8", 32) else [])


def km_plan(experts, E, align):
    from titan_fp8.models.moe import dispatch_plan
    return dispatch_plan(experts, E, align)


# --sweep: alternatives to kernels/moe/triton.py's defaults (one change at a time; no spills in ptxas -v sm_90a
# unless noted there)
F8_AMAX_ALT = {0: [(32, 128, 8, 4), (64, 256, 4, 8), (32, 256, 4, 4)],
               1: [(32, 64, 8, 4), (32, 256, 8, 8), (32, 128, 4, 4)],
               2: [(16, 128, 8, 4), (32, 64, 8, 4), (32, 128, 8, 8)],
               3: [(16, 64, 8, 4), (32, 32, 8, 4), (32, 64, 8, 8)]}
F8_QUANT_ALT = {0: [(32, 128, 2), (64, 128, 4), (32, 256, 8)],
                1: [(32, 128, 2), (64, 128, 4), (32, 256, 8)],
                2: [(32, 128, 4), (16, 64, 4), (32, 64, 2)],
                3: [(32, 32, 4), (16, 64, 4), (32, 64, 8)]}
MX_ALT = {("col_tile", 128, 2): [(128, 128, 8), (128, 128, 16)],
          ("plain", 128, 3): [(128, 128, 16, False), (128, 128, 16, True), (128, 128, 8, True)],
          ("plain", 128, 1): [(128, 128, 8, False), (128, 128, 16, False)]}


def sweep(rows, dump):
    """Time launch-config alternatives at the first shape (module docstring); appends rows kind='sweep'."""
    from kernels.moe import triton as kt
    shape = next(iter(SHAPES))
    print(f"-- sweep at {shape}: kernels.moe launch configs (ms per call; * = the default) --", flush=True)

    def run(table, key, cands, fn, label):
        default = table[key]
        results = []
        for cfg in [default] + [c for c in cands if c != default]:
            table[key] = cfg
            try:
                ms = timed_ms(fn)
            except Exception as e:  # a config that fails to compile or launch is reported, not fatal
                ms, err = float("nan"), f"{type(e).__name__}: {str(e)[:120]}"
            else:
                err = None
            results.append((cfg, ms))
            rows.append(dict(kind="sweep", shape=shape, what=label, config=list(cfg), default=cfg == default,
                             ms=round(ms, 4), error=err))
            print(f"  {label:34} {str(cfg):24} {ms:8.4f}{' *' if cfg == default else ''}{'  ' + err if err else ''}",
                  flush=True)
        table[key] = default
        best = min((r for r in results if r[1] == r[1]), key=lambda r: r[1], default=None)
        if best is not None:
            print(f"  {label:34} best {best[0]} {best[1]:.4f} ms (default {results[0][1]:.4f})", flush=True)
        dump()

    for recipe, block, align in RECIPES:
        _, runs = cases(shape, recipe, block, align)
        fns = [(lambda f=f, a=a: f(*a)) for _, f, _, a, _ in runs[:4]]  # index = kernels.moe MODE
        if recipe == "fp8_rowwise":
            for mode in range(4):
                run(kt.F8_AMAX_CONFIGS, mode, F8_AMAX_ALT[mode], fns[mode], f"fp8_rowwise pass1 mode {mode}")
                run(kt.F8_QUANT_CONFIGS, mode, F8_QUANT_ALT[mode], fns[mode], f"fp8_rowwise pass2 mode {mode}")
        else:
            for (kind, blk, mode), cands in MX_ALT.items():
                if blk == block:
                    table = kt.MX_COL_TILE_CONFIGS if kind == "col_tile" else kt.MX_CONFIGS
                    run(table, (blk, mode), cands, fns[mode], f"mxfp8/{blk} {kind} mode {mode}")
        del runs
        torch.cuda.empty_cache()


def main():
    args = ARGS
    assert torch.cuda.is_available() or args.smoke, "benchmarks/moe_kernels.py needs a GPU (or --smoke)"
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.recompile_limit = 256
    t0 = time.time()
    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu-interpreter-smoke"
    commit = os.environ.get("TITAN_COMMIT", "")  # a device run gets a copy without .git: the caller says which
    if not commit and os.path.isdir(os.path.join(ROOT, ".git")):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
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
              f"{row['pct_of_copy']:6.1f}% {row.get('pct_of_copy_floor', float('nan')):6.1f}% "
              f"{row.get('ref_compiled_ms', float('nan')):8.3f} "
              f"{row.get('speedup_vs_ref', float('nan')):8.2f} {row.get('ref_error', '')}", flush=True)

    header = (f"{'shape':11} {'op':25} {'recipe':12} {'MB':>7} {'ours ms':>8} {'% copy':>7} {'floor%':>7} "
              f"{'ref ms':>8} {'ref/ours':>8}")
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
                        ms = timed_ms(lambda f=ours, a=a: f(*a))
                        cms = copy_ms(nbytes)
                        rows.append(dict(shape=shape, op=name, recipe=recipe, block=block if recipe == "mxfp8" else None,
                                         P=P, bytes=nbytes, ours_ms=round(ms, 4),
                                         ours_TBps=round(nbytes / ms / 1e9, 3), copy_ms=round(cms, 4),
                                         pct_of_copy=round(100 * cms / ms, 1)))
                        if recipe == "fp8_rowwise":  # against its floor: inputs read twice
                            floor = nbytes + reread_bytes(shape, name, P)
                            rows[-1].update(floor_bytes=floor,
                                            pct_of_copy_floor=round(100 * cms / ms * floor / nbytes, 1))
                        show(rows[-1])
                    else:
                        row = rows[i]
                        if time.time() - t0 > args.budget:
                            row["ref_error"] = "skipped: time budget"
                        else:
                            try:
                                cf = torch.compile(reference)
                                rms = timed_ms(lambda cf=cf, a=a: cf(*a))
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
    if args.sweep:
        sweep(rows, dump)
    print("wrote", path)


if __name__ == "__main__":
    main()
