"""The expert op's fused activation / gradient quantizer: CUDA C++ (kernels/grouped_gemm/quant_cuda.py) beside the
Triton kernel (quant_triton.py, its rowcol_launch configuration) and a plain copy, round-robin in one run.

First a byte check of the Triton kernel and the CUDA kernel against quant.py's PyTorch rule (to_mxfp8_blocked) in
all four layouts at the GPU test's awkward cases (tests/gpu/grouped_gemm_gpu_helpers.rowcol_cases: M not a multiple
of 32 or 128, K % 128 == 32, `limit` inside a tile, NaN / inf rows, zeros, bf16 subnormals, values near the bf16
maximum, empty x). A mismatch exits non-zero before any timing. Then, per shape (E = 8 x 8192 tokens; x [T, K] and dO [T, N] for dsv3_up K, N = 7168,
2048; dsv3_down 2048, 7168; llama_up 4096, 2816; last 100 rows past `limit`), the ms of each launch, TB/s
(bytes read + written) and cuda / triton.

    python benchmarks/quant_rowcol_cuda.py [--shapes dsv3_up,...] [--rounds 20] [--check-only]
"""
import argparse
import datetime
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from benchmarks.results_json import write_results  # noqa: E402
from kernels.grouped_gemm import quant_cuda, quant_triton  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
from grouped_gemm_gpu_helpers import rowcol_cases, rowcol_reference  # noqa: E402  (the GPU test's cases)

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192
LAYOUT_NAMES = {(128, 128, 128): "mx128 x", (128, 128, 1): "mx128 dO", (32, 32, 128): "mx32 x", (32, 32, 1): "mx32 dO"}


def triton_rowcol(x, rb, cb, ct, limit):
    """The Triton kernel at its default launch. The program tile is passed explicitly: without it _run's switch
    (TITAN_FP8_ROWCOL_QUANT, default auto) sends these calls to the CUDA kernel, which this script's "triton" rows
    timed from session 30's switch on until session 31 fixed it."""
    bm, bk, _ = quant_triton.rowcol_launch(1, cb, ct, True, True)
    return quant_triton._run(x.unsqueeze(0), limit, rb, 1, cb, ct, True, True, tile=(bm, bk))


