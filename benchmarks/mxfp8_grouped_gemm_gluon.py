"""mx32 grouped GEMMs: the Gluon kernels (kernels/grouped_gemm/gluon_mx.py) against the Triton mx32 kernels and
bf16 torch._grouped_mm, all in the same run, at MoE expert shapes.

  PYTHONUNBUFFERED=1 python benchmarks/mxfp8_grouped_gemm_gluon.py [--shapes dsv3_up,...] [--routings even,skewed]
      [--cuda default]
      [--configs default,sync,...] [--budget-s 240]

mx32 = plain 1x32 E8M0 scales on activations/gradients along the reduction axis, weights in 128x128 tiles, x^T
(wgrad) in 128-row tiles: the promotion factor is a per-row vector, applied after every 32 of the reduction.
E = 8 experts x 8192 tokens, (K, N) as in benchmarks/mxfp8_grouped_gemm.py. Kernel time only (quantization
excluded), every variant of a pass timed round-robin (benchmarks/cuda_timing.interleaved_ms: one clock state for
all, the order rotating each round; alone at an H100's power cap the Gluon kernels run ~12% higher clocks than
amid others, session 15) or with --timing steady each at the clock it holds alone (steady_ms; --smi-log adds each
variant's clock), two rotating input sets. wgrad writes dW in bf16 as the experts op does for bf16 weights
and as the bf16 peer does (--wgrad-out fp32: sessions <= 24). Each Gluon config's output is compared
with the float64 reference (default config) or with the default config's output (the others).
Writes mxfp8_grouped_gemm_gluon-<device>-<date>.json to $OUT or benchmarks/results/.
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mxfp8_grouped_gemm import SHAPES, E, TPE, rel, routings  # noqa: E402
from cuda_timing import add_timing_args, make_timer  # noqa: E402

from kernels.grouped_gemm import (  # noqa: E402
    grouped_mm_dgrad_reference,
    grouped_mm_fprop_reference,
    grouped_mm_wgrad_reference,
    mxfp8_grouped_mm_dgrad,
    mxfp8_grouped_mm_fprop,
    mxfp8_grouped_mm_wgrad,
)
from kernels.grouped_gemm.gluon_mx import launch_nt, launch_wgrad  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402

# name: (BM|BN, 128, STAGES, GROUP, MODE, U, SUBK, num_warps); MODE 0 = wait for every wgmma (Triton's schedule),
# 1/2 = next wgmma in flight during the promotion (fresh zeros / reused registers), U = steps per unrolled block,
# SUBK = steps of 32 per TMA stage
CONFIGS = {  # name: fprop/dgrad config or (fprop/dgrad config, wgrad config)
    "default": (None, None),
    "ws2_m2": ((128, 128, 4, 8, 2, 8, 4, 4, 2), (128, 128, 4, 8, 2, 8, 4, 8, 1)),
    "ws2_m1_u4": ((128, 128, 4, 8, 1, 4, 4, 4, 2), (128, 128, 4, 8, 1, 4, 4, 8, 1)),
    "ws1_m1": (128, 128, 4, 8, 1, 8, 4, 8, 1),
    "plain_m2": (128, 128, 4, 8, 2, 8, 4, 8),
    "bm64_m2": (64, 128, 4, 8, 2, 8, 4, 4),
    "sync": (128, 128, 4, 8, 0, 8, 4, 8),
    # MODE 3: static ring (blocks of STAGES stages unrolled), one int32 of scales per row and stage
    "m3": ((128, 128, 4, 8, 3, 16, 4, 4, 2), (128, 128, 4, 8, 3, 16, 4, 8, 1)),
    # wgrad with two 4-warp consumers (WS=2), MODE 2 / MODE 3 (fprop/dgrad: the m3 config)
    "wg2_m2": ((128, 128, 4, 8, 3, 16, 4, 4, 2), (128, 128, 4, 8, 2, 8, 4, 4, 2)),
    "wg2_m3": ((128, 128, 4, 8, 3, 16, 4, 4, 2), (128, 128, 4, 8, 3, 16, 4, 4, 2)),
    # fprop/dgrad MODE 3 on the persistent grid (one CTA per SM), wgrad WS=2 MODE 2
    "m3p": ((128, 128, 4, 8, 3, 16, 4, 4, 2, 1), (128, 128, 4, 8, 2, 8, 4, 4, 2)),
    # MODE 4: MODE 2's loop (blocks of U steps) with one int32 of scales per row and stage; wgrad WS=2
    "m4": ((128, 128, 4, 8, 4, 8, 4, 4, 2), (128, 128, 4, 8, 4, 8, 4, 4, 2)),
    "m4u4": ((128, 128, 4, 8, 4, 4, 4, 4, 2), (128, 128, 4, 8, 4, 4, 4, 4, 2)),
    # MODE 4 on the persistent grid; wgrad WS=2 MODE 2
    "m4p": ((128, 128, 4, 8, 4, 8, 4, 4, 2, 1), (128, 128, 4, 8, 2, 8, 4, 4, 2)),
    # the defaults before device call 2 (fprop/dgrad MODE 2 WS=2, wgrad MODE 1 WS=1)
    "old": ((128, 128, 4, 8, 2, 8, 4, 4, 2), (128, 128, 4, 8, 1, 8, 4, 8, 1)),
    # persistent MODE 4 with 16-step blocks (wgrad: MODE 4 U=4) / with 5 stages (wgrad: MODE 2 WS=2)
    "m4u16p": ((128, 128, 4, 8, 4, 16, 4, 4, 2, 1), (128, 128, 4, 8, 4, 4, 4, 4, 2)),
    "m4s5p": ((128, 128, 5, 8, 4, 8, 4, 4, 2, 1), (128, 128, 4, 8, 2, 8, 4, 4, 2)),
    # candidates of 2026-11-25 (CPU-prepared; SASS counts per 32-step per consumer warp in NOTES.md, from
    # benchmarks/gluon_sass_count.py): MODE 5 = the defaults with the stage-wise E8M0 decode (one PRMT per step)
    "m5p": ((128, 128, 4, 8, 5, 8, 4, 4, 2, 1), (128, 128, 4, 8, 5, 8, 4, 4, 2)),
    # one 8-warp consumer (WS=1): both warpgroups run one copy of the mainloop (half the i-cache footprint)
    "m5w1p": ((128, 128, 4, 8, 5, 8, 4, 8, 1, 1), (128, 128, 4, 8, 5, 8, 4, 8, 1)),
    "m5w1u16p": ((128, 128, 4, 8, 5, 16, 4, 8, 1, 1), (128, 128, 4, 8, 5, 16, 4, 8, 1)),
    # MODE 6 = static ring (16-step blocks, static slots: fewer descriptor instructions) + the new decode, one copy;
    # persistent only where K % 512 == 0 (else the plain grid); wgrad: MODE 5 U=16 WS=1 (same code: static slots)
    "m6w1p": ((128, 128, 4, 8, 6, 16, 4, 8, 1, 1), (128, 128, 4, 8, 5, 16, 4, 8, 1)),
    # the defaults of session 23 (wgrad MODE 5, U = 16)
    "s23": ((128, 128, 4, 8, 5, 8, 4, 4, 2, 1), (128, 128, 4, 8, 5, 16, 4, 8, 1)),
    # session 24, MODE 10 (the wgrad default of sessions 24-25): A's E8M0 scales as fp32 factors (e8m0_table, made
    # inside each launch and timed with it) that ride with each TMA stage into shared memory: no A words, no A decode
    "m10": ((128, 128, 4, 8, 10, 8, 4, 4, 2, 1), (128, 128, 4, 8, 10, 16, 4, 8, 1)),
    # prepared without a GPU in session 24 (SASS per step: 82.6 and 92.4 against that default's 96.2): MODE 11 =
    # MODE 6's static ring with MODE 10's factors, one 8-warp consumer copy (the 16-step body fits the i-cache),
    # persistent (any K since session 25: each tile's last ring round padded); MODE 10 with one 8-warp consumer, U = 8
    "m11w1p": ((128, 128, 4, 8, 11, 16, 4, 8, 1, 1), None),
    "m10w1p": ((128, 128, 4, 8, 10, 8, 4, 8, 1, 1), None),
    # MODE 12 = MODE 11 with B's factors as fp32 (a [tiles, steps] table, 4 per stage in one 16-byte load): no
    # scale decode left in the loop (SASS per step: fprop/dgrad 77.5 vs 81.1, wgrad 78.1 vs 83.2)
    "m12": ((128, 128, 4, 8, 12, 16, 4, 8, 1, 1), (128, 128, 4, 8, 12, 16, 4, 8, 1)),
    # the defaults with 4 / 16 row (column) tiles per group of the tile order instead of 8 (L2 reuse)
    "g4": ((128, 128, 4, 4, 11, 16, 4, 8, 1, 1), (128, 128, 4, 4, 10, 16, 4, 8, 1)),
    "g16": ((128, 128, 4, 16, 11, 16, 4, 8, 1, 1), (128, 128, 4, 16, 10, 16, 4, 8, 1)),
    # session 25: wgrad MODE 11 (static ring) on the plain grid (a persistent wgrad grid, MODE 10 or 11, measured
    # 0.93-0.99x the default and is gone)
    "w11": (None, (128, 128, 4, 8, 11, 16, 4, 8, 1)),
    # MODE 11 with a fifth ring stage (20-step static blocks; ncu: the wgrad consumer waits on the TMA more than
    # fprop's does)
    "m11s5": ((128, 128, 5, 8, 11, 16, 4, 8, 1, 1), (128, 128, 5, 8, 11, 16, 4, 8, 1)),
    # the defaults after session 25's call 7 (fprop/dgrad MODE 11, wgrad MODE 10 with 2-stage tail blocks)
    "s25a": ((128, 128, 4, 8, 11, 16, 4, 8, 1, 1), (128, 128, 4, 8, 10, 16, 4, 8, 1)),
    # the defaults of session 24 (fprop/dgrad MODE 5 with two 4-warp consumers, persistent; wgrad MODE 10)
    "s24": ((128, 128, 4, 8, 5, 8, 4, 4, 2, 1), (128, 128, 4, 8, 10, 16, 4, 8, 1)),
    # session 26: MODE 12 wgrad on the persistent grid, each CTA taking its next tile from a queue (an atomic counter)
    "w12p": (None, (128, 128, 4, 8, 12, 16, 4, 8, 1, 1)),
    # session 43: session 26's wgrad default (MODE 12, persistent tile queue) with bands of 4 / 16 / 32 / 64 row tiles
    # of dW in the tile order instead of 8 (g4/g16 above are session 25's MODE 10 wgrad); "default" now takes 32 where
    # N <= 3072 (gluon_mx.wgrad_default_config)
    "w12g4": (None, (128, 128, 4, 4, 12, 16, 4, 8, 1, 1)),
    "w12g16": (None, (128, 128, 4, 16, 12, 16, 4, 8, 1, 1)),
    "w12g32": (None, (128, 128, 4, 32, 12, 16, 4, 8, 1, 1)),
    "w12g64": (None, (128, 128, 4, 64, 12, 16, 4, 8, 1, 1)),
    # session 27: fprop/dgrad MODE 12 with the epilogue in a 2-warp storer partition
    "epi": ((128, 128, 4, 8, 12, 16, 4, 8, 1, 1, 1), None),
    # the defaults of session 13 (MODE 4: fprop/dgrad two consumers on the persistent grid, wgrad two consumers)
    "s13": ((128, 128, 4, 8, 4, 8, 4, 4, 2, 1), (128, 128, 4, 8, 4, 8, 4, 4, 2)),
}


def load_base_gluon(root):
    """The Gluon launchers of another revision: root holds its `kernels` package (e.g. `git archive REV kernels |
    tar -x -C root`), imported as `kernels_base` beside this tree's, so that both revisions run in one process."""
    import importlib
    import importlib.util
    pkg = os.path.join(os.path.abspath(root), "kernels")
    spec = importlib.util.spec_from_file_location("kernels_base", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kernels_base"] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module("kernels_base.grouped_gemm.gluon_mx")


def write_json(meta, rows):
    from benchmarks.results_json import write_results
    return write_results("mxfp8_grouped_gemm_gluon", meta, rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--routings", default="even")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--skip-triton", action="store_true", help="leave out the Triton mx32 kernels")
    ap.add_argument("--cuda", default="", help="also the CUDA C++ mx32 kernel (kernels/grouped_gemm/cuda_mx.py; "
                    "fprop and dgrad): ';'-separated compile-time variants, 'default' = the file's settings, e.g. "
                    "'default;BLOCK_STAGES=4;STAGES=4,GROUP_M=4'")
    ap.add_argument("--rep", type=int, default=None, help="ignored since session 25 (the --op section is timed "
                    "round-robin: --op-rounds); accepted so that older device scripts still run")
    ap.add_argument("--base", default="", help="a folder holding another revision's `kernels` package: also time "
                    "its Gluon launchers (variants base_<config>, --base-configs) in the same rounds")
    ap.add_argument("--base-configs", default="default", help="the configs (comma list) to time with --base")
    ap.add_argument("--passes", default="fprop,dgrad,wgrad", help="which GEMMs to time (comma list)")
    ap.add_argument("--rounds", type=int, default=50, help="timing rounds per pass (kernels)")
    ap.add_argument("--op-rounds", type=int, default=30, help="round-robin rounds of the --op section")
    ap.add_argument("--wgrad-out", default="bf16", choices=["bf16", "fp32"],
                    help="dW's dtype: bf16 = what the experts op writes for bf16 weights and what the bf16 peer "
                         "(torch._grouped_mm) writes; fp32 = the stricter setting of sessions <= 24 (twice the bytes)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    ap.add_argument("--op", default="", help="shapes (comma list) at which to also time the whole autograd op "
                    "titan_fp8.float8.experts.mxfp8_grouped_mm(granularity='mx32') fwd+bwd, quantization included, "
                    "backend triton vs gluon, against bf16 torch._grouped_mm fwd+bwd (even routing)")
    add_timing_args(ap)  # --timing steady: each variant at the clock it holds alone (cuda_timing.steady_ms)
    args = ap.parse_args()
    timer, timing = make_timer(args)
    bad = set(args.passes.split(",")) - {"fprop", "dgrad", "wgrad"}
    if bad:
        ap.error(f"--passes: unknown {sorted(bad)}; choose from fprop, dgrad, wgrad")
    torch.manual_seed(0)
    M = E * TPE
    t0 = time.time()
    meta = {
        "device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"), "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": "python " + " ".join(sys.argv), "experts": E, "tokens_per_expert": TPE,
        "timing": f"{timing}; kernels: {args.rounds} rounds, 2 rotating input sets; --op: {args.op_rounds} rounds",
        "configs": {k: CONFIGS[k] for k in args.configs.split(",")}, "wgrad_out": args.wgrad_out,
        "base": args.base or None, "base_configs": args.base_configs if args.base else None,
    }
    base = load_base_gluon(args.base) if args.base else None
    dw_dtype = torch.bfloat16 if args.wgrad_out == "bf16" else torch.float32
    print(json.dumps(meta), flush=True)
    rows = []

    def rec(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)

    for shape in args.shapes.split(","):
        if time.time() - t0 > args.budget_s:
            rec(shape=shape, error="skipped: time budget")
            continue
        K, N = SHAPES[shape]
        flops = 2 * M * N * K
        w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        wq = to_mxfp8_blocked(w, -1, 32, 128)                                    # [E, N, K] along K
        wqt = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, 32, 128)      # [E, K, N] along N
        sets = []
        for _ in range(2):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            dO = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
            q = (to_mxfp8_blocked(x, -1, 32, 1), to_mxfp8_blocked(dO, -1, 32, 1),
                 to_mxfp8_blocked(dO.t(), -1, 32, 1), to_mxfp8_blocked(x.t(), -1, 32, 128))
            sets.append((x, dO, q))
        for rname in args.routings.split(","):
            offs = torch.tensor(routings(M)[rname], device="cuda").cumsum(0).to(torch.int32)
            calls = {
                "bf16": {
                    "fprop": lambda s: torch._grouped_mm(s[0], w.transpose(-2, -1), offs=offs),
                    "dgrad": lambda s: torch._grouped_mm(s[1], w, offs=offs),
                    "wgrad": lambda s: torch._grouped_mm(s[1].t(), s[0], offs=offs)},
                "triton_mx32": {
                    "fprop": lambda s: mxfp8_grouped_mm_fprop(*s[2][0], *wq, offs, block=32, w_tile=128,
                                                              validate=False),
                    "dgrad": lambda s: mxfp8_grouped_mm_dgrad(*s[2][1], wqt[0].transpose(1, 2),
                                                              wqt[1].transpose(1, 2), offs, block=32, w_tile=128,
                                                              validate=False),
                    "wgrad": lambda s: mxfp8_grouped_mm_wgrad(*s[2][2], *s[2][3], offs, dw_dtype, block=32,
                                                              a_tile=128, validate=False)},
            }
            if args.skip_triton:
                del calls["triton_mx32"]
            for c in args.configs.split(","):
                cfg = CONFIGS[c]
                ncfg, wcfg = cfg if cfg[0] is None or isinstance(cfg[0], tuple) else (cfg, cfg)
                calls["gluon_" + c] = {
                    "fprop": lambda s, cfg=ncfg: launch_nt(s[2][0][0], s[2][0][1], wq[0], wq[1], offs,
                                                           torch.bfloat16, cfg),
                    "dgrad": lambda s, cfg=ncfg: launch_nt(s[2][1][0], s[2][1][1], wqt[0], wqt[1], offs,
                                                           torch.bfloat16, cfg),
                    "wgrad": lambda s, cfg=wcfg: launch_wgrad(s[2][2][0], s[2][2][1], s[2][3][0], s[2][3][1], offs,
                                                              dw_dtype, cfg)}
                if base is not None and c in args.base_configs.split(","):
                    calls["base_" + c] = {
                        "fprop": lambda s, cfg=ncfg: base.launch_nt(s[2][0][0], s[2][0][1], wq[0], wq[1], offs,
                                                                    torch.bfloat16, cfg),
                        "dgrad": lambda s, cfg=ncfg: base.launch_nt(s[2][1][0], s[2][1][1], wqt[0], wqt[1], offs,
                                                                    torch.bfloat16, cfg),
                        "wgrad": lambda s, cfg=wcfg: base.launch_wgrad(s[2][2][0], s[2][2][1], s[2][3][0],
                                                                       s[2][3][1], offs, dw_dtype, cfg)}
            for cv in filter(None, args.cuda.split(";")):
                from kernels.grouped_gemm.cuda_mx import launch_nt as cuda_nt
                gm = 8
                opts = [o for o in ("" if cv == "default" else cv).split(",") if o]
                if any(o.startswith("GROUP_M=") for o in opts):
                    gm = int([o for o in opts if o.startswith("GROUP_M=")][0][8:])
                    opts = [o for o in opts if not o.startswith("GROUP_M=")]
                var = ",".join(opts)
                calls["cuda_" + cv] = {
                    "fprop": lambda s, var=var, gm=gm: cuda_nt(s[2][0][0], s[2][0][1], wq[0], wq[1], offs,
                                                               torch.bfloat16, gm, var),
                    "dgrad": lambda s, var=var, gm=gm: cuda_nt(s[2][1][0], s[2][1][1], wqt[0], wqt[1], offs,
                                                               torch.bfloat16, gm, var)}
            q0 = sets[0][2]
            refs = {
                "fprop": lambda: grouped_mm_fprop_reference(*q0[0], *wq, offs, out_dtype=torch.float64),
                "dgrad": lambda: grouped_mm_dgrad_reference(*q0[1], wqt[0].transpose(1, 2), wqt[1].transpose(1, 2),
                                                            offs, out_dtype=torch.float64),
                "wgrad": lambda: grouped_mm_wgrad_reference(*q0[2], *q0[3], offs, out_dtype=torch.float64),
            }
            for p in args.passes.split(","):
                first, timed, errs = None, {}, {}
                for v, fns in calls.items():
                    if p not in fns:
                        continue
                    try:
                        out = fns[p](sets[0])
                        torch.cuda.synchronize()
                        err = None
                        if v in ("triton_mx32", "gluon_default") or v.startswith("cuda_"):
                            ref = refs[p]()
                            err = rel(out, ref)
                            del ref
                        elif v.startswith(("gluon_", "base_")) and first is not None:
                            err = rel(out, first)  # vs the default config's output
                        if v.startswith("gluon_") and first is None:
                            first = out
                        del out
                        timed[v] = [lambda s=s, f=fns[p]: f(s) for s in sets]
                        errs[v] = err
                    except Exception as e:  # record and go on
                        rec(shape=shape, routing=rname, pass_=p, variant=v, error=repr(e)[:300])
                # every variant of the pass in the same rounds (benchmarks/cuda_timing.py; --timing picks the method)
                res, clocks = timer(timed, args.rounds) if timed else ({}, {})
                for v, (ms, iqr) in res.items():
                    rec(shape=shape, routing=rname, pass_=p, variant=v, ms=round(ms, 4),
                        TFLOPs=round(flops / ms / 1e9, 1),
                        vs_bf16=round(res["bf16"][0] / ms, 3) if "bf16" in res else None, iqr=round(iqr, 3),
                        rel_err=None if errs[v] is None else float(f"{errs[v]:.3g}"), **clocks.get(v, {}))
                del first
                torch.cuda.empty_cache()
        del sets, w, wq, wqt
        torch.cuda.empty_cache()
        write_json(meta, rows)

    for shape in [v for v in args.op.split(",") if v]:
        op_section(rec, shape, args.op_rounds, timer)
        write_json(meta, rows)

    print(f"\nmx32 grouped GEMM (Gluon / CUDA vs Triton vs bf16), {meta['device']}, torch {meta['torch']}, "
          f"triton {meta['triton']}, E={E}, {TPE} tokens/expert, {time.time() - t0:.0f}s")
    print(f"{'shape':10s} {'routing':7s} {'pass':6s} {'variant':16s} {'TFLOP/s':>8s} {'vs bf16':>8s} {'rel_err':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:10s} {r.get('routing', ''):7s} {r.get('pass_', ''):6s} {r.get('variant', ''):16s} "
                  f"ERROR {r['error'][:80]}")
            continue
        print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:6s} {r['variant']:16s} {r['TFLOPs']:8.1f} "
              f"{r['vs_bf16'] or 0:8.3f} {'' if r['rel_err'] is None else r['rel_err']:>9}")
    print("wrote", write_json(meta, rows))


