"""benchmarks/trace_gaps.py on a hand-made trace whose gaps are known, and on a real CPU trace's error path."""
import json

import pytest

from benchmarks.trace_gaps import attribute, gpu_gaps, kernel_totals, load_events, main


def _trace(tmp_path):
    ev = [  # GPU: [0,100) [100,150) overlapping [120,160), gap 160->300 under "hook", gap 350->360 (10 us)
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 100, "dur": 50},
        {"ph": "X", "cat": "gpu_memcpy", "name": "m", "ts": 120, "dur": 40},
        {"ph": "X", "cat": "kernel", "name": "k3", "ts": 300, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": "k4", "ts": 360, "dur": 40},
        {"ph": "X", "cat": "cpu_op", "name": "step", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "hook", "ts": 150, "dur": 160},
        {"ph": "X", "cat": "cpu_op", "name": "short", "ts": 200, "dur": 20},
        {"ph": "i", "name": "instant"},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    return str(p)


def test_busy_idle_and_attribution(tmp_path, capsys):
    events = load_events(_trace(tmp_path))
    span, busy, gaps = gpu_gaps(events)
    assert (span, busy) == (400, 250)  # overlap counted once
    assert [(g[0], g[1]) for g in gaps] == [(140, 160), (10, 350)]
    rows = attribute(events, gaps, min_gap_us=30)
    assert rows == [{"host": "hook < step", "idle_ms": 0.14, "gaps": 1}]  # "short" does not span the gap
    assert main([str(tmp_path / "t.json"), "--min-gap-us", "5", "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert "busy 0.25 ms (62.5%)" in out and "hook < step" in out
    assert json.loads((tmp_path / "o.json").read_text())["by_host_op"][1]["host"] == "step"


def test_bad_trace_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="no traceEvents"):
        load_events(str(bad))
    with pytest.raises(SystemExit, match="cannot read"):
        load_events(str(tmp_path / "missing.json"))
    cpu_only = tmp_path / "cpu.json"
    cpu_only.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 1}]}))
    with pytest.raises(SystemExit, match="no GPU activity"):
        gpu_gaps(load_events(str(cpu_only)))


def test_kernel_totals_sum_each_name(tmp_path, capsys):
    events = load_events(_trace(tmp_path))
    events.append({"ph": "X", "cat": "kernel", "name": "k1", "ts": 500, "dur": 30})
    events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 0, "dur": 900})
    rows = kernel_totals(events)
    assert rows[0] == {"kernel": "ncclDevKernel_AllGather", "ms": 0.9, "calls": 1}
    assert rows[1] == {"kernel": "k1", "ms": 0.13, "calls": 2}
    assert sum(r["ms"] for r in rows) == pytest.approx(0.9 + 0.13 + 0.05 + 0.04 + 0.05 + 0.04)
    assert main([str(tmp_path / "t.json"), "--kernels", "2"]) == 0
    out = capsys.readouterr().out
    assert "GPU time of non-NCCL activity 0.28 ms; the 2 largest:" in out and "k1" in out


def test_exposed_comm_counts_only_time_no_other_work_covers(tmp_path, capsys):
    ev = [  # compute [0,100) [150,200); NCCL A [50,180) alone over [100,150); B [190,260) alone over [200,260);
        # C [20,40) fully hidden; B's launch sits under "FSDP::all_gather (layers.1)" < "pre_forward"
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "norm", "ts": 150, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 50, "dur": 130,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_ReduceScatter", "ts": 190, "dur": 70,
         "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 20, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 12, "dur": 2, "args": {"correlation": 8}},
        {"ph": "X", "cat": "user_annotation", "name": "pre_forward", "ts": 0, "dur": 30},
        {"ph": "X", "cat": "user_annotation", "name": "FSDP::all_gather (layers.1)", "ts": 10, "dur": 10},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    from benchmarks.trace_gaps import exposed_comm
    total, rows = exposed_comm(load_events(str(p)))
    assert total == 50 + 60
    assert [(r["kernel"], r["exposed_ms"], r["at_ms"]) for r in rows] == [
        ("ncclDevKernel_ReduceScatter", 0.06, 0.19), ("ncclDevKernel_AllGather", 0.05, 0.05)]
    assert rows[0]["host"] == "FSDP::all_gather (layers.1) < pre_forward"
    assert rows[1]["host"] == "(launch not in the trace)"
    assert main([str(p), "--exposed", "5", "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert "NCCL alone on the GPU (nothing else running) 0.11 ms" in out
    assert json.loads((tmp_path / "o.json").read_text())["nccl_alone_ms"] == pytest.approx(0.11)


def test_host_time_splits_self_and_inclusive_per_thread(tmp_path, capsys):
    from benchmarks.trace_gaps import host_time

    ev = [  # main thread 1: A [0,100) holding B [10,40) and B [50,60), then A again [200,220) holding nothing;
        # thread 2: two compiled-graph calls with different hashes, one holding aten::mm; a kernel (not host)
        {"ph": "X", "cat": "user_annotation", "name": "A", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "B", "ts": 10, "dur": 30, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "B", "ts": 50, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "A", "ts": 200, "dur": 20, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "## Call CompiledFxGraph f52dn ##", "ts": 0, "dur": 30, "pid": 1,
         "tid": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 5, "dur": 10, "pid": 1, "tid": 2},
        {"ph": "X", "cat": "cpu_op", "name": "## Call CompiledFxGraph zz9q ##", "ts": 40, "dur": 5, "pid": 1,
         "tid": 2},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 500, "pid": 0, "tid": 7},
    ]
    threads = host_time(ev)
    assert [t["thread"] for t in threads] == ["1", "2"] and [t["busy_ms"] for t in threads] == [0.12, 0.035]
    ops = {o["op"]: o for o in threads[0]["ops"]}
    assert ops["A"] == {"op": "A", "self_ms": 0.08, "incl_ms": 0.12, "calls": 2}
    assert ops["B"] == {"op": "B", "self_ms": 0.04, "incl_ms": 0.04, "calls": 2}
    ops = {o["op"]: o for o in threads[1]["ops"]}
    graph = ops["## Call CompiledFxGraph (any) ##"]
    assert (graph["self_ms"], graph["incl_ms"], graph["calls"]) == (0.025, 0.035, 2)
    p = tmp_path / "h.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    assert main([str(p), "--host", "2"]) == 0
    assert "host thread 1: busy 0.12 ms" in capsys.readouterr().out