def check(builds=None):
    """builds: {tag: extension} of --variant / --base-src builds, checked beside the default one."""
    u8 = torch.uint8
    n = 0
    for (rb, cb, ct), lname in LAYOUT_NAMES.items():
        for name, x, lim in rowcol_cases():
            limit = None if lim is None else torch.tensor([lim], dtype=torch.int32, device="cuda")
            ref = rowcol_reference(x, rb, cb, ct, lim)
            for who, got, want in [("triton", triton_rowcol(x, rb, cb, ct, limit), ref)] + [
                    (f"cuda g{g}", quant_cuda.rowcol(x, rb, cb, ct, limit, group_m=g), ref) for g in (0, 3)] + [
                    (f"cuda_{tag}", quant_cuda.rowcol(x, rb, cb, ct, limit, ext=ext), ref)
                    for tag, ext in (builds or {}).items()]:
                for part, a, b in zip(("row data", "row scale", "col data", "col scale"), got, want):
                    a, b = a.reshape(-1).view(u8), b.reshape(-1).view(u8)
                    if a.shape != b.shape or not torch.equal(a, b):
                        bad = (a != b).nonzero()[:5].flatten().tolist() if a.shape == b.shape else "shape"
                        raise SystemExit(f"MISMATCH {lname} {name}: {who}'s {part} vs quant.py at flat {bad} "
                                         f"(shapes {tuple(a.shape)} / {tuple(b.shape)})")
            n += 1
    print(f"byte check: {n} cases x 4 outputs of the Triton kernel and the CUDA kernel (two tile orders"
          f"{', builds ' + ', '.join(builds) if builds else ''}) equal to quant.py",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--layouts", default=",".join(LAYOUT_NAMES.values()), help="of: " + ", ".join(LAYOUT_NAMES.values()))
    ap.add_argument("--group-m", default="", help="also the CUDA kernel with these tile orders (runs of G "
                    "128-token tiles, K-tile by K-tile; default 0: along K first), e.g. 4,8,16")
    ap.add_argument("--persistent", default="", help="also the CUDA kernel on a persistent grid of N CTAs per SM "
                    "(the default before session 44: 2), rows cuda_pN, e.g. 2,3")
    ap.add_argument("--diag", action="store_true", help="also the CUDA kernel without the column copy's data "
                    "stores (nocol), the row copy's (norow), either (nostore): diagnostics, wrong bytes")
    ap.add_argument("--base-src", default="", help="also another revision's rowcol_quant.cu (built as a second "
                    "extension; rows cuda_base), e.g. from `git show REV:kernels/grouped_gemm/cuda_quant/"
                    "rowcol_quant.cu > /tmp/base/rowcol_quant.cu`; a revision whose launcher takes ctas_per_sm "
                    "(session 44 on)")
    ap.add_argument("--variant", action="append", default=[], help="also this tree's rowcol_quant.cu built with "
                    "defines, TAG=-DNAME[=V],-DNAME2 (rows cuda_TAG; repeatable), e.g. mb3=-DROWCOL_MIN_BLOCKS=3 (commit "
                    "3facba4), defer=-DROWCOL_DEFER_STORES=1 (commit bf358e3)")
    args = ap.parse_args()
    base = quant_cuda.load_source(args.base_src, "base") if args.base_src else None
    variants = {}
    for v in args.variant:
        tag, _, defs = v.partition("=")
        if not tag.isidentifier() or not defs:
            raise SystemExit(f"--variant {v!r}: expected TAG=-DNAME[=V][,-DNAME2...]")
        variants[tag] = quant_cuda.load_source(quant_cuda.SOURCE_PATH, "v_" + tag, defs.split(","))
    check({**variants, **({"base": base} if base is not None else {})})
    if args.check_only:
        return
    rows, M = [], E * TPE
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "command": "python " + " ".join(sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "E": E, "tokens_per_expert": TPE,
            "timing": f"round-robin, {args.rounds} rounds, median"}
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        t = {"x": torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
             "dO": torch.randn(M, N, device="cuda", dtype=torch.bfloat16)}
        lim = torch.tensor([M - 100], device="cuda", dtype=torch.int32)
        fns, nbytes = {}, {}
        for opnd in ("x", "dO"):
            fns[("copy", opnd)] = [lambda a=t[opnd]: a.clone()]
            nbytes[("copy", opnd)] = 4 * t[opnd].numel()
        for (rb, cb, ct), lname in LAYOUT_NAMES.items():
            if lname not in args.layouts.split(","):
                continue
            a = t[lname.split()[1]]
            want = triton_rowcol(a, rb, cb, ct, lim)
            fns[(lname, "triton")] = [lambda a=a, k=(rb, cb, ct): triton_rowcol(a, *k, lim)]
            nbytes[(lname, "triton")] = 4 * a.numel()
            cuda = {"cuda": {}}
            if base is not None:
                cuda["cuda_base"] = dict(ext=base)
            for tag, ext in variants.items():
                cuda[f"cuda_{tag}"] = dict(ext=ext)
            for g in filter(None, args.group_m.split(",")):
                cuda[f"cuda_g{g}"] = dict(group_m=int(g))
            for n in filter(None, args.persistent.split(",")):
                cuda[f"cuda_p{n}"] = dict(ctas_per_sm=int(n))
            for v, kw in cuda.items():
                got = quant_cuda.rowcol(a, rb, cb, ct, lim, **kw)
                if not all(torch.equal(p.reshape(-1).view(torch.uint8), q.reshape(-1).view(torch.uint8))
                           for p, q in zip(got, want)):
                    raise SystemExit(f"MISMATCH {shape} {lname} cuda {v} at full size")
            if args.diag:
                for v, d in (("nocol", 1), ("norow", 2), ("nostore", 3)):
                    cuda[f"cuda_{v}"] = dict(diag=d)
            for v, kw in cuda.items():
                fns[(lname, v)] = [lambda a=a, k=(rb, cb, ct), kw=kw: quant_cuda.rowcol(a, *k, lim, **kw)]
                nbytes[(lname, v)] = 4 * a.numel()
        ms = interleaved_ms(fns, rounds=args.rounds)
        for key, (m, iqr) in ms.items():
            r = dict(shape=shape, launch=key[0], variant=key[1], ms=round(m, 4),
                     TBps=round(nbytes[key] / m / 1e9, 3), iqr=round(iqr, 3))
            if key[0] != "copy" and key[1] != "triton":
                r["vs_triton"] = round(ms[(key[0], "triton")][0] / m, 3)
            rows.append(r)
            print(f"{shape:9s} {key[0]:9s} {key[1]:10s} {m:8.4f} ms {r['TBps']:6.3f} TB/s "
                  f"{'x triton ' + str(r['vs_triton']) if 'vs_triton' in r else '':16s} iqr {r['iqr']}", flush=True)
        write_results("quant_rowcol_cuda", meta, rows)
        t = fns = None
        torch.cuda.empty_cache()
    print("wrote", write_results("quant_rowcol_cuda", meta, rows))


if __name__ == "__main__":
    main()
