"""A/B of kernels/moe's mxfp8 block-128 quantizer (_mx_kernel) launch variants against a saved copy of the old
module, in one device call: every candidate's outputs byte for byte against the old kernel's (GPU-sized data with
zero / NaN / inf / subnormal / huge entries), then CUDA-graph time of old and new side by side, % of a copy of
the same bytes. Also times kernels/grouped_gemm/quant_triton's _blocked_rowcol_kernel on the dsv3_layer expert
weights (the fused mx128 path's weight quantizer) against a copy of its bytes.

    python benchmarks/moe_kernels_mx_ab.py --base kernels/moe/_triton_base.py --out DIR [--shapes ...] [--modes ...]

--base: a copy of the old kernels/moe/triton.py placed inside kernels/moe (it imports .reference); candidates are
(block, mode) -> (warps, AMAX_FIRST) set through kernels.moe.triton's MX_CONFIGS / MX_COL_TILE_CONFIGS /
MX_AMAX_FIRST. Modes 0 (dispatch) and 2 (SwiGLU) run with col_tile=128, 1 (combine backward) and 3 (SwiGLU backward,
HALVES) with col_tile=1: what the fused mx128 path asks for. Writes DIR/moe_kernels_mx_ab-<device>-<date>.json.
"""
import argparse
import datetime
import importlib.util
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SMOKE = "--smoke" in sys.argv  # CPU, Triton interpreter, tiny shape: checks the script runs, no timing claims
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
DEV = "cpu" if SMOKE else "cuda"

from benchmarks.cuda_timing import graph_ms as _graph_ms  # noqa: E402
from kernels.moe import triton as kt  # noqa: E402
from titan_fp8.models.moe import dispatch_plan  # noqa: E402

SHAPES = {"dsv3_layer": (16384, 7168, 2048, 8, 2), "llama_moe": (8192, 4096, 2816, 8, 2)}  # N, D, H, E, k
if SMOKE:
    SHAPES = {"smoke": (160, 256, 256, 4, 2)}


def graph_ms(fn, calls):
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return _graph_ms(fn, calls)
OPS = {0: "dispatch_quantize", 1: "combine_backward", 2: "swiglu_quantize", 3: "swiglu_quantize_backward"}
COL_TILE = {0: 128, 1: 1, 2: 128, 3: 1}
# (block, mode) -> [(warps, AMAX_FIRST[, SIGMOID[, HALVES]]), ...]; the first is what kernels/moe/triton.py now
# launches; SIGMOID (kernels.moe.triton.SIGMOID, SwiGLU's modes) defaults to "fast"; HALVES (MODE 3, col_tile 1:
# MX_CONFIGS' flag) to the launch config's
CANDIDATES = {
    (128, 0): [(8, True), (8, False)],
    (128, 1): [(8, True), (8, False)],
    (128, 2): [(16, False), (16, False, "exact"), (8, False), (16, True)],
    (128, 3): [(8, False), (8, False, "exact"), (16, False), (8, True), (8, False, "fast", False),
               (16, False, "fast", False)],
    (32, 0): [(2, False)],
    (32, 2): [(4, False), (4, False, "exact"), (8, False)],
    (32, 3): [(4, False), (4, False, "exact"), (8, False), (4, False, "fast", True), (8, False, "fast", True)],
}


