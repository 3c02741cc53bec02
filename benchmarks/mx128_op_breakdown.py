"""Where the time of the whole MXFP8 grouped-GEMM op goes (fwd+bwd, quantization included): GPU time per kernel
and per iteration under torch.profiler, beside bf16 `torch._grouped_mm` fwd+bwd, at the shapes of
benchmarks/mxfp8_grouped_gemm_backends.py (E = 8 x 8192 tokens).

    python benchmarks/mx128_op_breakdown.py [--shapes dsv3_up,llama_up] [--routing even] [--iters 10]
        [--ops bf16,op_mx128_cutlass]     (also op_mx128_triton, op_mx32_gluon, op_mx32_gluon_s28, op_*_tq, torchao_fp8_rowwise,
                                           op_mx128_cutlass_w1, op_mx128_deepgemm_w1: benchmarks/mx128_op_variants.py)
        [--sustain-s 2]                   (then each op back to back for that long: unix start/end times in the JSON,
                                           to read beside an nvidia-smi clock/power log of the same run)
        [--smi-log F]                     (that log, `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw
                                           --format=csv,noheader -lms 100`: mean SM clock / power per sustained op)

Per op: wall ms per iteration (CUDA events around --iters back-to-back iterations), GPU-busy ms per iteration
(the union of kernel intervals in the profiled iterations), and each kernel's ms per iteration and share of the
busy time, grouped into GEMM / quantization / other by name. Diagnostic only: the speed claims stay with the
round-robin timing of mxfp8_grouped_gemm_backends.py. Writes JSON (device, date, versions, command) to $OUT or
benchmarks/results/.
"""
import argparse
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.mxfp8_grouped_gemm_backends import (  # noqa: E402
    E,
    SHAPES,
    TPE,
    fwd_bwd,
    launch_rule_s28,
    routings,
    with_env,
    with_quant_launch,
)
from benchmarks.cuda_timing import smi_means  # noqa: E402
from benchmarks.results_json import write_results  # noqa: E402
from benchmarks.trace_gaps import gpu_gaps  # noqa: E402

GEMM_KEYS = ("gemm", "Gemm", "cutlass", "sm90", "grouped_mm", "_nt_", "wgrad", "xmma", "nvjet")
QUANT_KEYS = ("quant", "mxfp8", "amax", "scale", "rowcol", "fp8", "wt_tile")


def kind(name: str) -> str:
    if any(k in name for k in GEMM_KEYS):
        return "gemm"
    if any(k in name for k in QUANT_KEYS):
        return "quant"
    return "other"


def make_ops(names):
    from titan_fp8.float8 import experts
    mm = experts.mxfp8_grouped_mm
    ops = {"bf16": lambda x, w, o: torch._grouped_mm(x, w.transpose(-2, -1), offs=o),
           "op_mx128_cutlass": lambda x, w, o: mm(x, w, o, granularity="mx128", backend="cutlass", token_align=128),
           "op_mx128_triton": lambda x, w, o: mm(x, w, o, granularity="mx128", backend="triton"),
           "op_mx32_gluon": lambda x, w, o: mm(x, w, o, granularity="mx32", backend="gluon")}
    # the same op with its quantizers launched as session 28 left them (128 x 128 programs)
    ops["op_mx32_gluon_s28"] = with_quant_launch(ops["op_mx32_gluon"], launch_rule_s28)
    for name in ("op_mx128_cutlass", "op_mx32_gluon"):  # x / dO copies on the Triton kernel (before session 30)
        ops[name + "_tq"] = with_env(ops[name], "TITAN_FP8_ROWCOL_QUANT", "triton")
    from benchmarks.mx128_op_variants import mx128_op_variant  # both weight copies from one read (+ DeepGEMM)
    ops["op_mx128_cutlass_w1"] = lambda x, w, o: mx128_op_variant(x, w, o, gemm="cutlass")
    if "op_mx128_deepgemm_w1" in names:
        import deep_gemm  # noqa: F401  (built by benchmarks/deepgemm_device_run.sh; an ImportError names it)
        ops["op_mx128_deepgemm_w1"] = lambda x, w, o: mx128_op_variant(x, w, o, gemm="deepgemm")
    try:
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm as tao
        ops["torchao_fp8_rowwise"] = lambda x, w, o: tao(x, w.transpose(-2, -1), o,
                                                         pad_token_groups_for_grouped_mm=False)
    except ImportError:
        pass
    unknown = [n for n in names if n not in ops]
    if unknown:
        raise SystemExit(f"--ops: {unknown} unknown or unavailable; allowed: {', '.join(ops)}")
    return {n: ops[n] for n in names}


