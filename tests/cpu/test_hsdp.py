"""HSDP ([parallelism] data_parallel_replicate_degree x data_parallel_shard_degree) and the multi-node launch, on
CPU over gloo: launch/train.py on the tiny debug model (_train_runs.TINY).

- 4 processes as HSDP 2 x 2 match the 1-process run step for step (fp32; loss and global grad norm, rel < 1e-5):
  the same global batches (4 ranks x 1 row = 1 rank x 4 rows), every (replicate, shard) rank its own rows.
- HSDP 2 x 2 with tensorwise float8 Linears, fp8_rowwise experts (3 experts over 2 shards: their scale groups
  straddle the shards and join the AMAX all-reduce), float8 all-gather and precompute: the loss falls, the
  float8 bytes are gathered in the shard group only, and the AMAX all-reduce is ONE per step (+ the one at
  start-up) in the shard group only; gradients are all-reduced across the replicate group.
- Two torchrun agents on 127.0.0.1 (c10d rendezvous) as two "nodes" of 2 processes each, HSDP with the
  replicas across the nodes, train and match the 1-process run.
"""

import json
import os

from _train_runs import HERE_TESTS, TINY, assert_same_steps, explain, metrics, one_rank, run_train, run_train_nodes

HSDP_2X2 = ["--parallelism.data_parallel_replicate_degree=2", "--parallelism.data_parallel_shard_degree=2",
            "--training.local_batch_size=1"]


def test_hsdp_2x2_matches_one_rank(tmp_path_factory):
    one = metrics(one_rank(str(tmp_path_factory.getbasetemp())))
    dump = str(tmp_path_factory.mktemp("hsdp2x2"))
    proc = run_train(dump, 4, [*TINY, *HSDP_2X2])
    assert proc.returncode == 0, explain(proc)
    assert "mesh (2, 2) ('dp_replicate', 'dp_shard')" in proc.stdout, proc.stdout[-2000:]
    assert len(one) == 6
    assert_same_steps(one, metrics(dump))


def test_hsdp_2x2_float8_all_gather_one_amax_all_reduce_in_shard_group(tmp_path):
    dump = str(tmp_path / "run")
    steps = 6
    proc = run_train(dump, 4, [*TINY, *HSDP_2X2, "--model.moe.num_experts=3", "--float8.enable",
                               "--float8.emulate", "--float8.recipe_name=tensorwise",
                               "--float8.moe_recipe_name=fp8_rowwise", "--float8.enable_fsdp_float8_all_gather",
                               "--float8.precompute_float8_dynamic_scale_for_fsdp"],
                     script=os.path.join(HERE_TESTS, "record_collectives_train.py"))
    assert proc.returncode == 0, explain(proc)
    assert "no valid precomputed scale" not in proc.stderr  # no all-reduce fell back into the all-gather path
    losses = [m["loss"] for m in metrics(dump)]
    assert len(losses) == steps and losses[-1] < losses[0] - 0.05, losses
    for rank in range(4):
        with open(os.path.join(dump, f"collectives-rank{rank}.json")) as f:
            rec = json.load(f)
        shard_group = [rank - rank % 2, rank - rank % 2 + 1]   # mesh (dp_replicate, dp_shard): rank = 2 r + s
        replicate_group = [rank % 2, rank % 2 + 2]
        # ONE AMAX all-reduce per optimizer step plus the one at start-up (scales for step 1), all of them in the
        # shard group, each carrying the tensorwise Linears' amax AND the straddling expert weights' group amax
        assert [r["ranks"] for r in rec["max_all_reduce"]] == [shard_group] * (steps + 1), rec["max_all_reduce"]
        numels = {r["numel"] for r in rec["max_all_reduce"]}
        assert numels == {N_TENSORWISE_LINEARS + N_EXPERT_AMAX}, rec["max_all_reduce"][0]
        assert rec["uint8_all_gather_groups"] == [shard_group]  # float8 bytes never cross replicas
        assert replicate_group in rec["other_all_reduce_groups"], rec["other_all_reduce_groups"]  # HSDP grads


# debug flavor: 3 blocks x 4 attention projections, the dense block's 3 FFN Linears, 2 MoE blocks x 3 shared-expert
# Linears (output and router are filtered out)
N_TENSORWISE_LINEARS = 3 * 4 + 3 + 2 * 3
# fp8_rowwise expert weights: one amax per expert; 2 MoE blocks x (w13, w2) x 3 experts straddling 2 shards
N_EXPERT_AMAX = 2 * 2 * 3


def test_two_torchrun_nodes_train_hsdp(tmp_path_factory):
    """torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT, twice."""
    one = metrics(one_rank(str(tmp_path_factory.getbasetemp())))
    dump = str(tmp_path_factory.mktemp("two_nodes"))
    agents = run_train_nodes(dump, 2, 2, [*TINY, *HSDP_2X2])
    for node, proc in enumerate(agents):
        assert proc.returncode == 0, f"node {node}: {explain(proc)}"
    stdout = "".join(p.stdout for p in agents)
    assert "titan_fp8: 4 rank(s)" in stdout and "mesh (2, 2) ('dp_replicate', 'dp_shard')" in stdout
    assert_same_steps(one, metrics(dump))
