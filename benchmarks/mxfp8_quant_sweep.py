"""Config sweep for the MXFP8 quantization kernels (issue 4, kernel 1): every candidate config of the
row+col (both column layouts), column and 32x32-tile kernels, timed at M=131072, K=7168 bf16 and checked
byte for byte against the reference on an uneven shape with NaN/inf/subnormals. One device call.

    python benchmarks/mxfp8_quant_sweep.py [--only rowcol_t,rowcol] [--workers 14]   # GPU, ~3-5 min
    python benchmarks/mxfp8_quant_sweep.py --smoke       # CPU (Triton interpreter): a few variants, exact check

Compiles the candidates in parallel worker processes first (fills Triton's cache), then times each in this
process (triton.testing.do_bench, eager: the sweep launches the plain JIT kernel with a fixed config, so the
host cost is one launch). Prints a table sorted by kernel and % of copy; writes $OUT/mxfp8_quant_sweep.json
if OUT is set (rows stream to $OUT/mxfp8_quant_sweep.jsonl as they are measured, so a cut-off run keeps
what it had).

Row+col options (kernels/mxfp8/triton.py, _rowcol_kernel): TRANS_X transposes the input tile before the
column quantization (no byte transpose before the [K, M] store); TMA stores the data copies through tensor
descriptors; STREAM = .cs stores; EVICT_FIRST = evict-first loads; GROUP_M = grouped tile order.
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KINDS = ("rowcol_t", "rowcol", "cols", "experts_n", "tiles")


def _fits(bm, bk, w):
    """Keep tiles with 16..128 elements per thread: fewer wastes the launch, more spills registers."""
    return 16 <= bm * bk // (32 * w) <= 128


def rowcol_t_candidates():
    out = []
    for bm in (32, 64, 128, 256):  # the [K, M] store writes BLOCK_M contiguous bytes per K row
        for bk in (32, 64, 128):
            for w in (1, 2, 4, 8):
                if _fits(bm, bk, w):
                    for tx in (False, True):
                        out.append((dict(BLOCK_M=bm, BLOCK_K=bk, K_FAST=True, TRANS_X=tx), w))
    for bm, bk, w in ((32, 128, 2), (64, 64, 2), (128, 32, 2), (128, 64, 4), (256, 32, 4)):
        base = dict(BLOCK_M=bm, BLOCK_K=bk, K_FAST=True)
        for opt in (dict(TMA=True), dict(TMA=True, TRANS_X=True), dict(STREAM=True, EVICT_FIRST=True),
                    dict(STREAM=True, EVICT_FIRST=True, TRANS_X=True), dict(GROUP_M=8, TRANS_X=True)):
            out.append((dict(base, **opt), w))
    return out


def rowcol_candidates():
    out = []
    for bm in (32, 64):
        for bk in (64, 128, 256, 512):
            for w in (1, 2, 4, 8):
                if _fits(bm, bk, w):
                    out.append((dict(BLOCK_M=bm, BLOCK_K=bk, K_FAST=True), w))
    for bm, bk, w in ((32, 128, 2), (32, 256, 2), (32, 128, 1), (64, 128, 4)):
        base = dict(BLOCK_M=bm, BLOCK_K=bk, K_FAST=True)
        for opt in (dict(STREAM=True), dict(EVICT_FIRST=True), dict(STREAM=True, EVICT_FIRST=True), dict(TMA=True)):
            out.append((dict(base, **opt), w))
    return out


CO = [  # (BLOCK_R, BLOCK_C, num_warps, K_FAST)
    (32, 256, 2, True), (32, 128, 1, True), (32, 64, 1, True), (32, 128, 2, True), (32, 256, 4, True),
    (32, 512, 4, True), (64, 128, 2, True), (64, 64, 1, True), (64, 256, 4, True),
]
TI = [(32, 256, 2, True), (32, 128, 1, True), (32, 512, 4, True), (64, 256, 4, True), (64, 128, 4, True),
      (32, 128, 2, True), (32, 256, 1, True)]


def variants(only=KINDS):
    out = []
    if "rowcol_t" in only:
        out += [("rowcol_t", c, True) for c in rowcol_t_candidates()]
    if "rowcol" in only:
        out += [("rowcol", c, False) for c in rowcol_candidates()]
    for br, bc, w, kf in CO:
        for kind in ("cols", "experts_n"):
            if kind in only:
                out.append((kind, (dict(BLOCK_R=br, BLOCK_C=bc, K_FAST=kf), w), None))
    if "tiles" in only:
        out += [("tiles", (dict(BLOCK_N=bn, BLOCK_K=bk, K_FAST=kf), w), None) for bn, bk, w, kf in TI]
    return out


def run(tk, kind, cfg, col_t, x, w):
    if kind.startswith("rowcol"):
        return tk.to_mxfp8_rowcol(x, col_t, config=cfg)
    if kind == "cols":
        return tk.to_mxfp8_triton(x, 0, config=cfg)
    if kind == "experts_n":
        return tk.to_mxfp8_triton(w, 1, config=cfg)
    return tk.to_mxfp8_tiles32_triton(w, config=cfg)


def compile_worker(args):
    i, n, only = args
    import torch
    from kernels.mxfp8 import triton as tk
    # the same specialization as the timed shapes (M, K multiples of 16, aligned pointers): a compile here
    # is a cache hit there
    x = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2, 64, 512, device="cuda", dtype=torch.bfloat16)
    errors = {}
    for j, (kind, cfg, col_t) in enumerate(variants(only)):
        if j % n == i:
            try:
                run(tk, kind, cfg, col_t, x, w)
            except Exception as e:  # a config that does not compile is a row with an error, not a crash
                errors[j] = f"{type(e).__name__}: {str(e)[:200]}"
    torch.cuda.synchronize()
    return errors


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--M", type=int, default=131072)
    p.add_argument("--K", type=int, default=7168)
    p.add_argument("--E", type=int, default=8)
    p.add_argument("--N", type=int, default=2048)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--only", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    p.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter: 2 variants per kind, tiny shapes")
    a = p.parse_args()
    only = tuple(k for k in a.only.split(",") if k)
    bad = [k for k in only if k not in KINDS]
    if bad:
        p.error(f"--only: unknown kind(s) {bad}; allowed: {','.join(KINDS)}")
    if a.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        a.M, a.K, a.E, a.N = 256, 128, 2, 64
    t0 = time.time()
    todo = variants(only)
    compile_errors = {}
    if a.smoke:
        seen = {}
        todo = [v for v in todo if seen.setdefault(v[0], []).append(v) or len(seen[v[0]]) <= 2]
        todo += [v for v in variants(only) if v[0] == "rowcol_t" and any(k in v[1][0] for k in ("TMA", "GROUP_M"))][:2]
    else:
        with mp.get_context("spawn").Pool(a.workers) as pool:
            for errs in pool.map(compile_worker, [(i, a.workers, only) for i in range(a.workers)]):
                compile_errors.update(errs)
        print(f"compiled {len(todo)} variants in {time.time() - t0:.0f}s ({len(compile_errors)} failed)", flush=True)

    import torch
    import triton
    from kernels.mxfp8 import reference as ref
    from kernels.mxfp8 import triton as tk

    dev = "cpu" if a.smoke else "cuda"

    def u8(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    # check input: uneven tiles, per-row magnitudes over many binades, NaN/inf, subnormals, zeros
    g = torch.Generator(device=dev).manual_seed(5)
    rows, cols = (32 * 9, 32 * 5) if a.smoke else (32 * 67, 32 * 69)
    xc = (torch.randn(rows, cols, device=dev, generator=g)
          * 2.0 ** torch.randint(-40, 40, (rows, 1), device=dev, generator=g)).to(torch.bfloat16)
    xc[5, 17] = float("nan")
    xc[200, 100] = float("-inf")
    xc[64:96, :64] = 1e-39
    xc[100:132] = 0
    wc = xc[: rows // 96 * 96].reshape(3, rows // 96 * 32, -1)
    want = {"rowcol_t": ref.to_mxfp8_rowcol_reference(xc, True),
            "rowcol": ref.to_mxfp8_rowcol_reference(xc, False),
            "cols": ref.to_mxfp8_reference(xc, 0), "experts_n": ref.to_mxfp8_reference(wc, 1),
            "tiles": ref.to_mxfp8_tiles32_reference(wc)}

    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(a.M, a.K, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(a.E, a.N, a.K, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02

    def bench(f):
        if a.smoke:  # wall clock of one interpreted run: no speed claim
            t = time.perf_counter()
            f()
            return (time.perf_counter() - t) * 1e3
        return triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median")

    y = torch.empty_like(x)
    copy_ms = bench(lambda: y.copy_(x))
    del y
    copy = 2 * x.nbytes / copy_ms / 1e9
    n, nw = x.numel(), w.numel()
    nbytes = dict(rowcol_t=n * 2 + 2 * n + 2 * n // 32, rowcol=n * 2 + 2 * n + 2 * n // 32,
                  cols=n * 2 + n + n // 32, experts_n=nw * 2 + nw + nw // 32, tiles=nw * 2 + nw + 2 * nw // 32)
    print(f"copy {copy_ms:.4f} ms {copy:.3f} TB/s", flush=True)
    out_dir = os.environ.get("OUT")
    stream = open(os.path.join(out_dir, "mxfp8_quant_sweep.jsonl"), "w") if out_dir else None
    all_variants = variants(only)
    rows_out = []
    for kind, cfg, col_t in todo:
        r = dict(kind=kind, cfg=cfg[0], warps=cfg[1])
        err = compile_errors.get(all_variants.index((kind, cfg, col_t)))
        if err:
            r["error"] = err
        else:
            try:
                got = run(tk, kind, cfg, col_t, xc, wc)
                r["exact"] = all(torch.equal(u8(gg), u8(ww)) for gg, ww in zip(got, want[kind]))
                ms = bench(lambda: run(tk, kind, cfg, col_t, x, w))
                tb = nbytes[kind] / ms / 1e9
                r.update(ms=round(ms, 4), TBps=round(tb, 3), pct=round(100 * tb / copy, 1))
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows_out.append(r)
        print(json.dumps(r), flush=True)
        if stream:
            stream.write(json.dumps(r) + "\n")
            stream.flush()
    print(f"\ncopy {copy:.3f} TB/s; best per kernel (of {len(rows_out)} variants, {time.time() - t0:.0f}s):")
    for kind in only:
        rk = sorted([r for r in rows_out if r["kind"] == kind and "pct" in r], key=lambda r: -r["pct"])
        for r in rk[:6]:
            print(f"{kind:<13} {r['pct']:6.1f}% {r['ms']:8.4f} ms exact={r['exact']} w={r['warps']} {r['cfg']}")
    bad = [r for r in rows_out if r.get("exact") is False]
    print("NOT EXACT:", bad if bad else "none")
    print("ERRORS:", [(r["kind"], r["cfg"], r["warps"], r["error"][:80]) for r in rows_out if "error" in r] or "none")
    if out_dir:
        with open(os.path.join(out_dir, "mxfp8_quant_sweep.json"), "w") as f:
            json.dump(dict(copy_TBps=copy, device=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           torch=torch.__version__, triton=triton.__version__, only=list(only), rows=rows_out), f,
                      indent=1)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
