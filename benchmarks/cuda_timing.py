"""CUDA-graph timing shared by the benchmarks: no host launch cost in the number."""
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
    out = {}
    for v in names:
        ts = sorted(s.elapsed_time(e) for s, e in marks[v])
        n = len(ts)
        med = ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
        out[v] = (med, (ts[(3 * n) // 4] - ts[n // 4]) / med if med > 0 else 0.0)
    return out
