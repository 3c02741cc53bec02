"""DeepGEMM's sm_90 FP8 grouped GEMMs (1x128 activation / 128x128 weight block scales, the published Hopper anchor
for our mx128 granularity) beside bf16 torch._grouped_mm and our CUTLASS mx128 kernels, in ONE run.

  PYTHONUNBUFFERED=1 python benchmarks/deepgemm_anchor.py [--shapes dsv3_up,dsv3_down,llama_up] [--rounds 30]
  python benchmarks/deepgemm_anchor.py --warm SHAPE:PASS   # only JIT-compile DeepGEMM's kernel for it (see below)

DeepGEMM is used as a library (`import deep_gemm`), built outside this tree: benchmarks/deepgemm_device_run.sh.
E = 8 experts x 8192 tokens (M = 65536), even routing, (K, N) in {(7168, 2048), (2048, 7168), (4096, 2816)}.
Kernel time only (operands quantized once, before timing), TFLOP/s = 2*M*N*K / time:
  fprop  out[M, N] = x @ W[e]^T     bf16 | ours mxfp8_grouped_mm_fprop(cutlass) | m_grouped_fp8_gemm_nt_contiguous
  dgrad  dx[M, K] = dO @ W[e]       bf16 | ours mxfp8_grouped_mm_dgrad(cutlass) | m_grouped_fp8_gemm_nt_contiguous
                                    (B = W^T [E, K, N] K-major: DeepGEMM's sm_90 FP8 takes K-major B only)
  wgrad  dW[e] = dO_e^T @ x_e       bf16 | ours mxfp8_grouped_mm_wgrad(cutlass) | k_grouped_fp8_gemm_nt_contiguous
                                    (fp32 out, d = c + A B: it accumulates into c in place, as its API is built)
Same numbers for both fp8 kernels: our operands come from kernels.grouped_gemm.quant.to_mxfp8_blocked (E8M0 powers
of two, shared over 1x128 blocks / 128x128 weight tiles; x^T's wgrad copy over 128x128 tiles); DeepGEMM gets those
very scales as fp32 (2^e exactly), one per 1x128 / 128x128 region, so both compute the same products and their
outputs should agree up to accumulation order (`rel_vs_ours`: norm-wise relative difference).
DeepGEMM's scale layouts are prepared before timing (SFA MN-major and TMA-aligned, as its
get_mn_major_tma_aligned_tensor would make them), so its per-call layout transform is a no-op and not timed; its
wgrad's A/B are repacked per group ([m, k_g] K-major blocks, tests/generators.py's layout), also before timing.
Timing: per (shape, pass) every variant round-robin (benchmarks/cuda_timing.interleaved_ms), two input sets
alternated, CUDA events per call, median. Writes deepgemm_anchor-<device>-<date>.json under $OUT (or
benchmarks/results/).

--plain-fp8 adds 'fp8_dense' rows: cuBLAS torch._scaled_mm with one scale per tensor, one dense GEMM of the same
FLOPs per pass (other numbers than the block-scaled kernels: a pace reference, not an output check).

--warm SHAPE:PASS only makes DeepGEMM JIT-compile that kernel (zero operands of the real shapes: its heuristics
read M, so the kernel is the one timed later) into $DG_JIT_CACHE_DIR; the device script runs all nine at once,
since one process compiles its kernels one after another and each nvcc run is single-threaded.
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
from benchmarks.mx128_op_variants import deepgemm_scales as fp32_scales, mn_major  # noqa: E402

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192
M = E * TPE
PASSES = ("fprop", "dgrad", "wgrad")
F8 = torch.float8_e4m3fn


def import_deep_gemm():
    """deep_gemm, or SystemExit with one line naming what is missing."""
    try:
        import deep_gemm
    except Exception as e:  # ImportError, or its _C.init failing on a missing CUDA home / include
        raise SystemExit(f"deepgemm_anchor: cannot import deep_gemm ({type(e).__name__}: {e}); build it first: "
                         f"benchmarks/deepgemm_device_run.sh (builds deep_gemm._C from third_party_build/DeepGEMM "
                         f"+ fmt and the nvidia-cutlass headers, and puts the package on PYTHONPATH)")
    return deep_gemm


def dg_commit():
    p = os.path.join(ROOT, "third_party_build", "DeepGEMM", "DEEPGEMM_COMMIT")
    return open(p).read().strip() if os.path.exists(p) else None


def per_group_kmajor(t, sizes):
    """[R, M] token-major-along-columns copy -> flat concat of t[:, s:t] ([R, k_g] row-major) per group: the
    A/B layout of DeepGEMM's sm_90 k-grouped FP8 GEMM (tests/generators.py generate_k_grouped_contiguous)."""
    out, s, u = [], 0, t.view(torch.uint8)  # bytes: cat/copy of float8 need not be supported everywhere
    for k in sizes:
        out.append(u[:, s:s + k].contiguous().flatten())
        s += k
    return torch.cat(out).view(t.dtype)