def op_section(rec, shape, rounds, timer):
    """Whole op fwd+bwd (both quantizations of x and dO, weight quantizations, 3 GEMMs), 3 GEMMs of FLOPs."""
    from titan_fp8.float8 import experts as mod  # (relative imports inside: load it as a package module)
    K, N = SHAPES[shape]
    M = E * TPE
    flops = 3 * 2 * M * N * K
    offs = torch.tensor(routings(M)["even"], device="cuda").cumsum(0).to(torch.int32)
    sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16).requires_grad_(),
             torch.randn(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    w = (torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    fns = {"bf16": lambda x: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)}
    for b in ("triton", "gluon"):
        fns["op_mx32_" + b] = lambda x, b=b: mod.mxfp8_grouped_mm(x, w, offs, granularity="mx32", backend=b)
    timed = {}
    for name, fn in fns.items():
        def step(s, fn=fn):
            out = fn(s[0])
            out.backward(s[1])
        try:
            for s in sets:  # warm-up (compiles, autotunes) and a clear error before timing
                step(s)
            torch.cuda.synchronize()
            timed[name] = [lambda s=s, step=step: step(s) for s in sets]
        except Exception as e:
            rec(shape=shape, routing="even", pass_="fwd+bwd", variant=name, error=repr(e)[:300])
    res, clocks = timer(timed, rounds) if timed else ({}, {})  # timed as the kernels
    for name, (ms, iqr) in res.items():
        rec(shape=shape, routing="even", pass_="fwd+bwd", variant=name, ms=round(ms, 4),
            TFLOPs=round(flops / ms / 1e9, 1), vs_bf16=round(res["bf16"][0] / ms, 3) if "bf16" in res else None,
            iqr=round(iqr, 3), rel_err=None, **clocks.get(name, {}))
    del sets, w
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
