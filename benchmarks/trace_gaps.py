"""Where does the GPU wait? Read a Chrome trace that `[profiling]` wrote (or any torch.profiler trace with CUDA
activity) and print how busy the GPU was over the step, and which host work its idle gaps fall under.

    python benchmarks/trace_gaps.py outputs/run/profile_traces/iteration_10/rank0_trace.json [--top 20]
        [--min-gap-us 30] [--json OUT.json]

GPU busy = the union of kernel / memcpy / memset intervals; a gap = a stretch with none running. Each gap of at
least --min-gap-us is attributed to the innermost host op (cpu_op / user_annotation / python_function) that
spans all of it, with its two enclosing ops ("<" reads "inside"); gaps that no single host op spans are listed
by the GPU activity that ended them. A step whose idle time sits under FSDP hooks, compiled-graph calls or
autograd Functions is host-bound there: the host was still issuing the work the GPU waited for.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation", "python_function")


def load_events(path: str) -> list[dict]:
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"trace_gaps: cannot read {path}: {e}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise SystemExit(f"trace_gaps: {path} has no traceEvents list (not a Chrome trace from torch.profiler)")
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def gpu_gaps(events: list[dict]) -> tuple[float, float, list[tuple[float, float, str]]]:
    """(span us, busy us, [(gap us, gap start, name of the GPU activity that ended it)])."""
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    if not gpu:
        raise SystemExit("trace_gaps: no GPU activity in the trace (profiled without CUDA?)")
    start, end, busy, gaps = gpu[0]["ts"], gpu[0]["ts"], 0.0, []
    for e in gpu:
        if e["ts"] > end:
            gaps.append((e["ts"] - end, end, e["name"]))
        stop = e["ts"] + e["dur"]
        if stop > end:
            busy += stop - max(e["ts"], end)
            end = stop
    return end - start, busy, gaps


def attribute(events: list[dict], gaps, min_gap_us: float) -> list[dict]:
    host = sorted((e for e in events if e.get("cat") in HOST_CATS), key=lambda e: e["ts"])
    total, count = collections.Counter(), collections.Counter()
    for dur, t0, ended_by in gaps:
        if dur < min_gap_us:
            continue
        t1 = t0 + dur
        spans = sorted((h for h in host if h["ts"] <= t0 and h["ts"] + h["dur"] >= t1), key=lambda h: h["dur"])
        key = (" < ".join(h["name"][:48] for h in spans[:3]) if spans
               else f"(no host op spans it) before {ended_by[:60]}")
        total[key] += dur
        count[key] += 1
    return [{"host": k, "idle_ms": round(v / 1e3, 3), "gaps": count[k]} for k, v in total.most_common()]


def kernel_totals(events: list[dict]) -> list[dict]:
    """GPU time per kernel name (summed durations; NCCL kernels run on their own streams beside the compute and
    spin while they wait, so they overlap the rest), largest first."""
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") in GPU_CATS:
            total[e["name"][:100]] += e["dur"]
            count[e["name"][:100]] += 1
    return [{"kernel": k, "ms": round(v / 1e3, 3), "calls": count[k]} for k, v in total.most_common()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--min-gap-us", type=float, default=30.0)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--kernels", type=int, default=0, help="also print the N kernels with the most GPU time")
    args = ap.parse_args(argv)
    events = load_events(args.trace)
    span, busy, gaps = gpu_gaps(events)
    rows = attribute(events, gaps, args.min_gap_us)
    idle = span - busy
    print(f"{args.trace}\nGPU span {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms ({100 * busy / span:.1f}%), idle "
          f"{idle / 1e3:.2f} ms in {len(gaps)} gaps ({sum(1 for g in gaps if g[0] >= args.min_gap_us)} of at least "
          f"{args.min_gap_us:g} us)")
    print(f"{'idle ms':>9} {'gaps':>5}  host work the GPU waited under")
    for r in rows[:args.top]:
        print(f"{r['idle_ms']:9.2f} {r['gaps']:5d}  {r['host']}")
    kernels = kernel_totals(events)
    if args.kernels:
        compute = sum(k["ms"] for k in kernels if "nccl" not in k["kernel"].lower())
        print(f"GPU time of non-NCCL activity {compute:.2f} ms; the {args.kernels} largest:")
        for k in kernels[:args.kernels]:
            print(f"{k['ms']:9.3f} {k['calls']:5d}  {k['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "span_ms": span / 1e3, "busy_ms": busy / 1e3, "gaps": len(gaps),
                       "by_host_op": rows, "kernels": kernels[:200]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
