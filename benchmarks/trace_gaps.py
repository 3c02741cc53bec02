"""Where does the GPU wait? Read a Chrome trace that `[profiling]` wrote (or any torch.profiler trace with CUDA
activity) and print how busy the GPU was over the step, and which host work its idle gaps fall under.

    python benchmarks/trace_gaps.py outputs/run/profile_traces/iteration_10/rank0_trace.json [--top 20]
        [--min-gap-us 30] [--json OUT.json]

GPU busy = the union of kernel / memcpy / memset intervals; a gap = a stretch with none running. Each gap of at
least --min-gap-us is attributed to the innermost host op (cpu_op / user_annotation / python_function) that
spans all of it, with its two enclosing ops ("<" reads "inside"); gaps that no single host op spans are listed
by the GPU activity that ended them. A step whose idle time sits under FSDP hooks, compiled-graph calls or
autograd Functions is host-bound there: the host was still issuing the work the GPU waited for.

--exposed N also lists the N NCCL kernels with the most time during which no other GPU work ran (communication
the compute waited for; an NCCL kernel's own duration says little, it spins while its peer is late), each with
the host ops that launched it (via the launch's correlation id) and where in the span it started.

--host N lists, per host thread (the main thread runs the forward, the autograd thread the backward), its busy
time and the N host op names with the most self time (their time less that of the host ops inside them) and
with the most inclusive time: where the host's issue time goes. Names are cut at 60 characters, with digits
after '#' or in hashes of compiled graphs folded, so every call of one kind adds up.
"""
from __future__ import annotations

import argparse
import collections
import bisect
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


def _host_name(name: str) -> str:
    # fold per-call parts: "## Call CompiledFxGraph f52dn3... ##" and "ProfilerStep#25" add up per kind
    if "CompiledFxGraph" in name:
        return "## Call CompiledFxGraph (any) ##"
    return name.split("#")[0][:60] if "#" in name and not name.startswith("#") else name[:60]


def host_time(events: list[dict]) -> list[dict]:
    """Per host thread: busy ms (the union of its top-level host ops), and per op name the self and inclusive
    ms and the calls. Self = duration less that of the host ops nested in it on the same thread."""
    by_tid = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_CATS:
            by_tid[(e.get("pid"), e.get("tid"))].append(e)
    out = []
    for tid, evs in by_tid.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        self_us, incl_us, calls = collections.Counter(), collections.Counter(), collections.Counter()
        stack: list[list] = []  # [end, name, child time]
        busy, top_end = 0.0, -1.0

        def pop():
            end, name, child, dur = stack.pop()
            self_us[name] += dur - child
        for e in evs:
            start, dur = e["ts"], e["dur"]
            while stack and stack[-1][0] <= start:
                pop()
            name = _host_name(e["name"])
            if stack:
                stack[-1][2] += dur
            else:
                busy += max(0.0, start + dur - max(start, top_end))
                top_end = max(top_end, start + dur)
            # a name nested in itself (recursion) counts its outermost call only in the inclusive time
            if not any(s[1] == name for s in stack):
                incl_us[name] += dur
            calls[name] += 1
            stack.append([start + dur, name, 0.0, dur])
        while stack:
            pop()
        out.append({"thread": str(tid[1]), "busy_ms": round(busy / 1e3, 3),
                    "ops": [{"op": k, "self_ms": round(self_us[k] / 1e3, 3), "incl_ms": round(incl_us[k] / 1e3, 3),
                             "calls": calls[k]} for k in incl_us]})
    out.sort(key=lambda t: -t["busy_ms"])
    return out


def _is_nccl(e: dict) -> bool:
    return "nccl" in e["name"].lower()


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(merged: list[tuple[float, float]], a: float, b: float) -> float:
    """How much of [a, b) the merged intervals cover."""
    i = bisect.bisect_right(merged, (a, float("inf"))) - 1
    i = max(i, 0)
    got = 0.0
    while i < len(merged) and merged[i][0] < b:
        lo, hi = max(a, merged[i][0]), min(b, merged[i][1])
        got += max(0.0, hi - lo)
        i += 1
    return got