def profile_op(fn, x, w, go, offs, iters, sustain_s=0.0):
    def step():
        x.grad = w.grad = None
        fwd_bwd(fn, x, w, offs, go)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(iters):
        step()
    t1.record()
    torch.cuda.synchronize()
    wall = t0.elapsed_time(t1) / iters
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    path = f"/tmp/op_breakdown_{os.getpid()}.json"
    prof.export_chrome_trace(path)
    import json
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    os.remove(path)
    _, busy, _ = gpu_gaps(events)
    sustained = {}
    if sustain_s > 0:  # the op back to back, as the benchmark's rows run it: its clock/power are in the smi log
        n, t_start = 0, time.time()
        while time.time() - t_start < sustain_s:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            n += 5
        t_end = time.time()
        sustained = {"t_start": round(t_start, 3), "t_end": round(t_end, 3), "iters": n,
                     "ms_per_iter": round(1e3 * (t_end - t_start) / n, 4)}
    per = {}
    for e in events:
        if e.get("cat") == "kernel":
            n = e["name"][:90]
            ms, calls = per.get(n, (0.0, 0))
            per[n] = (ms + e["dur"] / 1e3, calls + 1)
    kernels = sorted(({"kernel": n, "kind": kind(n), "ms_per_iter": round(ms / iters, 4),
                       "calls_per_iter": calls / iters} for n, (ms, calls) in per.items()),
                     key=lambda r: -r["ms_per_iter"])
    return {"wall_ms": round(wall, 4), "busy_ms": round(busy / 1e3 / iters, 4), "kernels": kernels,
            "sustained": sustained}


def quant_calls(shape, offs, reps=20):
    """The op's four quantizer launches one by one (mx128: x rows + 128x128 token-major tiles, w 128x128 tiles along
    in, dO rows + 1x128 token-major, w^T tiles along out), autotuned and at fixed warps, beside a copy of x."""
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol as q
    K, N = SHAPES[shape]
    M = E * TPE
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    lim = offs[-1:]
    calls = {
        "copy x": (lambda nw: x.clone(), 4 * x.numel()),
        "x rows+tiles": (lambda nw: q(x, row_block=128, col_block=128, col_tile=128, limit=lim, num_warps=nw),
                         4 * x.numel()),
        "w tiles along in": (lambda nw: q(w, row_block=128, row_tile=128, do_col=False, num_warps=nw), 3 * w.numel()),
        "dO rows+cols": (lambda nw: q(d, row_block=128, col_block=128, col_tile=1, limit=lim, num_warps=nw),
                         4 * d.numel()),
        "w^T tiles along out": (lambda nw: q(w, col_block=128, col_tile=128, do_row=False, num_warps=nw),
                                3 * w.numel()),
    }
    rows = []
    for name, (fn, nbytes) in calls.items():
        for nw in ((None,) if name == "copy x" else (None, 4, 8, 16)):
            for _ in range(3):
                fn(nw)
            torch.cuda.synchronize()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for a, b in ev:
                a.record()
                fn(nw)
                b.record()
            torch.cuda.synchronize()
            ms = sorted(a.elapsed_time(b) for a, b in ev)[reps // 2]
            rows.append({"shape": shape, "call": name, "num_warps": nw or "autotuned", "ms": round(ms, 4),
                         "TBps": round(nbytes / ms / 1e9, 3)})
            print(f"  {shape:9s} {name:20s} warps {str(nw or 'auto'):5s} {ms:8.4f} ms {nbytes / ms / 1e9:6.3f} TB/s",
                  flush=True)
    del x, w, d
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="dsv3_up,llama_up")
    ap.add_argument("--routing", default="even")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ops", default="bf16,op_mx128_cutlass")
    ap.add_argument("--sustain-s", type=float, default=0.0,
                    help="then run each op back to back this long (its unix start/end in the JSON)")
    ap.add_argument("--smi-log", default="", help="nvidia-smi log of this run: clock/power per sustained op")
    ap.add_argument("--quant", action="store_true", help="also time the op's four quantizer launches one by one")
    args = ap.parse_args()
    ops = make_ops([o for o in args.ops.split(",") if o])
    meta = {"device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "command": "python " + " ".join(sys.argv), "experts": E, "tokens_per_expert": TPE}
    rows = []
    M = E * TPE
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        torch.manual_seed(0)
        offs = torch.tensor(routings(M)[args.routing], device="cuda").cumsum(0).to(torch.int32)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
        go = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        for name, fn in ops.items():
            r = profile_op(fn, x, w, go, offs, args.iters, args.sustain_s)
            r.update(shape=shape, routing=args.routing, op=name)
            if args.smi_log and r["sustained"]:
                r["sustained"].update(smi_means(args.smi_log, [(r["sustained"]["t_start"], r["sustained"]["t_end"])]))
            rows.append(r)
            by_kind = {}
            for k in r["kernels"]:
                by_kind[k["kind"]] = by_kind.get(k["kind"], 0.0) + k["ms_per_iter"]
            print(f"\n== {shape} {args.routing} {name}: wall {r['wall_ms']:.3f} ms/iter, GPU busy {r['busy_ms']:.3f}; "
                  + ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_kind.items()))
                  + (f"; sustained {r['sustained']['ms_per_iter']:.3f} ms/iter" if r["sustained"] else "")
                  + (f" at {r['sustained']['sm_mhz']} MHz, {r['sustained']['watts']} W"
                     if r["sustained"].get("sm_mhz") else ""), flush=True)
            for k in r["kernels"][:14]:
                print(f"  {k['ms_per_iter']:8.3f} ms {100 * k['ms_per_iter'] / r['busy_ms']:5.1f}%  "
                      f"x{k['calls_per_iter']:<4g} {k['kind']:5s} {k['kernel']}")
        del x, w, go
        torch.cuda.empty_cache()
        if args.quant:
            rows += quant_calls(shape, offs)
        write_results("mx128_op_breakdown", meta, rows)
    print("wrote", write_results("mx128_op_breakdown", meta, rows))


if __name__ == "__main__":
    main()
