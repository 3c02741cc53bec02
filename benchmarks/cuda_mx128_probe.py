"""The CuTe mx128 kernel (kernels/grouped_gemm/cuda_mx.py, block=128) beside the CUTLASS backend's default kernel and
bf16 torch._grouped_mm, fprop and dgrad at the MoE shapes, round-robin; compile-time variants and tile orders too.

  python benchmarks/cuda_mx128_probe.py [--variants "cutlass;cuda;cuda:MX128_SPLIT_N=0,MX128_STAGGER=0;cuda@4"]
      [--shapes dsv3_up,dsv3_down,llama_up] [--passes fprop,dgrad] [--rounds 20]

Variants (';'-separated): "cutlass" (backend="cutlass", default kernels), "cuda" (the file's settings),
"cuda:NAME=V,..." (a compile-time variant, cuda_mx.VARIANT_NAMES), "cuda@G" (group_m = G pairs of m-tiles per run
of the tile order).
E = 8 x 8192 tokens, even routing, kernel time only; each variant's output is compared with the first mx128
variant's (`rel`: norm-wise, 0 = the same bits). Writes cuda_mx128_probe-<device>-<date>.json (under $OUT when set).
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from benchmarks.mxfp8_grouped_gemm_backends import E, SHAPES, TPE, rel  # noqa: E402
from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop  # noqa: E402
from kernels.grouped_gemm.cuda_mx import GROUP_M, launch_nt  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402


def kernel(v, p, q, wq, wqt, offs):
    """One launch of variant v for pass p on activations q and weights wq (fprop) / wqt (dgrad, W^T K-major)."""
    if v == "cutlass":
        kw = dict(block=128, w_tile=128, validate=False, backend="cutlass")
        if p == "fprop":
            return lambda: mxfp8_grouped_mm_fprop(*q, *wq, offs, **kw)
        return lambda: mxfp8_grouped_mm_dgrad(*q, wqt[0].transpose(1, 2), wqt[1].transpose(1, 2), offs, **kw)
    if not v.startswith("cuda"):
        raise SystemExit(f"--variants: {v!r} unknown; cutlass, cuda, cuda:NAME=V,..., cuda@G")
    name, _, gm = v.partition("@")
    _, _, variant = name.partition(":")
    b = wq if p == "fprop" else wqt
    return lambda: launch_nt(*q, *b, offs, torch.bfloat16, group_m=int(gm or GROUP_M), variant=variant, block=128)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="cutlass;cuda")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--passes", default="fprop,dgrad")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python " + " ".join(sys.argv)}
    print(json.dumps(meta))
    rows = []
    M = E * TPE
    offs = torch.full((E,), TPE, device="cuda").cumsum(0).to(torch.int32)
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
        w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        wq = to_mxfp8_blocked(w, -1, 128, 128)
        wqt = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, 128, 128)
        for p in args.passes.split(","):
            qs = [to_mxfp8_blocked(s[0] if p == "fprop" else s[1], -1, 128, 1) for s in sets]
            if p == "fprop":
                fns = {"bf16": [lambda s=s: torch._grouped_mm(s[0], w.transpose(-2, -1), offs=offs) for s in sets]}
            else:
                fns = {"bf16": [lambda s=s: torch._grouped_mm(s[1], w, offs=offs) for s in sets]}
            ref, rels = None, {}
            for v in args.variants.split(";"):
                fns[v] = [kernel(v, p, q, wq, wqt, offs) for q in qs]
                out = fns[v][0]()
                torch.cuda.synchronize()
                if ref is None:
                    ref = out
                else:
                    rels[v] = rel(out, ref)
            del ref
            for f in fns.values():
                f[1]()
            torch.cuda.synchronize()
            res = interleaved_ms(fns, args.rounds)
            flops = 2 * M * N * K
            for v, (ms, iqr) in res.items():
                r = dict(shape=shape, pass_=p, variant=v, ms=round(ms, 4), TFLOPs=round(flops / ms / 1e9, 1),
                         vs_bf16=round(res["bf16"][0] / ms, 3), iqr=round(iqr, 3))
                if v in rels:
                    r["rel"] = float(f"{rels[v]:.3g}")
                rows.append(r)
                print(json.dumps(r))
            del qs, fns
        del sets, w, wq, wqt
        torch.cuda.empty_cache()
    print(f"\n{'shape':10s} {'pass':6s} {'variant':32s} {'ms':>7s} {'TFLOP/s':>8s} {'vs bf16':>8s} {'rel':>8s}")
    for r in rows:
        print(f"{r['shape']:10s} {r['pass_']:6s} {r['variant']:32s} {r['ms']:7.3f} {r['TFLOPs']:8.1f} "
              f"{r['vs_bf16']:8.3f} {r.get('rel', ''):>8}")
    from benchmarks.results_json import write_results
    print("wrote", write_results("cuda_mx128_probe", meta, rows))


if __name__ == "__main__":
    main()
