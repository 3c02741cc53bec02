"""Where the mx32 MXFP8 Linear's time goes on one GPU (diagnostic; speed claims stay with float8_linear.py):

  python benchmarks/mx32_linear_probe.py [--calls 200] [--out DIR]

1. Host time per call (tiny problem, 256 x 256 x 256, one group: the GPU finishes each call before the host issues
   the next, so the loop time is the host time) of the Gluon launch path's pieces (the factor tables, the TMA
   descriptors, the launch helper, the custom op, the public function) and of a whole Linear fwd+bwd, eager and
   compiled, for linear_granularity "mx32" / "mx32_tile32" / "mx128" and bf16; then a cProfile (own time per
   Python function) of launch_nt and of the eager mx32 step.
2. GPU time and TB/s (bytes read + written) of kernels.grouped_gemm.quant_triton.to_mxfp8_blocked_rowcol in each
   layout the mx128 and mx32 paths launch, at the Linear's 8192 x 4096 and the experts' 65536 x 7168 (dsv3_up x),
   at rowcol_launch's choice and at 4 / 8 / 16 warps (--quant-warps), beside a copy of x
   (benchmarks/cuda_timing.interleaved_ms: round-robin).
Writes mx32_linear_probe-<device>-<date>.json under --out (default benchmarks/results/).
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from benchmarks.host_overhead_probe import host_us  # noqa: E402
from benchmarks.results_json import write_results  # noqa: E402


def host_rows(calls):
    import kernels.grouped_gemm as gg
    from kernels.grouped_gemm import gluon_mx as gm
    from kernels.grouped_gemm.nt_output import nt_output
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol as q
    from titan_fp8.float8 import Float8Config, convert_to_float8_training

    M = K = N = 256
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    xq, xs, xtq, xts = q(x, row_block=32, col_block=32, col_tile=128)
    wq, ws = q(w, row_block=128, row_tile=128, do_col=False)[:2]
    offs = torch.full((1,), M, dtype=torch.int32, device="cuda")
    b3, s3 = wq.unsqueeze(0), ws.unsqueeze(0)
    gq, gs, gtq, gts = q(x, row_block=32, col_block=32, col_tile=1)
    pieces = {
        "quantizer x rows + x^T tiles (eager launch)": lambda: q(x, row_block=32, col_block=32, col_tile=128),
        "e8m0_table(a scales)": lambda: gm.e8m0_table(xs),
        "B factor table (e8m0_table + _padded)":
            lambda: gm._padded(gm.e8m0_table(s3[:, ::128, :].reshape(-1, K // 32))),
        "e8m0_group_table(dO^T scales)": lambda: gm.e8m0_group_table(gts, offs, M),
        "TMA descriptor (_desc)": lambda: gm._desc(xq, [128, 128]),
        "factor descriptor (_factor_desc)": lambda: gm._factor_desc(gm.e8m0_table(xs), 128),
        "nt_output": lambda: nt_output(xq, b3, torch.bfloat16),
        "get_device_properties": lambda: torch.cuda.get_device_properties(x.device).multi_processor_count,
        "launch_nt (fprop, all of it)": lambda: gm.launch_nt(xq, xs, b3, s3, offs, torch.bfloat16),
        "launch_wgrad (all of it)": lambda: gm.launch_wgrad(gtq, gts, xtq, xts, offs, torch.bfloat16),
        "fprop gluon custom op": lambda: gg._fprop_gluon_op(xq, xs, b3, s3, offs, torch.bfloat16, 32, 128),
        "mxfp8_grouped_mm_fprop (public, validate=False)": lambda: gg.mxfp8_grouped_mm_fprop(
            xq, xs, b3, s3, offs, torch.bfloat16, block=32, w_tile=128, validate=False),
    }
    rows = []
    for name, fn in pieces.items():
        h, wall = host_us(fn, calls)
        rows.append({"part": "host", "what": name, "host_us": round(h, 1), "wall_us": round(wall, 1)})
        print(f"  host {name:52s} {h:8.1f} us/call (wall {wall:8.1f})", flush=True)
    from kernels.grouped_gemm import quant_triton
    real_launch = quant_triton.rowcol_launch
    variants = {"bf16": None, "mx32": "mx32", "mx32_w8": "mx32", "mx32_tile32": "mx32_tile32", "mx128": "mx128"}
    for compiled in (False, True):
        for name, gran in variants.items():
            # mx32_w8: every quantizer launch at 8 warps (before session 28's rowcol_warps)
            quant_triton.rowcol_launch = (lambda *layout: (128, 128, 8)) if name == "mx32_w8" else real_launch
            torch._dynamo.reset()
            lin = nn.Sequential(nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16))
            if gran:
                convert_to_float8_training(lin, Float8Config(recipe_name="mxfp8", linear_granularity=gran,
                                                             filter_fqns=()))
            f = torch.compile(lin) if compiled else lin
            xg = x.clone().requires_grad_()

            def step():
                f(xg).sum().backward()
            frames0 = dict(torch._dynamo.utils.counters["frames"])
            h, wall = host_us(step, calls // 4)
            what = f"Linear fwd+bwd {name} {'compiled' if compiled else 'eager'}"
            if compiled:  # recompiles would show as more frames than the warm-up's
                print(f"    dynamo frames before/after the timed steps: {frames0} / "
                      f"{dict(torch._dynamo.utils.counters['frames'])}", flush=True)
            rows.append({"part": "host", "what": what, "host_us": round(h, 1), "wall_us": round(wall, 1)})
            print(f"  host {what:52s} {h:8.1f} us/step (wall {wall:8.1f})", flush=True)
    quant_triton.rowcol_launch = real_launch
    return rows


def profile_rows(calls):
    """Python-level profile (cProfile, top functions by own time) of launch_nt and of one eager mx32 Linear step at
    the tiny shape: which host code the time is spent in."""
    import cProfile
    import io
    import pstats

    from kernels.grouped_gemm import gluon_mx as gm
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol as q
    from titan_fp8.float8 import Float8Config, convert_to_float8_training

    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    xq, xs, _, _ = q(x, row_block=32, col_block=32, col_tile=128)
    wq, ws = q(x, row_block=128, row_tile=128, do_col=False)[:2]
    offs = torch.full((1,), 256, dtype=torch.int32, device="cuda")
    lin = nn.Sequential(nn.Linear(256, 256, bias=False, device="cuda", dtype=torch.bfloat16))
    convert_to_float8_training(lin, Float8Config(recipe_name="mxfp8", linear_granularity="mx32", filter_fqns=()))
    xg = x.clone().requires_grad_()
    rows = []
    for what, fn in (("launch_nt", lambda: gm.launch_nt(xq, xs, wq[None], ws[None], offs, torch.bfloat16)),
                     ("mx32 Linear fwd+bwd eager", lambda: lin(xg).sum().backward())):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        text = buf.getvalue()
        print(f"== cProfile {what} ({calls} calls)\n" + "\n".join(text.splitlines()[:45]), flush=True)
        rows.append({"part": "profile", "what": what, "calls": calls, "text": text})
    return rows


def torch_profile_rows(steps=20):
    """torch.profiler (CPU + CUDA) of `steps` eager and compiled mx32 Linear steps at the tiny shape: the ops and CUDA
    runtime calls by own CPU time (a synchronizing call shows up here as a long runtime call)."""
    from torch.profiler import ProfilerActivity, profile

    from titan_fp8.float8 import Float8Config, convert_to_float8_training

    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    rows = []
    for compiled in (False, True):
        torch._dynamo.reset()
        lin = nn.Sequential(nn.Linear(256, 256, bias=False, device="cuda", dtype=torch.bfloat16))
        convert_to_float8_training(lin, Float8Config(recipe_name="mxfp8", linear_granularity="mx32", filter_fqns=()))
        f = torch.compile(lin) if compiled else lin
        xg = x.clone().requires_grad_()
        for _ in range(10):
            f(xg).sum().backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                f(xg).sum().backward()
            torch.cuda.synchronize()
        text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)
        what = f"mx32 Linear {'compiled' if compiled else 'eager'} x{steps}"
        print(f"== torch.profiler {what}\n{text}", flush=True)
        rows.append({"part": "torch_profile", "what": what, "text": text})
    return rows


def quant_rows(warps=(None, 4, 8, 16), only=""):
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol as q
    rows = []
    for label, M, K in (("linear 8192x4096", 8192, 4096), ("dsv3_up x 65536x7168", 65536, 7168)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        n2 = x.numel() * 2
        layouts = {
            "copy x": (lambda nw: x.clone(), 2 * n2),
            "mx128 rows + 128x128 x^T tiles": (lambda nw: q(x, row_block=128, col_block=128, col_tile=128,
                                                          num_warps=nw), 2 * n2),
            "mx128 rows + 1x128 g^T": (lambda nw: q(x, row_block=128, col_block=128, col_tile=1, num_warps=nw),
                                       2 * n2),
            "mx128 128x128 tiles (w)": (lambda nw: q(x, row_block=128, row_tile=128, do_col=False, num_warps=nw),
                                        1.5 * n2),
            "mx32 rows + 32x128 x^T tiles": (lambda nw: q(x, row_block=32, col_block=32, col_tile=128, num_warps=nw),
                                            2 * n2),
            "mx32 rows + 1x32 g^T": (lambda nw: q(x, row_block=32, col_block=32, col_tile=1, num_warps=nw), 2 * n2),
            "mx32 rows only": (lambda nw: q(x, row_block=32, do_col=False, num_warps=nw), 1.5 * n2),
            "mx32 1x32 x^T only": (lambda nw: q(x, col_block=32, col_tile=1, do_row=False, num_warps=nw), 1.5 * n2),
            "mx32 32x128 x^T tiles only": (lambda nw: q(x, col_block=32, col_tile=128, do_row=False, num_warps=nw),
                                           1.5 * n2),
            "128x32 w regions (op's w)": (lambda nw: q(x, row_block=32, row_tile=128, do_col=False, num_warps=nw),
                                          1.5 * n2),
        }
        fns = {}
        for name, (fn, nbytes) in layouts.items():
            if only and name != "copy x" and not any(o in name for o in only.split(",")):
                continue
            for nw in ((None,) if name == "copy x" else warps):
                fns[(name, nw)] = (lambda fn=fn, nw=nw: fn(nw), nbytes)
        for f, _ in fns.values():  # compile / autotune outside the timing
            f()
        ms = interleaved_ms({k: [f] for k, (f, _) in fns.items()}, rounds=15)
        for (name, nw), (_, nbytes) in fns.items():
            t = ms[(name, nw)][0]
            rows.append({"part": "quant", "shape": label, "what": name, "num_warps": nw or "rowcol_launch",
                         "ms": round(t, 4), "TBps": round(nbytes / t / 1e9, 3)})
            print(f"  {label:22s} {name:34s} warps {str(nw or 'auto'):5s} {t:8.4f} ms {nbytes / t / 1e9:6.3f} TB/s",
                  flush=True)
        x = fns = layouts = None  # free before the next shape
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: host,profile,torchprof,quant")
    ap.add_argument("--quant-warps", default="auto,4,8,16", help="quantizer warps to time (auto: rowcol_launch's)")
    ap.add_argument("--quant-only", default="", help="comma list of substrings: time only the layouts naming one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.out:
        os.environ["OUT"] = args.out
    skip = set(args.skip.split(","))
    rows = []
    if "host" not in skip:
        rows += host_rows(args.calls)
    if "profile" not in skip:
        rows += profile_rows(args.calls)
    if "torchprof" not in skip:
        rows += torch_profile_rows()
    if "quant" not in skip:
        warps = tuple(None if w == "auto" else int(w) for w in args.quant_warps.split(","))
        rows += quant_rows(warps, args.quant_only)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "command": "python " + " ".join(sys.argv)}
    print("wrote", write_results("mx32_linear_probe", meta, rows))


if __name__ == "__main__":
    main()