def load_base(path):
    spec = importlib.util.spec_from_file_location("kernels.moe._triton_base", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def data(shape, seed=0):
    N, D, H, E, k = SHAPES[shape]
    g = torch.Generator(device=DEV).manual_seed(seed)
    logits = torch.randn(N, E, device=DEV, generator=g) + torch.linspace(0, 2, E, device=DEV)
    plan = dispatch_plan(logits.topk(k, dim=1).indices, E, 128)
    P = plan.src.shape[0]

    def rnd(*s):
        x = torch.randn(*s, device=DEV, generator=g) * torch.logspace(-4, 4, s[-1], device=DEV)
        x[1] = 0
        x[3, 5], x[4, 7], x[6, 8], x[7, 9] = float("nan"), float("-inf"), 1e-39, 3e38
        x[min(300, s[0] - 1), :64] = 1e-41  # a subnormal-only block
        return x.to(torch.bfloat16)

    w = torch.rand(N, k, device=DEV, generator=g)
    return plan, P, dict(x=rnd(N, D), dout=rnd(N, D), y=rnd(P, D), h13=rnd(P, 2 * H) / 1e3, da=rnd(P, H), w=w)


def call(mod, block, mode, shape, plan, P, t):
    N, D, H, E, k = SHAPES[shape]
    kw = dict(offs=plan.offs, recipe="mxfp8", block=block, who="ab", col_tile=COL_TILE[mode])
    if mode == 0:
        return lambda: mod.quantize_values(0, t["x"], plan.src, N=N, P=P, C=D, H=0, K=1, **kw)
    if mode == 1:
        return lambda: mod.quantize_values(1, t["dout"], plan.src, plan.pos, t["w"], t["y"], N=N, P=P, C=D, H=0, K=k,
                                           **kw)
    if mode == 2:
        return lambda: mod.quantize_values(2, t["h13"], N=0, P=P, C=H, H=H, K=1, **kw)
    return lambda: mod.quantize_values(3, t["da"], t["h13"], N=0, P=P, C=2 * H, H=H, K=1, **kw)


def nbytes(mode, shape, P):
    N, D, H, E, k = SHAPES[shape]
    R = N * k
    out = lambda C: 2 * P * C + 2 * P * C // 32  # noqa: E731
    idx = 8 * P + 4 * E
    return {0: 2 * R * D + idx + out(D), 1: 2 * N * D + 2 * R * D + idx + 12 * R + out(D) + 4 * R,
            2: 2 * P * 2 * H + out(H), 3: 2 * P * H + 2 * P * 2 * H + out(2 * H)}[mode]


def copy_ms(n):
    src = torch.empty(n // 2, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return graph_ms(lambda: dst.copy_(src), 10)


def set_config(block, mode, cfg):
    warps, first = cfg[:2]
    kt.SIGMOID = cfg[2] if len(cfg) > 2 else "fast"
    if COL_TILE[mode] > 1:
        bm, bd, _ = kt.MX_COL_TILE_CONFIGS[block, mode]
        kt.MX_COL_TILE_CONFIGS[block, mode] = (bm, bd, warps)
    else:
        bm, bd, _, halves = kt.MX_CONFIGS[block, mode]
        kt.MX_CONFIGS[block, mode] = (bm, bd, warps, cfg[3] if len(cfg) > 3 else halves)
    if first:
        kt.MX_AMAX_FIRST.add((block, mode))
    else:
        kt.MX_AMAX_FIRST.discard((block, mode))


def identical(a, b):
    """Byte equality of two output tuples (q, s, qt, st, dots): [(output, fraction of its bytes that differ)] for
    the outputs that differ; dots compared as bits too (reported apart)."""
    bad = []
    for i in range(4):
        x, y = a[i].contiguous().view(torch.uint8), b[i].contiguous().view(torch.uint8)
        if x.shape != y.shape:
            bad.append((i, 1.0))
        elif not torch.equal(x, y):
            bad.append((i, float((x != y).float().mean())))
    dots_same = None
    if a[4] is not None:
        dots_same = torch.equal(a[4].view(torch.int32), b[4].view(torch.int32))
    return bad, dots_same


def rowcol_rows(rows, dump):
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    E, D, H = 8, 7168, 2048
    for name, shp in (("w13", (E, 2 * H, D)), ("w2", (E, D, H))):
        w = torch.randn(*shp, device=DEV, dtype=torch.bfloat16)
        n = w.numel()
        for what, kw in (("row 128x128 (fwd)", dict(row_block=128, row_tile=128, do_col=False)),
                         ("col 128x128 (dgrad)", dict(col_block=128, col_tile=128, do_row=False))):
            b = 2 * n + n + n // 32
            cms = copy_ms(b)
            for warps in (8, 16):
                ms = graph_ms(lambda: to_mxfp8_blocked_rowcol(w, num_warps=warps, **kw), 10)
                rows.append(dict(kind="blocked_rowcol", weight=name, shape=list(shp), what=what, warps=warps,
                                 ms=round(ms, 4), copy_ms=round(cms, 4), pct_of_copy=round(100 * cms / ms, 1)))
                print(f"blocked_rowcol {name} {str(shp):18} {what:20} {warps:2}w {ms:8.4f} ms "
                      f"{100 * cms / ms:6.1f}% of copy", flush=True)
                dump()
        del w
        DEV == "cuda" and torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="dsv3_layer,llama_moe")
    ap.add_argument("--keys", default=None, help="comma list of block/mode (default: all of CANDIDATES)")
    ap.add_argument("--no-rowcol", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    kb = load_base(args.base)
    keys = [tuple(int(v) for v in k.split("/")) for k in args.keys.split(",")] if args.keys else list(CANDIDATES)
    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu-smoke"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"moe_kernels_mx_ab-{dev.lower().replace(' ', '-')}-"
                                  f"{datetime.date.today().isoformat()}.json")
    rows, t0 = [], time.time()
    defaults = dict(col=dict(kt.MX_COL_TILE_CONFIGS), plain=dict(kt.MX_CONFIGS), amax_first=set(kt.MX_AMAX_FIRST),
                    sigmoid=kt.SIGMOID)

    def dump():
        with open(path, "w") as f:
            json.dump(dict(benchmark="moe_kernels_mx_ab", device=dev, torch=torch.__version__,
                           triton=__import__("triton").__version__, command=" ".join(sys.argv),
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           defaults=dict(col={str(k): v for k, v in defaults["col"].items()},
                                         plain={str(k): v for k, v in defaults["plain"].items()},
                                         amax_first=sorted(str(k) for k in defaults["amax_first"])),
                           seconds=round(time.time() - t0, 1), rows=rows), f, indent=1)

    print(f"{'shape':11} {'op':25} {'block':>5} {'cand (warps, amax_first)':26} {'ms':>8} {'% copy':>7} {'x old':>6} "
          f"{'bytes':>6}", flush=True)
    for shape in (list(SHAPES) if SMOKE else args.shapes.split(",")):
        plan, P, t = data(shape)
        for block, mode in keys:
            n = nbytes(mode, shape, P)
            cms = copy_ms(n)
            fn_old = call(kb, block, mode, shape, plan, P, t)
            ref = fn_old()
            old_ms = graph_ms(fn_old, 10)
            rows.append(dict(shape=shape, op=OPS[mode], block=block, cand="old", ms=round(old_ms, 4),
                             copy_ms=round(cms, 4), pct_of_copy=round(100 * cms / old_ms, 1), bytes=n))
            print(f"{shape:11} {OPS[mode]:25} {block:5} {'old':26} {old_ms:8.4f} {100 * cms / old_ms:6.1f}%",
                  flush=True)
            for cfg in CANDIDATES[block, mode]:
                set_config(block, mode, cfg)
                try:
                    fn = call(kt, block, mode, shape, plan, P, t)
                    got = fn()
                    bad, dots_same = identical(got, ref)
                    del got
                    ms = graph_ms(fn, 10)
                    err = None
                except Exception as e:  # a candidate that fails to compile / launch is reported, not fatal
                    ms, bad, dots_same, err = float("nan"), None, None, f"{type(e).__name__}: {str(e)[:200]}"
                finally:
                    kt.MX_COL_TILE_CONFIGS.update(defaults["col"])
                    kt.MX_CONFIGS.update(defaults["plain"])
                    kt.MX_AMAX_FIRST.clear()
                    kt.MX_AMAX_FIRST.update(defaults["amax_first"])
                    kt.SIGMOID = defaults["sigmoid"]
                same = "" if bad is None else ("same" if not bad else
                                               "DIFF " + " ".join(f"out{i}:{frac:.1e}" for i, frac in bad))
                if dots_same is not None:
                    same += "" if dots_same else " dots-differ"
                rows.append(dict(shape=shape, op=OPS[mode], block=block, cand=list(cfg), ms=round(ms, 4),
                                 copy_ms=round(cms, 4), pct_of_copy=round(100 * cms / ms, 1),
                                 x_old=round(old_ms / ms, 3), bytes_identical=bad == [], differing_outputs=bad,
                                 dots_bit_identical=dots_same, error=err))
                print(f"{shape:11} {OPS[mode]:25} {block:5} {str(cfg):26} {ms:8.4f} {100 * cms / ms:6.1f}% "
                      f"{old_ms / ms:6.3f} {same}{'  ' + err if err else ''}", flush=True)
                dump()
            del ref
            DEV == "cuda" and torch.cuda.empty_cache()
        del t, plan
        DEV == "cuda" and torch.cuda.empty_cache()
    if not (args.no_rowcol or SMOKE):
        rowcol_rows(rows, dump)
    dump()
    print("wrote", path)


if __name__ == "__main__":
    main()
