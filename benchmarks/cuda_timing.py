"""Timing shared by the benchmarks: CUDA-graph replays (no host launch cost in the number), round-robin and
steady-state timing of several variants with CUDA events."""
import datetime
import time

import torch


def graph_ms(fn, calls, replays=7):
    """Median over `replays` of (one replay of a graph holding `calls` launches of fn) / calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch.cuda.graphs asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del g
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def interleaved_ms(fns, rounds, event=None, synchronize=None):
    """Per variant: (median ms, interquartile range / median) of its calls, timed round-robin.

    fns: {variant: [callable, ...]}; each round calls every variant once (cycling through its callables: rotating
    input sets), each call bracketed by CUDA events on the current stream. Variants timed one after another
    (triton's do_bench per variant) see different clocks: on an H100 at its 700 W cap the same CUTLASS kernel read
    1.308 and 1.512 ms in one run (session 15). Round-robin gives every variant the same clock and thermal history,
    so ratios between them hold even when the absolute times drift; the order rotates from round to round, so
    no variant always runs in the same position. `event` / `synchronize` default to
    torch.cuda.Event(enable_timing=True) / torch.cuda.synchronize (tests pass fakes)."""
    event = event or (lambda: torch.cuda.Event(enable_timing=True))
    synchronize = synchronize or torch.cuda.synchronize
    names = list(fns)
    marks = {v: [] for v in names}
    for r in range(rounds):
        # each round starts one variant later: a position in the round (right after bf16, first after the
        # previous round's last kernel) is not always the same variant's (session 25: the same kernel read 7%
        # apart in two positions of one round)
        for v in names[r % len(names):] + names[:r % len(names)]:
            calls = fns[v]
            start, end = event(), event()
            start.record()
            calls[r % len(calls)]()
            end.record()
            marks[v].append((start, end))
    synchronize()
    return {v: _median_iqr([s.elapsed_time(e) for s, e in marks[v]]) for v in names}


def _median_iqr(samples):
    """(median, interquartile range / median) of a list of times."""
    ts = sorted(samples)
    n = len(ts)
    med = ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
    return med, (ts[(3 * n) // 4] - ts[n // 4]) / med if med > 0 else 0.0


def steady_ms(fns, rounds, settle_s=0.8, measure_s=0.4, event=None, synchronize=None, clock=None, windows=None):
    """Per variant: (median ms, interquartile range / median) over `rounds` rounds of steady-state timing.

    Each round runs every variant (rotating order, as interleaved_ms) back to back: first for settle_s seconds
    untimed, so the GPU reaches the clock that this variant alone holds under the board's power cap, then k more
    calls between two CUDA events, k sized from the settle phase's rate to last about measure_s; one sample = the
    events' time / k. Under the board's power cap a variant run alone holds the clock its own power draw allows
    (H200 at 700 W, session 42: bf16 grouped GEMMs ~1300-1470 MHz, the mx128 op ~1490-1510, mx32 kernels ~1600);
    round-robin (interleaved_ms) gives every variant the clock of the mix. A bf16 and a float8 training run each
    hold their own step's clock, whose kernels only partly differ: the ratio a run sees lies between the two
    methods (steady overstates a lower-power variant's gain, round-robin understates it). `windows` (a dict)
    receives each variant's measured (start, end) wall-clock seconds, to read beside an nvidia-smi clock log.
    `clock` defaults to time.time."""
    event = event or (lambda: torch.cuda.Event(enable_timing=True))
    synchronize = synchronize or torch.cuda.synchronize
    clock = clock or time.time
    names = list(fns)
    samples = {v: [] for v in names}
    for r in range(rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            calls, i = fns[v], 0
            synchronize()
            t0 = clock()
            while True:  # settle; synchronize every call, so the rate below is the GPU's, not the launch queue's
                calls[i % len(calls)]()
                i += 1
                synchronize()
                if clock() - t0 >= settle_s:
                    break
            k = max(1, round(measure_s * i / max(clock() - t0, 1e-9)))
            start, end = event(), event()
            w0 = clock()
            start.record()
            for j in range(k):
                calls[(i + j) % len(calls)]()
            end.record()
            synchronize()
            samples[v].append(start.elapsed_time(end) / k)
            if windows is not None:
                windows.setdefault(v, []).append((w0, clock()))
    return {v: _median_iqr(samples[v]) for v in names}


def smi_means(path, windows):
    """Mean SM MHz and W of the samples of an nvidia-smi log (`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw
    --format=csv,noheader -lms 100`, written on the same machine) that fall in any (start, end) wall-clock window
    (time.time() seconds, as steady_ms's `windows`); {} when none does. Unreadable lines are skipped."""
    mhz, watts = [], []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local, as time.time()
                if any(a <= t <= b for a, b in windows):
                    mhz.append(float(parts[1].split()[0]))
                    watts.append(float(parts[2].split()[0]))
            except (ValueError, IndexError):
                continue
    if not mhz:
        return {}
    return {"samples": len(mhz), "sm_mhz": round(sum(mhz) / len(mhz)), "watts": round(sum(watts) / len(watts), 1)}


def add_timing_args(ap):
    """The benchmarks' timing switches (argparse): --timing round-robin | steady, --settle-s, --measure-s, --smi-log."""
    ap.add_argument("--timing", default="round-robin", choices=["round-robin", "steady"],
                    help="round-robin: every variant once per round, one shared clock (interleaved_ms); steady: each "
                         "variant back to back at the clock it holds alone under the power cap (steady_ms)")
    ap.add_argument("--settle-s", type=float, default=0.8, help="--timing steady: untimed seconds per variant and round")
    ap.add_argument("--measure-s", type=float, default=0.4, help="--timing steady: timed seconds per variant and round")
    ap.add_argument("--smi-log", default="", help="--timing steady: this run's nvidia-smi log (timestamp, clocks.sm, "
                    "power.draw): each variant's mean SM clock / power over its timed windows")


def make_timer(args, **fakes):
    """(time(fns, rounds) -> ({variant: (median ms, iqr)}, {variant: smi_means or {}}), description for the JSON)
    from add_timing_args's switches. fakes: event / synchronize (/ clock for steady) for tests."""
    if args.timing == "round-robin":
        return (lambda fns, rounds: (interleaved_ms(fns, rounds, **fakes), {}),
                "round-robin (benchmarks/cuda_timing.interleaved_ms): every variant once per round in rotating order, "
                "CUDA events per call, median; iqr = interquartile range / median")

    def time_steady(fns, rounds):
        windows = {}
        res = steady_ms(fns, rounds, args.settle_s, args.measure_s, windows=windows, **fakes)
        clocks = {v: smi_means(args.smi_log, ws) for v, ws in windows.items()} if args.smi_log else {}
        return res, clocks
    return (time_steady,
            f"steady state per variant (benchmarks/cuda_timing.steady_ms): rounds in rotating order, each variant "
            f"{args.settle_s} s back to back untimed, then ~{args.measure_s} s between two CUDA events; median over "
            f"rounds; iqr = interquartile range / median")
