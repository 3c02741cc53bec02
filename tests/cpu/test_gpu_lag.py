"""GpuLag: the lag is the GPU's time at a step's start event minus the host's, both from the one reference.

A fake clock and fake events stand in for the host clock and CUDA timing events: each event gets the GPU time
at which the fake GPU reaches it, and the test moves the host and the GPU independently."""
import json

import pytest
import torch

from titan_fp8.train.gpu_lag import GpuLag


class FakeGpu:
    """host: the host clock (s). gpu_at: the GPU time (s) the next recorded event will be reached at. now_gpu:
    how far the GPU has run (events past it are not complete)."""

    def __init__(self):
        self.host = 100.0
        self.gpu_at = 5.0
        self.now_gpu = 0.0

    def clock(self):
        return self.host

    def event(self):
        gpu = self

        class Event:
            t = None

            def record(self):
                self.t = gpu.gpu_at

            def query(self):
                return self.t is not None and self.t <= gpu.now_gpu

            def elapsed_time(self, other):
                assert self.query() and other.query(), "elapsed_time on an event the GPU has not passed"
                return 1e3 * (other.t - self.t)

        return Event()


def make():
    g = FakeGpu()
    return g, GpuLag(torch.device("cpu"), clock=g.clock, event_factory=g.event)


def test_lag_is_gpu_time_minus_host_time_since_the_reference():
    g, lag = make()
    lag.mark(1)  # reference at host 100.0 / GPU 5.0; step 1 at the same instant: no lag
    g.host, g.gpu_at = 100.2, 5.2  # step 2: the GPU was idle and reached the event as the host recorded it
    lag.mark(2)
    g.host, g.gpu_at = 100.4, 5.437  # step 3: 37 ms of work still queued
    lag.mark(3)
    g.now_gpu = 10.0
    assert lag.read(1) == pytest.approx(0.0, abs=1e-9)
    assert lag.read(2) == pytest.approx(0.0, abs=1e-6)
    assert lag.read(3) == pytest.approx(37.0, rel=1e-6)
    assert lag.lags_ms.keys() == {1, 2, 3}


def test_read_never_waits_and_keeps_unpassed_marks_for_later():
    g, lag = make()
    lag.mark(1)
    g.host, g.gpu_at = 101.0, 6.5
    lag.mark(2)
    g.now_gpu = 6.0  # the GPU is past the reference and step 1, not step 2
    assert lag.read(2) is None  # not passed yet: None, no wait
    assert lag.read(1) == pytest.approx(0.0, abs=1e-9)
    assert lag.read(7) is None  # never marked
    assert lag.lags_ms.keys() == {1}
    g.now_gpu = 7.0  # now it is: a later read collects it
    assert lag.read(2) == pytest.approx(500.0, rel=1e-6)


def test_phases_give_the_lag_and_the_host_time_of_each_part_of_a_step(tmp_path):
    g, lag = make()
    lag.mark(1)  # reference and step 1 at host 100.0 / GPU 5.0
    g.host, g.gpu_at = 100.05, 5.05  # forward issued in 50 ms; the GPU kept up (host-bound)
    lag.mark(1, "backward")
    g.host, g.gpu_at = 100.15, 5.19  # backward issued in 100 ms; the GPU 40 ms behind by then
    lag.mark(1, "optimizer")
    with pytest.raises(ValueError, match="phase 'forward'"):
        lag.mark(1, "forward")
    g.now_gpu = 5.1  # past the step's start and the backward mark, not the optimizer's
    assert lag.read(1) == pytest.approx(0.0, abs=1e-9)
    assert lag.lags_ms[1].keys() == {"step", "backward"}
    g.now_gpu = 9.0
    lag.read(2)  # a later read collects the optimizer mark of step 1
    assert lag.lags_ms[1]["optimizer"] == pytest.approx(40.0, rel=1e-6)
    with open(lag.save(str(tmp_path), rank=0)) as f:
        saved = json.load(f)
    assert saved["steps"] == [1]
    assert saved["phase_lag_ms"]["backward"] == pytest.approx([0.0], abs=1e-6)
    assert saved["phase_lag_ms"]["optimizer"] == pytest.approx([40.0], rel=1e-6)
    assert saved["host_ms"]["backward"] == pytest.approx([50.0], rel=1e-6)
    assert saved["host_ms"]["optimizer"] == pytest.approx([150.0], rel=1e-6)


