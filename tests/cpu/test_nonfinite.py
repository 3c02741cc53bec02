"""A non-finite loss on ONE rank is seen by every rank before the optimizer step (one reduced check).

Rank 1's loss is made NaN at step 3 (TITAN_FP8_FAULT_NAN_* hooks). Without skipping, both ranks stop with a
message naming step 3 and rank 1, exit non-zero, and the checkpoint written every step ends at step 2.
With [training] skip_nonfinite_steps the step is skipped on both ranks, training goes on with finite losses,
and no checkpoint is written from step 3.
"""

import math

import pytest

from _train_runs import TINY, checkpoint_steps, explain, metrics, run_train

ARGS = [*TINY, "--training.local_batch_size=1", "--checkpoint.enable", "--checkpoint.interval=1"]
NAN_AT_3_ON_RANK_1 = {"TITAN_FP8_FAULT_NAN_STEP": "3", "TITAN_FP8_FAULT_NAN_RANK": "1"}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("nan_stop"))
    return run_train(dump, 2, ARGS, env=NAN_AT_3_ON_RANK_1), dump


@pytest.fixture(scope="module")
def skipped(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("nan_skip"))
    return run_train(dump, 2, [*ARGS, "--training.skip_nonfinite_steps=true"], env=NAN_AT_3_ON_RANK_1), dump


def test_stop_names_step_and_rank(stopped):
    proc, _ = stopped
    assert proc.returncode != 0, explain(proc)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, explain(proc)
    assert "step 3" in lines[0] and "rank(s) [1]" in lines[0] and "skip_nonfinite_steps" in lines[0]


def test_stop_writes_no_checkpoint_from_the_bad_step(stopped):
    proc, dump = stopped
    assert checkpoint_steps(dump) == ["step-1", "step-2"], explain(proc)
    assert [r["step"] for r in metrics(dump)] == [1, 2]


def test_skip_continues_without_checkpointing_the_bad_step(skipped):
    proc, dump = skipped
    assert proc.returncode == 0, explain(proc)
    recs = {r["step"]: r for r in metrics(dump)}
    assert recs[3].get("skipped") is True
    assert all(math.isfinite(recs[s]["loss"]) for s in (1, 2, 4, 5, 6))
    assert checkpoint_steps(dump) == ["step-1", "step-2", "step-4", "step-5", "step-6"]
    assert "step 3: non-finite" in proc.stdout and "skipped" in proc.stdout