def exposed_comm(events: list[dict]) -> tuple[float, list[dict]]:
    """(us during which an NCCL kernel ran and no other GPU activity did, [one row per NCCL kernel with exposed
    time: exposed_ms, ms, kernel, host (the launching host ops, innermost first), at_ms (start, from the span's
    start)], most exposed first)."""
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    if not gpu:
        raise SystemExit("trace_gaps: no GPU activity in the trace (profiled without CUDA?)")
    t0 = min(e["ts"] for e in gpu)
    compute = _merged([(e["ts"], e["ts"] + e["dur"]) for e in gpu if not _is_nccl(e)])
    nccl = [e for e in gpu if _is_nccl(e)]
    only_nccl = _merged([(e["ts"], e["ts"] + e["dur"]) for e in nccl])
    total = sum(b - a - _covered(compute, a, b) for a, b in only_nccl)
    launch = {e.get("args", {}).get("correlation"): e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation") is not None}
    host = [e for e in events if e.get("cat") in HOST_CATS]
    rows = []
    for e in nccl:
        a, b = e["ts"], e["ts"] + e["dur"]
        exposed = (b - a) - _covered(compute, a, b)
        if exposed <= 0:
            continue
        at = launch.get(e.get("args", {}).get("correlation"))
        spans = sorted((h for h in host if at is not None and h["ts"] <= at <= h["ts"] + h["dur"]),
                       key=lambda h: h["dur"])
        rows.append({"exposed_ms": round(exposed / 1e3, 3), "ms": round(e["dur"] / 1e3, 3), "kernel": e["name"][:40],
                     "host": " < ".join(h["name"][:40] for h in spans[:4]) or "(launch not in the trace)",
                     "at_ms": round((a - t0) / 1e3, 2)})
    rows.sort(key=lambda r: -r["exposed_ms"])
    return total, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--min-gap-us", type=float, default=30.0)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--kernels", type=int, default=0, help="also print the N kernels with the most GPU time")
    ap.add_argument("--exposed", type=int, default=0,
                    help="also print the N NCCL kernels with the most time that no other GPU work overlapped")
    ap.add_argument("--host", type=int, default=0,
                    help="also print, per host thread, the N host ops with the most self and inclusive time")
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
    exposed_us, exposed = exposed_comm(events)
    if args.exposed:
        print(f"NCCL alone on the GPU (nothing else running) {exposed_us / 1e3:.2f} ms ({100 * exposed_us / span:.1f}% "
              f"of the span); the {args.exposed} NCCL kernels with the most of it:")
        print(f"{'alone ms':>9} {'of ms':>7} {'at ms':>7}  kernel  < launched under")
        for r in exposed[:args.exposed]:
            print(f"{r['exposed_ms']:9.3f} {r['ms']:7.3f} {r['at_ms']:7.2f}  {r['kernel']}  < {r['host']}")
    threads = host_time(events) if args.host else []
    for t in threads[:3]:
        print(f"host thread {t['thread']}: busy {t['busy_ms']:.2f} ms; by self time, then by inclusive time:")
        for key in ("self_ms", "incl_ms"):
            for op in sorted(t["ops"], key=lambda o: -o[key])[:args.host]:
                print(f"  {op[key]:9.3f} {op['calls']:6d}  {op['op']}")
            print("  --")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "span_ms": span / 1e3, "busy_ms": busy / 1e3, "gaps": len(gaps),
                       "by_host_op": rows, "kernels": kernels[:200], "nccl_alone_ms": exposed_us / 1e3,
                       "nccl_exposed": exposed,
                       "host_threads": [{**t, "ops": sorted(t["ops"], key=lambda o: -o["self_ms"])[:100]}
                                        for t in threads]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
