"""MXFP8 grouped GEMMs (kernels/grouped_gemm) against torch._grouped_mm bf16 and torch._scaled_grouped_mm fp8
rowwise, measured in the same run, at MoE expert shapes.

  PYTHONUNBUFFERED=1 python benchmarks/mxfp8_grouped_gemm.py [--shapes dsv3_up,dsv3_down,llama_up] [--quick]

E = 8 experts, 8192 tokens per expert (M = 65536), (K, N) in {(7168, 2048), (2048, 7168), (4096, 2816)}, with
even routing and a skewed one (one expert 4x the mean, one empty, the rest uneven, not multiples of 128).
For fprop (out = x @ W^T), dgrad (dX = dO @ W) and wgrad (dW = dO^T @ x): TFLOP/s (2*M*N*K over the kernel
time; quantization not included, it is a separate kernel measured by the quantization benchmark) and the
ratio to bf16 and fp8 rowwise. Each of our outputs is checked against the float64 dequantize-then-matmul
reference (kernels/grouped_gemm/reference.py) at the full shape. Timing: triton.testing.do_bench median,
alternating between two input sets (each far larger than the 50-60 MB L2) so no run reads from a warm cache.

Our variants (what each operand's scales look like; all are valid MXFP8 tensors, see the kernels' docstring;
the first three are the granularities of titan_fp8.float8.experts):
  mx128       activations and gradients 1x128 along the reduction axis, weights 128x128 tiles (fprop/dgrad);
              wgrad: dO^T 1x128 along tokens, x^T in 128(features) x 128(tokens) tiles
  mx32        plain 1x32 on every activation and gradient, weights 128x128 tiles; wgrad x^T 128 x 32 tiles
  mx32_plain  plain 1x32 everything (weights too): the format with no sharing at all
  mx128_xt1   wgrad only: as mx128 but x^T 1x128 (outer-product promotion), to show what the tile buys
Writes benchmarks/results/mxfp8_grouped_gemm-<device>-<date>.json (or under $OUT when set).
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.grouped_gemm import (  # noqa: E402
    grouped_mm_dgrad_reference,
    grouped_mm_fprop_reference,
    grouped_mm_wgrad_reference,
    mxfp8_grouped_mm_dgrad,
    mxfp8_grouped_mm_fprop,
    mxfp8_grouped_mm_wgrad,
)
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192
# name: (block, weight tile, x^T tile for wgrad) -- the first three are titan_fp8.float8.experts' GRANULARITIES
VARIANTS = {"mx128": (128, 128, 128), "mx32": (32, 128, 128), "mx32_plain": (32, 1, 1),
            "mx128_xt1": (128, 128, 1)}
F8 = torch.float8_e4m3fn


def routings(M):
    even = [TPE] * E
    rest = M - 4 * TPE  # one expert 4x the mean, one empty, the other six share the rest unevenly
    # multiples of 16 tokens (torch's fp8 grouped GEMM asserts 16-byte group strides), not of 128
    q = 16 if TPE >= 1024 else 1
    six = [(rest // 6) // q * q + (1 if i % 2 else -1) * q * (i + 1) for i in range(6)]
    six[-1] += rest - sum(six)
    skew = [4 * TPE, 0] + six
    return {"even": even, "skewed": skew}


def bench(fns):
    """Median ms of calling fns[0], fns[1], fns[0], ... (two input sets)."""
    if not torch.cuda.is_available():  # --tiny smoke test on CPU: run once, no timing
        fns[0]()
        return float("nan")
    from triton.testing import do_bench
    state = {"i": 0}

    def step():
        state["i"] ^= 1
        return fns[state["i"]]()
    return do_bench(step, warmup=25, rep=200, return_mode="median")


def rel(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def main():
    global E, TPE, SHAPES
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--routings", default="even,skewed")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-check", action="store_true", help="skip the float64 reference checks")
    ap.add_argument("--op", default="", help="also time the autograd op fwd+bwd (quantization included) at "
                    "this shape, eager and torch.compile'd, against bf16 torch._grouped_mm fwd+bwd")
    ap.add_argument("--tiny", action="store_true", help="smoke test: tiny shapes on any device (CPU: interpreter)")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.tiny:
        TPE = 96
        SHAPES = {"dsv3_up": (224, 64), "dsv3_down": (64, 224), "llama_up": (128, 96)}
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    M = E * TPE
    rows, t_start = [], time.time()
    meta = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": "python " + " ".join(sys.argv), "experts": E, "tokens_per_expert": TPE,
        "timing": "triton.testing.do_bench median, 2 rotating input sets, kernel only (no quantization)",
    }
    print(json.dumps(meta), flush=True)

    def rec(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)

    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        flops = 2 * M * N * K
        sets = []
        for _ in range(2):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            dO = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
            sets.append((x, dO))
        w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02
        for rname in args.routings.split(","):
            sizes = routings(M)[rname]
            offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
            base = {}
            # ---- bf16 grouped
            base[("fprop", "bf16")] = bench([lambda s=s: torch._grouped_mm(s[0], w.transpose(-2, -1), offs=offs)
                                             for s in sets])
            base[("dgrad", "bf16")] = bench([lambda s=s: torch._grouped_mm(s[1], w, offs=offs) for s in sets])
            base[("wgrad", "bf16")] = bench([lambda s=s: torch._grouped_mm(s[1].t(), s[0], offs=offs) for s in sets])
            # ---- fp8 rowwise (torch._scaled_grouped_mm, unit scales: the speed does not depend on them)
            f8 = [(s[0].to(F8), s[1].to(F8), s[0].t().contiguous().to(F8), s[1].t().contiguous().to(F8))
                  for s in sets]
            w8 = w.to(F8)
            wt8 = w.transpose(1, 2).contiguous().to(F8)  # [E, K, N]
            one = lambda n: torch.ones(n, device=dev, dtype=torch.float32)  # noqa: E731
            rowwise = {
                "fprop": [lambda q=q: torch._scaled_grouped_mm(q[0], w8.transpose(-2, -1), one(M), one(E * N).view(E, N),
                                                               offs=offs, out_dtype=torch.bfloat16) for q in f8],
                "dgrad": [lambda q=q: torch._scaled_grouped_mm(q[1], wt8.transpose(-2, -1), one(M), one(E * K).view(E, K),
                                                               offs=offs, out_dtype=torch.bfloat16) for q in f8],
                "wgrad": [lambda q=q: torch._scaled_grouped_mm(q[3], q[2].t(), one(N * E), one(K * E),
                                                               offs=offs, out_dtype=torch.bfloat16) for q in f8],
            }
            for p, fns in rowwise.items():
                try:
                    fns[0]()
                    base[(p, "fp8_rowwise")] = bench(fns)
                except Exception as e:  # record and go on
                    base[(p, "fp8_rowwise")] = None
                    rec(shape=shape, routing=rname, pass_=p, variant="fp8_rowwise", error=repr(e)[:200])
            del f8, w8, wt8
            for (p, v), ms in base.items():
                if ms is not None:
                    rec(shape=shape, routing=rname, pass_=p, variant=v, ms=round(ms, 4),
                        TFLOPs=round(flops / ms / 1e9, 1))
            # ---- ours
            for vname in args.variants.split(","):
                block, wtile, xtile = VARIANTS[vname]
                wq = to_mxfp8_blocked(w, -1, block, wtile)                       # along K
                wqt = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, block, wtile)  # [E, K, N] along N
                wn_data, wn_scale = wqt[0].transpose(1, 2), wqt[1].transpose(1, 2)  # [E, N, K] view, [E, N/32, K]
                qs = []
                for x, dO in sets:
                    qs.append((to_mxfp8_blocked(x, -1, block, 1), to_mxfp8_blocked(dO, -1, block, 1),
                               to_mxfp8_blocked(dO.t(), -1, block, 1), to_mxfp8_blocked(x.t(), -1, block, xtile)))
                def mk(p, q, validate):
                    if p == "fprop":
                        return lambda: mxfp8_grouped_mm_fprop(*q[0], *wq, offs, block=block, w_tile=wtile,
                                                              validate=validate)
                    if p == "dgrad":
                        return lambda: mxfp8_grouped_mm_dgrad(*q[1], wn_data, wn_scale, offs, block=block,
                                                              w_tile=wtile, validate=validate)
                    return lambda: mxfp8_grouped_mm_wgrad(*q[2], *q[3], offs, block=block, a_tile=xtile,
                                                          validate=validate)
                calls = {p: [mk(p, q, False) for q in qs] for p in ("fprop", "dgrad", "wgrad")}
                refs = {
                    "fprop": lambda q=qs[0]: grouped_mm_fprop_reference(*q[0], *wq, offs, out_dtype=torch.float64),
                    "dgrad": lambda q=qs[0]: grouped_mm_dgrad_reference(*q[1], wn_data, wn_scale, offs,
                                                                        out_dtype=torch.float64),
                    "wgrad": lambda q=qs[0]: grouped_mm_wgrad_reference(*q[2], *q[3], offs, out_dtype=torch.float64),
                }
                for p, fns in calls.items():
                    if vname == "mx128_xt1" and p != "wgrad":
                        continue  # identical to mx128 there
                    try:
                        # once with validate=True: the declared scale sharing holds (device-side assert)
                        out = mk(p, qs[0], True)()
                        if dev == "cuda":
                            torch.cuda.synchronize()
                        err = None if args.no_check else rel(out, refs[p]())
                        del out
                        ms = bench(fns)
                        tf = flops / ms / 1e9
                        r = dict(shape=shape, routing=rname, pass_=p, variant=vname, ms=round(ms, 4),
                                 TFLOPs=round(tf, 1), rel_err=None if err is None else float(f"{err:.3g}"))
                        for bname in ("bf16", "fp8_rowwise"):
                            b = base.get((p, bname))
                            r["vs_" + bname] = None if b is None else round(b / ms, 3)
                        rec(**r)
                    except Exception as e:
                        rec(shape=shape, routing=rname, pass_=p, variant=vname, error=repr(e)[:300])
                del qs, wq, wqt
                if dev == "cuda":
                    torch.cuda.empty_cache()
        del sets, w
        if dev == "cuda":
            torch.cuda.empty_cache()
        write_json(meta, rows)

    if args.op:
        op_section(rec, dev, args.op)

    print(f"\nMXFP8 grouped GEMM, {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
          f"E={E}, {TPE} tokens/expert, {time.time() - t_start:.0f}s")
    print(f"{'shape':10s} {'routing':7s} {'pass':6s} {'variant':12s} {'TFLOP/s':>8s} {'vs bf16':>8s} "
          f"{'vs fp8rw':>8s} {'rel_err':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:6s} {r['variant']:12s} ERROR {r['error'][:60]}")
            continue
        if "TBps" in r:
            print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:6s} {r['variant']:12s} {r['ms']:.3f} ms "
                  f"{r['TBps']} TB/s (read + written)")
            continue
        print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:6s} {r['variant']:12s} {r['TFLOPs']:8.1f} "
              f"{r.get('vs_bf16') or '':>8} {r.get('vs_fp8_rowwise') or '':>8} {'' if r.get('rel_err') is None else r['rel_err']:>9}")
    print("wrote", write_json(meta, rows))


def op_section(rec, dev, shape):
    """End to end: titan_fp8.float8.experts.mxfp8_grouped_mm forward + backward (all quantizations included)
    against torch._grouped_mm bf16 forward + backward, even routing. FLOPs: 3 GEMMs."""
    try:
        from titan_fp8.float8.experts import mxfp8_grouped_mm
    except ModuleNotFoundError as e:  # the package __init__ imports torchao, which the GPU image may lack
        if "torchao" not in str(e):
            raise
        import importlib.util
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "titan_fp8", "float8",
                            "experts.py")
        spec = importlib.util.spec_from_file_location("_titan_fp8_experts_standalone", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mxfp8_grouped_mm = mod.mxfp8_grouped_mm
    K, N = SHAPES[shape]
    M = E * TPE
    flops = 3 * 2 * M * N * K
    offs = torch.full((E,), TPE, device=dev).cumsum(0).to(torch.int32)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
    go = torch.randn(M, N, device=dev, dtype=torch.bfloat16)

    def step(fn):
        def run():
            x.grad = w.grad = None
            fn(x, w, offs).backward(go)
        return run

    # the one-read quantizer the op uses for x (row copy 1x128 + token-major 128x128-tile copy)
    try:
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
        xq = x.detach()
        lim = offs[-1:]
        for name, kw in (("quant_x_mx128", dict(row_block=128, col_block=128, col_tile=128)),
                         ("quant_x_mx32", dict(row_block=32, col_block=32, col_tile=128))):
            ms = bench([lambda kw=kw: to_mxfp8_blocked_rowcol(xq, limit=lim, **kw)] * 2)
            byts = M * K * 2 + 2 * (M * K + M * K // 32)
            rec(shape=shape, routing="even", pass_="quant", variant=name, ms=round(ms, 4), TFLOPs=float("nan"),
                TBps=round(byts / ms / 1e9, 3))
    except Exception as e:
        rec(shape=shape, routing="even", pass_="quant", variant="quant_x", error=repr(e)[:300])
    bf16 = lambda x, w, offs: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)  # noqa: E731
    variants = {"bf16": bf16}
    for g in ("mx128", "mx32"):
        variants[f"op_{g}_eager"] = lambda x, w, offs, g=g: mxfp8_grouped_mm(x, w, offs, granularity=g)
        variants[f"op_{g}_compiled"] = torch.compile(
            lambda x, w, offs, g=g: mxfp8_grouped_mm(x, w, offs, granularity=g))
    base = None
    for name, fn in variants.items():
        try:
            run = step(fn)
            run()
            ms = bench([run, run])
            base = base or ms
            rec(shape=shape, routing="even", pass_="fwd+bwd", variant=name, ms=round(ms, 4),
                TFLOPs=round(flops / ms / 1e9, 1), vs_bf16=round(base / ms, 3))
        except Exception as e:
            rec(shape=shape, routing="even", pass_="fwd+bwd", variant=name, error=repr(e)[:300])


def write_json(meta, rows):
    from benchmarks.results_json import write_results
    return write_results("mxfp8_grouped_gemm", meta, rows)


if __name__ == "__main__":
    main()
