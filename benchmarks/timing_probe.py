"""How the timing method moves kernel ratios on a power-capped GPU: the same kernels timed three ways, twice, with
the SM clock and power logged (nvidia-smi, every 50 ms) beside the run.

  python benchmarks/timing_probe.py [--shape llama_up] [--passes fprop,wgrad]

Methods, per pass, over the variants bf16 (torch._grouped_mm), fp8_rowwise (torch._scaled_grouped_mm), mx128
(CUTLASS) and mx32 (Gluon), E = 8 x 8192 tokens, even routing:
  dobench      one variant after the other, triton do_bench(warmup=25, rep=50) median, after 0.5 s idle (what
               benchmarks/mxfp8_grouped_gemm_backends.py did up to session 14);
  steady       one variant after the other, 1.5 s of back-to-back calls first, then 50 calls timed with CUDA events;
  interleaved  benchmarks/cuda_timing.interleaved_ms, 50 rounds (what the backends benchmark does now).
Prints ms and x bf16 per (method, repeat, pass, variant) with the mean SM clock / power over each measurement
window; writes timing_probe-<device>-<date>.json and clocks.csv under $OUT (or benchmarks/results/).
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

from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from kernels.grouped_gemm import mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192
F8 = torch.float8_e4m3fn


def variants(K, N, pass_):
    M = E * TPE
    offs = (torch.arange(1, E + 1, device="cuda") * TPE).to(torch.int32)
    sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
             torch.randn(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    w8 = w.to(F8)
    one = lambda n: torch.ones(n, device="cuda", dtype=torch.float32)  # noqa: E731
    out = {}
    if pass_ == "fprop":
        out["bf16"] = [lambda s=s: torch._grouped_mm(s[0], w.transpose(-2, -1), offs=offs) for s in sets]
        x8 = [s[0].to(F8) for s in sets]
        out["fp8_rowwise"] = [lambda x=x: torch._scaled_grouped_mm(x, w8.transpose(-2, -1), one(M),
                                                                   one(E * N).view(E, N), offs=offs,
                                                                   out_dtype=torch.bfloat16) for x in x8]
        for name, block, backend in (("mx128", 128, "cutlass"), ("mx32", 32, "gluon")):
            wq = to_mxfp8_blocked(w, -1, block, 128)
            xq = [to_mxfp8_blocked(s[0], -1, block, 1) for s in sets]
            out[name] = [lambda q=q, wq=wq, block=block, backend=backend: mxfp8_grouped_mm_fprop(
                *q, *wq, offs, block=block, w_tile=128, validate=False, backend=backend) for q in xq]
    else:
        out["bf16"] = [lambda s=s: torch._grouped_mm(s[1].t(), s[0], offs=offs) for s in sets]
        t8 = [(s[0].t().contiguous().to(F8), s[1].t().contiguous().to(F8)) for s in sets]
        out["fp8_rowwise"] = [lambda q=q: torch._scaled_grouped_mm(q[1], q[0].t(), one(N * E), one(K * E),
                                                                   offs=offs, out_dtype=torch.bfloat16)
                              for q in t8]
        for name, block, backend in (("mx128", 128, "cutlass"), ("mx32", 32, "gluon")):
            ops = [(to_mxfp8_blocked(s[1].t(), -1, block, 1), to_mxfp8_blocked(s[0].t(), -1, block, 128))
                   for s in sets]
            out[name] = [lambda o=o, block=block, backend=backend: mxfp8_grouped_mm_wgrad(
                *o[0], *o[1], offs, torch.bfloat16, block=block, a_tile=128, validate=False, backend=backend,
                token_align=128) for o in ops]
    for calls in out.values():
        for c in calls:
            c()
    torch.cuda.synchronize()
    return out


def events_median(calls, n):
    ev = []
    for i in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        calls[i % len(calls)]()
        e.record()
        ev.append((s, e))
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in ev)
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama_up")
    ap.add_argument("--passes", default="fprop,wgrad")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from triton.testing import do_bench
    outdir = os.environ.get("OUT") or os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(outdir, exist_ok=True)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50", "-i", "0"],
                           stdout=open(os.path.join(outdir, "clocks.csv"), "w"))
    K, N = SHAPES[args.shape]
    rows, t_start = [], time.time()
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": "python " + " ".join(sys.argv), "shape": args.shape, "t0_unix": t_start}
    print(json.dumps(meta), flush=True)
    try:
        for pass_ in args.passes.split(","):
            fns = variants(K, N, pass_)
            for rep in range(args.repeats):
                for method in ("dobench", "steady", "interleaved"):
                    t0 = time.time()
                    res = {}
                    if method == "interleaved":
                        res = {v: ms for v, (ms, _) in interleaved_ms(fns, 50).items()}
                    else:
                        for v, calls in fns.items():
                            if method == "dobench":
                                time.sleep(0.5)
                                st = {"i": 0}

                                def step(calls=calls, st=st):
                                    st["i"] ^= 1
                                    return calls[st["i"]]()
                                res[v] = do_bench(step, warmup=25, rep=50, return_mode="median")
                            else:
                                t1 = time.time()
                                while time.time() - t1 < 1.5:
                                    for c in calls:
                                        c()
                                    torch.cuda.synchronize()
                                res[v] = events_median(calls, 50)
                    for v, ms in res.items():
                        r = dict(pass_=pass_, method=method, repeat=rep, variant=v, ms=round(ms, 4),
                                 vs_bf16=round(res["bf16"] / ms, 3), t0=round(t0 - t_start, 2),
                                 t1=round(time.time() - t_start, 2))
                        rows.append(r)
                        print(json.dumps(r), flush=True)
            del fns
            torch.cuda.empty_cache()
    finally:
        time.sleep(0.2)
        smi.terminate()
    print(f"\n{'pass':6s} {'method':12s} rep " + " ".join(f"{v:>18s}" for v in ("bf16", "fp8_rowwise", "mx128",
                                                                                    "mx32")))
    for key in sorted({(r["pass_"], r["method"], r["repeat"]) for r in rows}, key=lambda k: (k[0], k[2], k[1])):
        got = {r["variant"]: r for r in rows if (r["pass_"], r["method"], r["repeat"]) == key}
        print(f"{key[0]:6s} {key[1]:12s} {key[2]:3d} " + " ".join(
            f"{got[v]['ms']:8.3f} ({got[v]['vs_bf16']:5.3f})" if v in got else f"{'-':>18s}"
            for v in ("bf16", "fp8_rowwise", "mx128", "mx32")))
    path = os.path.join(outdir, f"timing_probe-{meta['device'].split()[1].lower()}-{datetime.date.today()}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
