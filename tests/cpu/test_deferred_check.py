"""[training] nonfinite_check = "deferred" (the default): the host reads a step's check one step later and the
GPU skips a failing step's update itself (fused AdamW's found_inf, router biases kept). It must train exactly
like "before_optimizer" (the host waits mid-step and skips on the host), failing steps included.

Rank 1's loss is made NaN at step 4 on 2 ranks over gloo. TINY validates at steps 3 and 6, so steps 2, 4 and 5
are read a step late: step 4 is the deferred path. Compared record by record, bit for bit.
"""

import math

import pytest

from _train_runs import TINY, explain, metrics, run_train

NAN_AT_4_ON_RANK_1 = {"TITAN_FP8_FAULT_NAN_STEP": "4", "TITAN_FP8_FAULT_NAN_RANK": "1"}
ARGS = [*TINY, "--training.local_batch_size=1"]


def _run(tmp_path_factory, name, extra):
    dump = str(tmp_path_factory.mktemp(name))
    return run_train(dump, 2, [*ARGS, *extra], env=NAN_AT_4_ON_RANK_1), dump


@pytest.fixture(scope="module")
def skip_deferred(tmp_path_factory):
    return _run(tmp_path_factory, "skip_deferred", ["--training.skip_nonfinite_steps=true"])


@pytest.fixture(scope="module")
def skip_before(tmp_path_factory):
    return _run(tmp_path_factory, "skip_before", ["--training.skip_nonfinite_steps=true",
                                                  "--training.nonfinite_check=before_optimizer"])


def _history(dump):
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"], r.get("skipped", False), r.get("val_loss"))
            for r in metrics(dump)]


def test_deferred_skip_trains_exactly_like_the_blocking_check(skip_deferred, skip_before):
    (p_def, d_def), (p_bef, d_bef) = skip_deferred, skip_before
    assert p_def.returncode == 0, explain(p_def)
    assert p_bef.returncode == 0, explain(p_bef)
    h_def, h_bef = _history(d_def), _history(d_bef)
    assert [h[0] for h in h_def] == [1, 2, 3, 4, 5, 6]
    assert [h[4] for h in h_def] == [False, False, False, True, False, False]
    # the skipped step left weights, moments and router biases as they were: every later loss, norm and
    # validation loss equals the blocking run's bit for bit
    assert h_def == h_bef
    assert all(math.isfinite(h[1]) for h in h_def if not h[4])
    assert "step 4: non-finite" in p_def.stdout and "skipped" in p_def.stdout


def test_deferred_stop_names_the_step_and_logs_nothing_after_it(tmp_path_factory):
    proc, dump = _run(tmp_path_factory, "stop_deferred", [])
    assert proc.returncode != 0, explain(proc)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, explain(proc)
    assert "step 4" in lines[0] and "rank(s) [1]" in lines[0] and "skipped that step's update" in lines[0]
    assert [r["step"] for r in metrics(dump)] == [1, 2, 3]



def test_steps_read_at_once_are_timed_as_whole_steps(tmp_path):
    # no validation: step 6 (the last) is read at once, right after step 5 was read a step late. Its record's
    # time must still be its step's (issue-complete to issue-complete), not the moment between the two reads
    dump = str(tmp_path / "timed")
    proc = run_train(dump, 1, [*ARGS, "--validation.enable=false", "--training.steps=8"])
    assert proc.returncode == 0, explain(proc)
    recs = metrics(dump)
    times = {r["step"]: r["step_time_s"] for r in recs}
    typical = sorted(times[s] for s in range(2, 8))[2]
    assert times[8] > typical / 3, times
    assert all(0 <= r["data_wait_share"] <= 1 and 0 <= r["sync_wait_share"] < 1 for r in recs), recs


def test_metrics_window_is_the_sum_of_step_times():
    import torch

    from titan_fp8.train.metrics import MetricsLogger

    m = MetricsLogger("unused", 1, torch.device("cpu"), 1.0, 100, False)  # rank 1 writes no file
    m.step_done(0.1, 0.0, 0.5)
    m.step_done(0.1, 0.2, 1.5)
    rec = m.emit(2, 2, 1.0, 1.0, 1e-3)
    assert rec["step_time_s"] == 1.0 and rec["tps_per_gpu"] == 100.0
    assert rec["data_wait_share"] == 0.1 and rec["sync_wait_share"] == 0.1
