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
