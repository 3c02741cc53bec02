"""The expert op's quantizer launches (kernels/grouped_gemm/quant_triton.py to_mxfp8_blocked_rowcol) under each launch
configuration, round-robin in one run: rowcol_launch's choice ("default") and every program tile
(rows x columns of x per program, 32 / 64 / 128 each, those that hold the layout's scale regions) at 1 / 2 / 4 / 8
warps ("t64x128w2": 64 x 128, 2 warps).

Per shape (E = 8 experts x 8192 tokens; dsv3_up K, N = 7168, 2048; dsv3_down 2048, 7168; llama_up 4096, 2816) and
recipe, the four launches the whole op makes (titan_fp8/float8/experts.py):
  mx128: x rows (1x128) + 128x128 x^T tiles; dO rows + 1x128 dO^T; w 128x128 tiles; W^T 128x128 tiles
  mx32:  x rows (1x32) + 32x128 x^T tiles;   dO rows + 1x32 dO^T;  w 128x32 regions; W^T 32x128 regions
x and dO have their last 100 rows past `limit` (padding). Every variant's outputs must equal the default's byte for
byte (checked before timing). TB/s = bytes read + written; "copy" is x.clone() for scale. Prints a table, the
fastest configuration per layout (summed over the shapes) and, per recipe and shape, the four launches summed;
writes benchmarks/results/quant_rowcol_launch-*.json (or under $OUT).

    python benchmarks/quant_rowcol_launch.py [--shapes dsv3_up,...] [--recipes mx128,mx32] [--warps 1,2,4,8]
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from benchmarks.results_json import write_results  # noqa: E402
from kernels.grouped_gemm import quant_triton  # noqa: E402

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192


def launches():
    """{(recipe, launch): (operand, kwargs, bytes read + written per element of the operand)}."""
    out = {}
    for rec, blk in (("mx128", 128), ("mx32", 32)):
        out[(rec, "x rows+col tiles")] = ("x", dict(row_block=blk, col_block=blk, col_tile=128, limit=True), 4)
        out[(rec, "dO rows+cols")] = ("dO", dict(row_block=blk, col_block=blk, col_tile=1, limit=True), 4)
        out[(rec, "w tiles")] = ("w", dict(row_block=blk, row_tile=128, do_col=False), 3)
        out[(rec, "W^T tiles")] = ("w", dict(col_block=blk, col_tile=128, do_row=False), 3)
    return out


def layout(kw):
    """_run's positional layout arguments from to_mxfp8_blocked_rowcol's keywords."""
    return (kw.get("row_block", 128), kw.get("row_tile", 1), kw.get("col_block", 128), kw.get("col_tile", 1),
            kw.get("do_row", True), kw.get("do_col", True))


def configs(kw, warps):
    """{name: None (the default) or ((rows, columns), warps)} for every program tile that holds the layout."""
    out = {"default": None}
    for bm in (128, 64, 32):
        for bk in (128, 64, 32):
            try:
                quant_triton._check_tile((bm, bk), *layout(kw))
            except ValueError:
                continue
            for w in warps:
                if bm * bk // (w * 32) >= 16:  # at least 16 elements a thread
                    out[f"t{bm}x{bk}w{w}"] = ((bm, bk), w)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--recipes", default="mx128,mx32")
    ap.add_argument("--warps", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    warps = [int(w) for w in args.warps.split(",")]
    rows, M = [], E * TPE
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        t = {"x": torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
             "dO": torch.randn(M, N, device="cuda", dtype=torch.bfloat16),
             "w": torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02}
        lim = torch.tensor([M - 100], device="cuda", dtype=torch.int32)
        fns, nbytes = {("copy", "x", "copy"): [lambda: t["x"].clone()]}, {("copy", "x", "copy"): 4 * M * K}
        for (rec, launch), (name, kw, per_el) in launches().items():
            if rec not in args.recipes.split(","):
                continue
            kw = dict(kw)
            if kw.pop("limit", False):
                kw["limit"] = lim
            ref = None
            for v, cfg in configs(kw, warps).items():
                def call(kw=kw, x=t[name], cfg=cfg):
                    if cfg is None:
                        return quant_triton.to_mxfp8_blocked_rowcol(x, **kw)
                    x3 = x if x.ndim == 3 else x.unsqueeze(0)
                    return quant_triton._run(x3, kw.get("limit"), *layout(kw), num_warps=cfg[1], tile=cfg[0])
                got = [o.reshape(-1).view(torch.uint8) for o in call() if o is not None and o.numel()]
                if ref is None:
                    ref = got
                elif not (len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref))):
                    raise SystemExit(f"{shape} {rec} {launch} {v}: bytes differ from the default's")
                fns[(rec, launch, v)] = [call]
                nbytes[(rec, launch, v)] = per_el * t[name].numel()
            ref = got = None
        ms = interleaved_ms(fns, rounds=args.rounds)
        base = {(r, l): m for (r, l, v), (m, _) in ms.items() if v == "default"}
        for (rec, launch, v), (m, iqr) in ms.items():
            r = dict(shape=shape, recipe=rec, launch=launch, variant=v, ms=round(m, 4),
                     TBps=round(nbytes[(rec, launch, v)] / m / 1e9, 3), iqr=round(iqr, 3))
            if (rec, launch) in base:
                r["vs_default"] = round(base[(rec, launch)] / m, 3)
            rows.append(r)
            print(f"{shape:9s} {rec:5s} {launch:18s} {v:8s} {m:8.4f} ms {r['TBps']:6.3f} TB/s "
                  f"x default {r.get('vs_default', ''):>6} iqr {r['iqr']}", flush=True)
        t = fns = None
        torch.cuda.empty_cache()
    best = {}
    for r in rows:
        if r["recipe"] != "copy":
            best.setdefault((r["recipe"], r["launch"]), {}).setdefault(r["variant"], 0.0)
            best[(r["recipe"], r["launch"])][r["variant"]] += r["ms"]
    print("\nfastest configuration per launch (ms summed over the shapes):")
    for (rec, launch), v in best.items():
        top = sorted(v, key=v.get)[:4]
        print(f"  {rec:5s} {launch:18s} default {v['default']:.3f}; " + ", ".join(f"{k} {v[k]:.3f}" for k in top))
    print("\nthe op's four launches summed (ms), default configuration:")
    for shape in args.shapes.split(","):
        for rec in args.recipes.split(","):
            s = sum(r["ms"] for r in rows if r["shape"] == shape and r["recipe"] == rec and r["variant"] == "default")
            print(f"  {shape:9s} {rec:5s} {s:.3f}")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "command": "python " + " ".join(sys.argv),
            "E": E, "tokens_per_expert": TPE}
    print("wrote", write_results("quant_rowcol_launch", meta, rows))


if __name__ == "__main__":
    main()