def dg_calls(dg, p, fp8_a, fp8_b, sizes, layout_m, layout_k):
    """One DeepGEMM callable of pass p. fp8_a / fp8_b: (data, fp32 scale) pairs already in its layouts."""
    if p in ("fprop", "dgrad"):
        n = fp8_b[0].shape[1]
        d = torch.empty(fp8_a[0].shape[0], n, device="cuda", dtype=torch.bfloat16)
        return (lambda: dg.m_grouped_fp8_gemm_nt_contiguous(fp8_a, fp8_b, d, layout_m, disable_ue8m0_cast=True)), d
    m, n = fp8_a[1].shape[0], fp8_b[1].shape[0]
    c = torch.zeros(E, m, n, device="cuda", dtype=torch.float32)
    return (lambda: dg.k_grouped_fp8_gemm_nt_contiguous(fp8_a, fp8_b, c, sizes, layout_k, c,
                                                        recipe=(1, 1, 128))), c


def warm(spec):
    """JIT-compile one DeepGEMM kernel (shape:pass) with zero operands of the real shapes."""
    dg = import_deep_gemm()
    shape, p = spec.split(":")
    K, N = SHAPES[shape]
    sizes = [TPE] * E
    layout_m = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(TPE)
    layout_k = torch.tensor(sizes, device="cuda", dtype=torch.int32)
    z = lambda *s: torch.zeros(*s, device="cuda").to(F8)  # noqa: E731
    o = lambda *s: torch.ones(*s, device="cuda")  # noqa: E731
    if p == "fprop":
        a, b = (z(M, K), mn_major(o(M, K // 128))), (z(E, N, K), o(E, N // 128, K // 128))
    elif p == "dgrad":
        a, b = (z(M, N), mn_major(o(M, N // 128))), (z(E, K, N), o(E, K // 128, N // 128))
    else:
        a, b = (z(N * M), mn_major(o(N, M // 128))), (z(K * M), mn_major(o(K, M // 128)))
    t0 = time.time()
    fn, _ = dg_calls(dg, p, a, b, sizes, layout_m, layout_k)
    fn()
    torch.cuda.synchronize()
    print(f"warm {spec}: {time.time() - t0:.1f}s", flush=True)


def nvcc_version():
    try:
        return subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except (OSError, IndexError):
        return None


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--passes", default=",".join(PASSES))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warm", default="", help="SHAPE:PASS: only JIT-compile DeepGEMM's kernel for it")
    ap.add_argument("--plain-fp8", action="store_true",
                    help="also time 'fp8_dense': cuBLAS torch._scaled_mm with one scale per tensor, one dense GEMM "
                         "of the same FLOPs (fprop/dgrad [M, K]x[K, N] with one expert's weight, wgrad reducing "
                         "over all M tokens): the pace of fp8 on this GPU with no block scales at all")
    ap.add_argument("--ours-schedule", action="append", default=[], metavar="LABEL@SCHEDULE",
                    help="also time our CUTLASS kernels under $TITAN_FP8_CUTLASS_SCHEDULE=SCHEDULE, rows "
                         "'ours[LABEL]' (e.g. s18@fprop=cooperative;dgrad=cooperative;wgrad=cooperative_lpt); "
                         "their rel_vs_ours is against the default kernels")
    args = ap.parse_args()
    if args.warm:
        return warm(args.warm)
    extra = {}
    for spec in args.ours_schedule:
        label, _, sched = spec.partition("@")
        if not label or not sched:
            raise SystemExit(f"--ours-schedule {spec!r}: expected LABEL@SCHEDULE")
        extra[f"ours[{label}]"] = sched
    dg = import_deep_gemm()
    from benchmarks.mxfp8_grouped_gemm_backends import with_schedule
    from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    f32 = fp32_scales
    torch.manual_seed(0)
    meta = {"device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "deep_gemm": getattr(dg, "__version__", None), "deep_gemm_commit": dg_commit(),
            "nvcc": nvcc_version(),
            "command": "python " + " ".join(sys.argv), "experts": E, "tokens_per_expert": TPE, "routing": "even",
            "timing": f"round-robin (benchmarks/cuda_timing.interleaved_ms), {args.rounds} rounds, 2 input sets, "
                      "CUDA events per call, median; quantization not timed"}
    print(json.dumps(meta), flush=True)
    rows = []

    def rec(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)

    sizes = [TPE] * E
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    layout_m = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(TPE)
    layout_k = torch.tensor(sizes, device="cuda", dtype=torch.int32)
    t_start = time.time()
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        flops = 2 * M * N * K
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
        w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        wq = to_mxfp8_blocked(w, -1, 128, 128)  # [E, N, K], 128x128 tiles
        wqt = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, 128, 128)  # [E, K, N]
        qs = [(to_mxfp8_blocked(x, -1, 128, 1), to_mxfp8_blocked(dO, -1, 128, 1),
               to_mxfp8_blocked(dO.t(), -1, 128, 1), to_mxfp8_blocked(x.t(), -1, 128, 128)) for x, dO in sets]
        wn_data, wn_scale = wqt[0].transpose(1, 2), wqt[1].transpose(1, 2)
        dg_b = {"fprop": (wq[0], f32(wq[1], 128)), "dgrad": (wqt[0], f32(wqt[1], 128))}
        kern = {p: {} for p in PASSES}
        kern["fprop"]["bf16"] = [lambda s=s: torch._grouped_mm(s[0], w.transpose(-2, -1), offs=offs) for s in sets]
        kern["dgrad"]["bf16"] = [lambda s=s: torch._grouped_mm(s[1], w, offs=offs) for s in sets]
        kern["wgrad"]["bf16"] = [lambda s=s: torch._grouped_mm(s[1].t(), s[0], offs=offs) for s in sets]
        kw = dict(validate=False, backend="cutlass")
        kern["fprop"]["mx128_cutlass"] = [lambda q=q: mxfp8_grouped_mm_fprop(
            *q[0], *wq, offs, block=128, w_tile=128, **kw) for q in qs]
        kern["dgrad"]["mx128_cutlass"] = [lambda q=q: mxfp8_grouped_mm_dgrad(
            *q[1], wn_data, wn_scale, offs, block=128, w_tile=128, **kw) for q in qs]
        kern["wgrad"]["mx128_cutlass"] = [lambda q=q: mxfp8_grouped_mm_wgrad(
            *q[2], *q[3], offs, block=128, a_tile=128, token_align=128, **kw) for q in qs]
        if args.plain_fp8:
            one = torch.ones((), device="cuda")
            dense = lambda a, b: torch._scaled_mm(a, b, scale_a=one, scale_b=one,  # noqa: E731
                                                  out_dtype=torch.bfloat16)
            kern["fprop"]["fp8_dense"] = [lambda q=q: dense(q[0][0], wq[0][0].t()) for q in qs]
            kern["dgrad"]["fp8_dense"] = [lambda q=q: dense(q[1][0], wqt[0][0].t()) for q in qs]
            kern["wgrad"]["fp8_dense"] = [lambda q=q: dense(q[2][0], q[3][0].t()) for q in qs]
        checks = {}
        for name, sched in extra.items():
            for p in PASSES:
                kern[p][name] = [with_schedule(f, sched) for f in kern[p]["mx128_cutlass"]]
                ours, got = kern[p]["mx128_cutlass"][0](), kern[p][name][0]()
                checks[(p, name)] = {"rel_vs_ours": float(f"{rel(got, ours):.3g}")}
                del ours, got
        for p in args.passes.split(","):
            dg_fns, dg_outs = [], []
            try:
                for q in qs:
                    if p == "fprop":
                        a = (q[0][0], mn_major(f32(q[0][1], 1)))
                        fn, out = dg_calls(dg, p, a, dg_b[p], sizes, layout_m, layout_k)
                    elif p == "dgrad":
                        a = (q[1][0], mn_major(f32(q[1][1], 1)))
                        fn, out = dg_calls(dg, p, a, dg_b[p], sizes, layout_m, layout_k)
                    else:
                        a = (per_group_kmajor(q[2][0], sizes), mn_major(f32(q[2][1], 1)))
                        b = (per_group_kmajor(q[3][0], sizes), mn_major(f32(q[3][1], 1)))
                        fn, out = dg_calls(dg, p, a, b, sizes, layout_m, layout_k)
                    dg_fns.append(fn)
                    dg_outs.append(out)
                t0 = time.time()
                dg_fns[0]()  # JIT compile on first use (a cache hit after the device script's --warm)
                torch.cuda.synchronize()
                jit_s = time.time() - t0
                ours = kern[p]["mx128_cutlass"][0]()
                torch.cuda.synchronize()
                checks[(p, "deepgemm")] = {"rel_vs_ours": float(f"{rel(dg_outs[0], ours):.3g}"),
                                           "first_call_s": round(jit_s, 2)}
                del ours
                kern[p]["deepgemm"] = dg_fns
            except Exception as e:  # a failing DeepGEMM call is a row, the rest still runs
                rec(shape=shape, pass_=p, variant="deepgemm", error=repr(e)[:400])
        for p in args.passes.split(","):
            res = interleaved_ms(kern[p], args.rounds)
            for v, (ms, iqr) in res.items():
                r = dict(shape=shape, K=K, N=N, pass_=p, variant=v, ms=round(ms, 4),
                         TFLOPs=round(flops / ms / 1e9, 1), iqr=round(iqr, 3))
                if v != "bf16":
                    r["vs_bf16"] = round(res["bf16"][0] / ms, 3)
                if v == "deepgemm" or v in extra:
                    r["vs_ours"] = round(res["mx128_cutlass"][0] / ms, 3)  # >1: faster than our default kernels
                    r.update(checks.get((p, v), {}))
                rec(**r)
        del sets, w, wq, wqt, qs, kern, dg_b
        torch.cuda.empty_cache()
    print_table(meta, rows, time.time() - t_start)
    print("wrote", write_json(meta, rows))


def print_table(meta, rows, secs):
    print(f"\nDeepGEMM anchor, {meta['device']}, torch {meta['torch']}, deep_gemm {meta['deep_gemm']} "
          f"({(meta['deep_gemm_commit'] or '?')[:10]}), E={E} x {TPE} tokens, even, {secs:.0f}s")
    print(f"{'shape':10s} {'pass':6s} {'variant':14s} {'ms':>8s} {'TFLOP/s':>8s} {'vs bf16':>8s} {'vs ours':>8s} "
          f"{'rel':>9s} {'iqr':>6s}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:10s} {r['pass_']:6s} {r['variant']:14s} ERROR {r['error'][:100]}")
            continue
        print(f"{r['shape']:10s} {r['pass_']:6s} {r['variant']:14s} {r['ms']:8.3f} {r['TFLOPs']:8.1f} "
              f"{r.get('vs_bf16', ''):>8} {r.get('vs_ours', ''):>8} {r.get('rel_vs_ours', ''):>9} {r['iqr']:>6}")


def write_json(meta, rows):
    from benchmarks.results_json import write_results
    return write_results("deepgemm_anchor", meta, rows)


if __name__ == "__main__":
    main()