def test_save_writes_every_read_lag_per_rank(tmp_path):
    g, lag = make()
    for step, (host, gpu) in enumerate([(100.0, 5.0), (100.1, 5.125), (100.3, 5.3)], start=1):
        g.host, g.gpu_at = host, gpu
        lag.mark(step)
    g.now_gpu = 9.0
    for step in (3, 1, 2):
        lag.read(step)
    path = lag.save(str(tmp_path / "run"), rank=1)
    assert path.endswith("gpu_lag_rank1.json")
    with open(path) as f:
        saved = json.load(f)
    assert saved["rank"] == 1 and saved["steps"] == [1, 2, 3]
    assert saved["lag_ms"] == pytest.approx([0.0, 25.0, 0.0], abs=1e-3)
    assert len(saved["wall_s"]) == 3 and saved["wall_s"] == sorted(saved["wall_s"])


def test_off_on_cpu():
    lag = GpuLag(torch.device("cpu"))
    assert not lag.enabled
    lag.mark(1)
    assert lag.read(1) is None
    assert lag.save("/nonexistent/never/written", rank=0) is None


def test_host_paced_share_counts_steps_whose_backward_began_on_an_idle_gpu():
    from titan_fp8.train.gpu_lag import HOST_PACED_MS
    from titan_fp8.train.metrics import host_paced_share

    recs = [{"gpu_lag_backward_ms": v} for v in (0.0, -0.3, HOST_PACED_MS, 88.0, 0.5, 140.0, 0.9, 12.0)]
    assert host_paced_share(recs) == pytest.approx(4 / 8)  # 0.0, -0.3, 0.5, 0.9; the limit itself is not
    assert host_paced_share([{"gpu_lag_backward_ms": 90.0}, {}]) is None  # a step without its lag: no share
    assert host_paced_share([]) is None


def _rank_file(folder, rank, backward_lags_by_step, start_lag_ms=50.0):
    """gpu_lag_rank<rank>.json through GpuLag.save itself: each step's start `start_lag_ms` behind the host, its
    backward the given lag behind (a step missing from the dict: its backward is never marked)."""
    g, lag = make()
    lag.mark(0)  # the reference
    for step, bwd in backward_lags_by_step.items():
        g.host, g.gpu_at = 100.0 + step, 5.0 + step + start_lag_ms / 1e3
        lag.mark(step)
        if bwd is not None:
            g.host += 0.05
            g.gpu_at = 5.0 + step + 0.05 + bwd / 1e3
            lag.mark(step, "backward")
    g.now_gpu = 1e9
    lag.read(0)
    return lag.save(str(folder), rank=rank)


def test_backward_lags_over_ranks_take_the_slowest_host_and_feed_host_paced_share(tmp_path):
    """Two H200s, session 39: rank 0 logged 100+ ms of lag at every backward while rank 1's GPU sat idle (its host
    paced both ranks through the collectives); rank 0's metrics alone read host_paced_share 0.00."""
    from titan_fp8.train.gpu_lag import backward_lags_over_ranks
    from titan_fp8.train.metrics import host_paced_share

    _rank_file(tmp_path, 0, {1: 110.0, 2: 120.0, 3: 105.0, 4: 130.0})
    _rank_file(tmp_path, 1, {1: 0.2, 2: 40.0, 3: 0.0, 4: None})  # step 4: rank 1 never marked its backward
    lags = backward_lags_over_ranks(str(tmp_path))
    assert set(lags) == {1, 2, 3}  # a step counts only where every rank has its lag
    assert lags[1] == pytest.approx(0.2, abs=1e-3) and lags[2] == pytest.approx(40.0, rel=1e-4)
    assert lags[3] == pytest.approx(0.0, abs=1e-3)
    recs = [{"step": s, "gpu_lag_backward_ms": v} for s, v in ((1, 110.0), (2, 120.0), (3, 105.0))]
    assert host_paced_share(recs) == 0.0  # rank 0's own lags
    assert host_paced_share(recs, lags) == pytest.approx(2 / 3)  # steps 1 and 3: rank 1's host paced them
    # a record whose step the rank files lack: rank 0's lags for all, not a mix
    assert host_paced_share([*recs, {"step": 4, "gpu_lag_backward_ms": 130.0}], lags) == 0.0
    assert backward_lags_over_ranks(str(tmp_path / "none")) == {}
    # ranks=N reads exactly ranks 0..N-1: a file an earlier 3-rank run left behind does not count
    _rank_file(tmp_path, 2, {1: 90.0, 2: 0.1, 3: 90.0})
    assert backward_lags_over_ranks(str(tmp_path))[2] == pytest.approx(0.1, abs=1e-3)  # every file in the folder
    assert backward_lags_over_ranks(str(tmp_path), 2) == lags
    assert backward_lags_over_ranks(str(tmp_path), 4) == {}  # rank 3's file is missing: no all-rank figure
