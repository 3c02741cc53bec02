"""Tuning sweep for the MXFP8 grouped GEMM kernels (kernels/grouped_gemm): many launch configurations and
scale granularities at one MoE shape, each checked against an fp32 dequantize-then-matmul and timed.

  PYTHONUNBUFFERED=1 python benchmarks/mxfp8_grouped_gemm_sweep.py [--shape dsv3_up] [--only fprop,wgrad]

Prints one line per variant and a table; JSON to $OUT (or benchmarks/results/) as sweep-<shape>.json.
The results choose FPROP_CONFIGS / WGRAD_CONFIGS in kernels/grouped_gemm/__init__.py.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.grouped_gemm import _launch_nt, _launch_wgrad  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402
from kernels.mxfp8 import from_mxfp8  # noqa: E402

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192


def bench(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def grouped_ref_fprop(a, w, offs):
    out = torch.empty(a.shape[0], w.shape[1], device=a.device, dtype=torch.float32)
    s = 0
    for e, t in enumerate(offs.tolist()):
        out[s:t] = a[s:t] @ w[e].t()
        s = t
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="dsv3_up")
    ap.add_argument("--only", default="fprop,wgrad")
    ap.add_argument("--set", default="focus", choices=("focus", "full"))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    K, N = SHAPES[args.shape]
    M = E * TPE
    dev = "cuda"
    res = []
    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02
    offs = torch.arange(TPE, M + 1, TPE, device=dev, dtype=torch.int32)
    flops = 2 * M * N * K
    t0 = time.time()

    def rec(**kw):
        res.append(kw)
        print(json.dumps(kw), flush=True)

    # baselines
    ms = bench(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))
    bf16_f = flops / ms / 1e9
    rec(kind="fprop", variant="bf16_grouped_mm", TFLOPs=round(bf16_f, 1))
    dO = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    ms = bench(lambda: torch._grouped_mm(dO.t(), x, offs=offs))
    bf16_w = flops / ms / 1e9
    rec(kind="wgrad", variant="bf16_grouped_mm", TFLOPs=round(bf16_w, 1))

    if "fprop" in args.only:
        quants = {}
        qset = [(32, 1), (32, 128), (64, 128), (128, 128), (128, 1)] if args.set == "full" else \
            [(32, 128), (64, 128), (128, 128)]
        for block, tile in qset:
            ad, as_ = to_mxfp8_blocked(x, -1, block, 1)
            wd, ws = to_mxfp8_blocked(w, -1, block, tile)
            ref = grouped_ref_fprop(from_mxfp8(ad, as_), from_mxfp8(wd, ws), offs)
            quants[(block, tile)] = (ad, as_, wd, ws, ref)
        P, T, PT = {"PIPE": True}, {"USE_TMA": True}, {"PIPE": True, "USE_TMA": True}
        cfgs = {
            (128, 128): [(64, 128, 1, 4, 4, 8), (64, 128, 1, 4, 3, 8), (128, 128, 1, 8, 3, 8), (128, 128, 1, 8, 4, 8),
                         (64, 128, 2, 4, 3, 8), (64, 128, 1, 4, 4, 8, P), (64, 128, 1, 4, 4, 8, T),
                         (64, 128, 1, 4, 4, 8, PT), (128, 128, 1, 8, 3, 8, T)],
            (32, 128): [(64, 128, 1, 4, 4, 8), (64, 128, 1, 4, 6, 8), (64, 128, 4, 4, 3, 8),
                        (128, 128, 1, 8, 4, 8), (64, 64, 1, 4, 6, 8), (64, 128, 1, 4, 4, 8, P),
                        (64, 128, 1, 4, 4, 8, PT), (64, 128, 1, 4, 6, 8, T), (128, 128, 1, 8, 4, 8, P),
                        (64, 64, 1, 4, 6, 8, P)],
            (64, 128): [(64, 128, 1, 4, 4, 8), (128, 128, 1, 8, 4, 8), (64, 128, 1, 4, 4, 8, P)],
            (128, 1): [(64, 128, 1, 4, 4, 8), (128, 128, 1, 8, 4, 8), (128, 256, 1, 8, 3, 8)],
            (32, 1): [(64, 128, 1, 4, 4, 8), (128, 128, 1, 8, 4, 8)],
        }
        if args.set == "focus":  # the candidates left after the first full sweep (NOTES.md)
            cfgs = {
                (128, 128): [(128, 128, 1, 8, 4, 8), (128, 128, 1, 8, 4, 8, T), (128, 128, 1, 8, 5, 8, T),
                             (64, 128, 1, 4, 4, 8, T), (64, 128, 1, 4, 5, 8, T), (64, 128, 1, 4, 6, 8, T),
                             (128, 128, 1, 8, 4, 4), (128, 128, 1, 8, 4, 16), (64, 128, 1, 4, 4, 16, T)],
                (64, 128): [(64, 128, 1, 4, 4, 8), (64, 128, 1, 4, 4, 8, T), (128, 128, 1, 8, 4, 8, T)],
                (32, 128): [(64, 128, 1, 4, 4, 8), (64, 128, 1, 4, 6, 8, T), (128, 128, 1, 8, 4, 8, T),
                            (128, 128, 1, 8, 4, 8)],
            }
        for (block, tile), lst in cfgs.items():
            ad, as_, wd, ws, ref = quants[(block, tile)]
            for cfg in lst:
                name = f"b{block}_t{tile}_" + "_".join(map(str, cfg[:6])) + \
                    "".join("_" + k for k in (cfg[6] if len(cfg) > 6 else {}))
                try:
                    fn = lambda: _launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, block, tile > 1, cfg)
                    out = fn()
                    torch.cuda.synchronize()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    ms = bench(fn)
                    tf = flops / ms / 1e9
                    rec(kind="fprop", variant=name, TFLOPs=round(tf, 1), vs_bf16=round(tf / bf16_f, 3),
                        rel_err=round(err, 5))
                except Exception as e:  # keep sweeping
                    rec(kind="fprop", variant=name, error=repr(e)[:200])
        del quants
        torch.cuda.empty_cache()

    if "wgrad" in args.only:
        refw = None
        T = {"USE_TMA": True}
        wsets = [(128, 1), (128, 128), (32, 1), (32, 128)] if args.set == "full" else [(128, 128), (32, 128)]
        for block, tile in wsets:
            xt, xs = to_mxfp8_blocked(x.t(), -1, block, tile)  # A^T [K, M]: tile over K rows
            dt, ds = to_mxfp8_blocked(dO.t(), -1, block, 1)   # dO^T [N, M]
            xf, df = from_mxfp8(xt, xs), from_mxfp8(dt, ds)
            refw = torch.stack([df[:, e * TPE:(e + 1) * TPE] @ xf[:, e * TPE:(e + 1) * TPE].t() for e in range(E)])
            del xf, df
            lst = [(128, 128, 8, 3, 8), (128, 128, 8, 4, 8), (128, 128, 4, 3, 8), (64, 128, 4, 4, 8),
                   (128, 256, 8, 3, 8)]
            if block == 32:
                lst = [(128, 128, 8, 4, 8), (64, 128, 4, 4, 8), (128, 64, 4, 6, 8)]
            if args.set == "focus":
                lst = [(128, 128, 8, 3, 8), (128, 128, 8, 3, 8, T), (128, 128, 8, 4, 8, T), (64, 128, 4, 4, 8, T),
                       (128, 128, 8, 3, 4), (128, 128, 8, 3, 16, T)]
                if block == 32:
                    lst = [(128, 128, 8, 4, 8), (64, 128, 4, 4, 8), (64, 128, 4, 4, 8, T), (128, 128, 8, 4, 8, T)]
            for cfg in lst:
                name = f"b{block}_t{tile}_" + "_".join(map(str, cfg[:5])) + \
                    "".join("_" + k for k in (cfg[5] if len(cfg) > 5 else {}))
                try:
                    fn = lambda: _launch_wgrad(dt, ds, xt, xs, offs, torch.float32, block, tile > 1, cfg)
                    out = fn()
                    torch.cuda.synchronize()
                    err = ((out - refw).norm() / refw.norm()).item()
                    ms = bench(fn)
                    tf = flops / ms / 1e9
                    rec(kind="wgrad", variant=name, TFLOPs=round(tf, 1), vs_bf16=round(tf / bf16_w, 3),
                        rel_err=round(err, 6))
                except Exception as e:
                    rec(kind="wgrad", variant=name, error=repr(e)[:200])
    print(f"\nSWEEP {args.shape} (E={E}, {TPE} tok/expert, K={K}, N={N}) {time.time() - t0:.0f}s")
    for r in res:
        print(f"{r['kind']:6s} {r['variant']:32s} {r.get('TFLOPs', r.get('error', ''))!s:>8} "
              f"{r.get('vs_bf16', '')!s:>6} {r.get('rel_err', '')!s:>8}")
    outdir = os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, f"sweep-{args.shape}.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": __import__("triton").__version__, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
