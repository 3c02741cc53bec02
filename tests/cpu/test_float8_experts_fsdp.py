"""FSDP2 float8 all-gather of 3-D expert weights on 2 CPU processes over gloo (emulate=True, fp32 params unless
stated), for moe_recipe_name fp8_rowwise and mxfp8 (mx128, mx32).

One spawn of tests/cpu/float8_experts_fsdp_worker.py runs every scenario (~1 min); each test asserts on its
part. Cases: "even" = 4 experts over 2 ranks (Shard(0), whole experts per rank: scales travel, no
all-reduce); "one_expert" = 1 expert over 2 ranks (rank 1's shard is empty); "shard1" = 2 experts sharded on
dim 1 (fully_shard(..., shard_placement_fn=-> Shard(1)): every expert's rows, and 128x128 tiles, split).
"""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ["fp8_rowwise", "mxfp8:mx128", "mxfp8:mx32"]
CASES = ["even", "one_expert", "shard1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("float8_experts_fsdp")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "float8_experts_fsdp_worker.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("key", KEYS)
def test_expert_all_gather_bytes_at_most_55_percent_of_bf16(runs, key):
    # counted inside dist.all_gather_into_tensor / dist.all_gather_single (scales included), bf16 params both
    for r in runs:
        b8, b16 = r[key]["bytes_fp8"], r[key]["bytes_bf16"]
        assert 0 < b8 <= 0.55 * b16, (b8, b16)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("key", KEYS)
def test_gathered_expert_weight_equals_quantize_after_gather_bitwise(runs, key, case):
    for r in runs:
        exact = r[key][f"exact_{case}"]
        assert len(exact) == 4 and all(exact.values()), exact


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("key", KEYS)
def test_training_equals_unsharded_reference_and_grads_are_plain(runs, key, case):
    # the float8-gathered run's losses equal a non-FSDP run quantizing the full weight (fp32 params: exact)
    for r in runs:
        assert r[key][f"losses_{case}"] == r[key][f"losses_ref_{case}"]
        assert r[key][f"grad_types_{case}"] == ["Tensor"]  # gradients come back as plain tensors
    assert runs[0][key][f"losses_{case}"] != runs[1][key][f"losses_{case}"]  # ranks saw different data


@pytest.mark.parametrize("key", KEYS)
def test_all_reduce_only_where_scale_groups_straddle_shards(runs, key):
    for r in runs:
        assert r[key]["ar_even"] == [0, 0, 0]  # whole experts per rank: compact scales ride the all-gather
        assert r[key]["ar_one_expert"] == [1, 1, 1]
        assert r[key]["ar_shard1"] == [1, 1, 1]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("key", KEYS)
def test_one_amax_all_reduce_per_step_covers_linears_and_experts(runs, key, case):
    # tensorwise Linears + expert weights: with precompute exactly ONE all-reduce per step (none in the
    # all-gathers), without it the first all-gather of the step makes that same one
    for r in runs:
        res = r[key]
        assert res[f"ar_linears_{case}_pre"] == [1, 1, 1]
        assert res[f"ar_linears_{case}_nopre"] == [1, 1, 1]
        assert res[f"losses_linears_{case}_pre"] == res[f"losses_linears_{case}_nopre"] \
            == res[f"losses_linears_{case}_noag"]
