"""2-process FSDP2 (gloo) training of the debug model matches a 1-process run step for step, in fp32.

Both runs see the same global batches (the 1-rank run takes local batch 4 = 2 ranks x 2) and start from the
same weights, so the per-step loss and the global grad norm must agree to rounding. The grad-norm match also
shows that the norm of DTensor-sharded gradients is reduced over ranks (a per-shard norm would be ~1/sqrt(2)
of it).
"""

import json
import math
import os

import pytest

from _train_runs import METRIC_KEYS, assert_same_steps, baseline_two_ranks, metrics, one_rank


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    two = baseline_two_ranks(str(tmp_path_factory.getbasetemp()))
    one = one_rank(str(tmp_path_factory.getbasetemp()))
    with open(os.path.join(one, "stdout.txt")) as f:
        stdout = f.read()
    return metrics(one), metrics(two), stdout


def test_two_ranks_match_one_rank_step_for_step(runs):
    one, two, _ = runs
    assert [r["step"] for r in one] == list(range(1, 7))
    assert_same_steps(one, two)
    for a, b in zip(one, two):
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)
    # the comparison means something only if training moved the weights
    assert abs(one[-1]["loss"] - one[0]["loss"]) > 1e-2


def test_metrics_records_are_complete(runs):
    one, two, stdout = runs
    for rec in one + two:
        assert METRIC_KEYS <= set(rec), sorted(METRIC_KEYS - set(rec))
        assert rec["mfu"] is None and rec["memory_gib"] is None  # CPU: no peak known, no device memory
        assert rec["tps_per_gpu"] > 0 and math.isfinite(rec["loss"]) and 0 <= rec["data_wait_share"] <= 1
        assert 0 <= rec["sync_wait_share"] < 1
    assert "summary: " in stdout


def test_two_ranks_log_once_and_validate_alike(tmp_path_factory):
    root = str(tmp_path_factory.getbasetemp())
    dump = baseline_two_ranks(root)
    # rank 0 alone writes metrics: one record per step, not two
    assert len(metrics(dump)) == 6
    summaries = []
    for d in (dump, one_rank(root)):
        with open(os.path.join(d, "summary.json")) as f:
            summaries.append(json.load(f))
    # the final validation loss (2 batches of 2 per rank vs 2 batches of 4) is the same number
    a, b = summaries[1]["val_loss"], summaries[0]["val_loss"]
    assert math.isfinite(a) and abs(a - b) / a < 1e-5, (a, b)
    assert abs(a - metrics(dump)[-1]["loss"]) > 1e-4  # validation data is not the training batch


def test_hsdp_matches_one_rank(tmp_path_factory, runs):
    """replicate 2 x shard 1 on 2 ranks: a (dp_replicate, dp_shard) = (2, 1) mesh, i.e. HSDP. Same numbers.
    (4 ranks as 2 x 2, and two "nodes": test_hsdp.py.)"""
    from _train_runs import TINY, explain, run_train

    one, _, _ = runs
    dump = str(tmp_path_factory.mktemp("hsdp"))
    proc = run_train(dump, 2, [*TINY, "--training.local_batch_size=2",
                               "--parallelism.data_parallel_replicate_degree=2",
                               "--parallelism.data_parallel_shard_degree=1"])
    assert proc.returncode == 0, explain(proc)
    assert "('dp_replicate', 'dp_shard')" in proc.stdout
    assert_same_steps(one, metrics(dump))


def test_reshard_after_forward_never_matches_one_rank(tmp_path_factory, runs):
    """[parallelism] fsdp_reshard_after_forward = "never": every block keeps its gathered weights from forward to
    backward (no gather in backward); with fsdp_forward_prefetch = 2 each block also issues the next two blocks'
    all-gathers. Same numbers as one rank; a block's FSDP2 state says it keeps them, and whom it prefetches."""
    from _train_runs import TINY, explain, parallelized_debug_model, run_train

    one, _, _ = runs
    dump = str(tmp_path_factory.mktemp("never"))
    proc = run_train(dump, 2, [*TINY, "--training.local_batch_size=2",
                               "--parallelism.fsdp_reshard_after_forward=never",
                               "--parallelism.fsdp_forward_prefetch=2"])
    assert proc.returncode == 0, explain(proc)
    assert_same_steps(one, metrics(dump))
    for policy, want in (("never", [False] * 3), ("always", [True] * 3), ("default", [True, True, False])):
        with parallelized_debug_model([f"--parallelism.fsdp_reshard_after_forward={policy}",
                                       "--compile.enable=false"]) as model:
            # FSDP2 keeps a post-forward mesh only for units that reshard after forward
            got = [b._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
                   for b in model.layers.values()]
            assert got == want, (policy, got)
    with parallelized_debug_model(["--parallelism.fsdp_forward_prefetch=2", "--compile.enable=false"]) as model:
        states = [b._get_fsdp_state() for b in model.layers.values()]
        got = [[states.index(t) for t in s._states_to_forward_prefetch] for s in states]
        assert got == [[1, 2], [2], []], got
