"""FSDP2 float8 all-gather on 2 CPU processes over gloo (emulate=True, fp32 params unless stated).

One spawn of tests/cpu/float8_fsdp_worker.py runs every scenario (~20 s); each test asserts on its part.
"""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("float8_fsdp")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "float8_fsdp_worker.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_a_all_gather_bytes_at_most_52_percent_of_bf16(runs):
    # counted inside dist.all_gather_into_tensor / dist.all_gather_single, bf16 mixed precision both runs
    for r in runs:
        assert r["bytes_bf16"] > 0 and r["bytes_fp8"] > 0
        assert r["bytes_fp8"] <= 0.52 * r["bytes_bf16"], (r["bytes_fp8"], r["bytes_bf16"])


def test_b_gathered_weight_equals_gather_then_cast_bitwise(runs):
    for r in runs:
        assert r["gather_exact"] and all(r["gather_exact"].values()), r["gather_exact"]
        # the per-weight all-reduce path (no precompute) gathers the same bytes
        assert all(r["gather_exact_no_precompute"].values()), r["gather_exact_no_precompute"]


def test_c_one_amax_all_reduce_per_step_with_precompute(runs):
    for r in runs:
        assert r["pre"]["per_step_max_allreduce"] == [1] * 10
        # without precompute the first all-gather of each step computes every weight's scale with ONE
        # all-reduce too (not one per weight and gather: 5 weights x forward+backward would be 10)
        assert r["nopre"]["per_step_max_allreduce"] == [1] * 10
        assert r["noag"]["per_step_max_allreduce"] == [0] * 10


def test_c_losses_equal_no_precompute_and_non_fsdp_reference_exactly(runs):
    for r in runs:
        assert len(r["pre"]["losses"]) == 10
        assert r["pre"]["losses"] == r["nopre"]["losses"] == r["ref"]["losses"] == r["noag"]["losses"]
    assert runs[0]["pre"]["losses"] != runs[1]["pre"]["losses"]  # ranks saw different data


def test_c_empty_shard_rank_joins_and_matches(runs):
    # `tiny` is [1, 64]: rank 1 holds an empty shard; its gathered weight is still exact (test b) and the
    # one all-reduce per step completed on both ranks (no hang, equal counts)
    assert "tiny" in runs[1]["gather_exact"] and runs[1]["gather_exact"]["tiny"]
    assert runs[0]["pre"]["per_step_max_allreduce"] == runs[1]["pre"]["per_step_max_allreduce"]


def test_stale_precompute_after_fused_optimizer_falls_back_correctly(runs):
    # step 1 skips the precompute call after a fused AdamW step (fused steps do not bump version counters):
    # the stale scale must not be used; step 2 computes every scale in its first all-gather: ONE all-reduce
    # there plus the precompute after step 2 (step 1 skipped its precompute: 0), losses stay exact
    for r in runs:
        assert r["stale"]["losses"] == r["stale_ref"]["losses"]
        assert r["stale"]["per_step_max_allreduce"] == [1, 0, 2, 1]


def test_block_weights_cast_by_one_launch_per_all_gather_same_losses(runs):
    """batch_weight_casts (parallelize calls it per block): each block's forward all-gather casts the block's 2
    tensorwise weights with ONE launch, and backward's regather of the same shards takes those bytes (2 blocks x
    10 steps); only the root's `tiny` weight is cast alone. Losses equal the unbatched run's bit for bit, also
    after a stale precompute."""
    for r in runs:
        assert r["batched"]["losses"] == r["pre"]["losses"]
        assert r["batched"]["per_step_max_allreduce"] == r["pre"]["per_step_max_allreduce"]
        assert r["batched_calls"]["many"] == 2 * 10
        assert r["batched_calls"]["alone"] <= 2 * 10  # tiny's gathers; the 4 block weights would add 80
        assert r["batched_stale"]["losses"] == r["stale"]["losses"]


def test_cast_batch_takes_only_bytes_of_the_same_weight_version_and_generation():
    """WeightCastBatch (tensorwise): the first member's call casts every member with one launch; another member's call
    takes its bytes only while its shard, version and optimizer generation are those they were cast from:
    an in-place edit or an optimizer step makes it cast again, with the new values and scales."""
    import dataclasses

    from kernels.float8_cast import to_float8
    from titan_fp8.float8.config import Float8Config
    from titan_fp8.float8.weights import (_OPTIMIZER_GENERATION, Float8TrainingWeight, ScaleCache,
                                          batch_weight_casts)
    from titan_fp8.float8.scaling import tensorwise_scale
    f8 = torch.float8_e4m3fn
    cfg = Float8Config(enable_fsdp_float8_all_gather=True, emulate=True)
    g = torch.Generator().manual_seed(3)
    mods = [torch.nn.Linear(8, n, bias=False) for n in (16, 24, 8)]
    block = torch.nn.Sequential(*mods)
    for m in mods:
        m.weight = torch.nn.Parameter(Float8TrainingWeight(torch.randn(m.weight.shape, generator=g), cfg))

    def refresh_scales():
        for m in mods:
            m._float8_scale_cache = ScaleCache(tensorwise_scale(m.weight._tensor, f8), _OPTIMIZER_GENERATION[0])
    refresh_scales()
    # (a plain nn.Parameter is not a DTensor: _local_tensor falls back to the weight itself)
    many = []
    import kernels.float8_cast as fc
    orig = fc.to_float8_tensorwise_many
    fc.to_float8_tensorwise_many = lambda xs, s, d: many.append(1) or orig(xs, s, d, backend="reference")
    try:
        assert batch_weight_casts(block) == {"tensorwise": 3}
        batch = mods[0]._float8_cast_batch

        def take(i):
            shard = mods[i].weight._tensor
            got = batch.take(mods[i], shard, _OPTIMIZER_GENERATION[0])
            want = to_float8(shard, mods[i]._float8_scale_cache.scale, f8)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), i
        take(0), take(1), take(2)
        assert len(many) == 1  # members 1 and 2 took what member 0's call cast
        take(1), take(0)  # backward's regather: same shards, same generation: the same bytes, no launch
        assert len(many) == 1
        with torch.no_grad():
            mods[2].weight._tensor.mul_(-3)  # edited in place after its bytes were cast (version bump)
        refresh_scales()
        take(2)  # must not take the bytes cast before the edit
        assert len(many) == 2
        _OPTIMIZER_GENERATION[0] += 1  # an optimizer step: new weights' scales
        with torch.no_grad():
            for m in mods:
                m.weight._tensor.add_(1.0)
        refresh_scales()
        take(0), take(1)
        assert len(many) == 3
        other = torch.nn.Linear(8, 8, bias=False)
        assert batch.take(other, other.weight.detach(), _OPTIMIZER_GENERATION[0]) is None  # not a member
        assert batch.take(mods[0], torch.zeros(16, 8), _OPTIMIZER_GENERATION[0]) is None  # another storage
        take(0)  # its kept bytes are still its own: no launch
        assert len(many) == 3
        mods[1]._float8_scale_cache = dataclasses.replace(mods[1]._float8_scale_cache, generation=-1)
        with torch.no_grad():
            mods[0].weight._tensor.mul_(2)  # member 0 must cast again, and member 1's scale is stale:
        mods[0]._float8_scale_cache = ScaleCache(tensorwise_scale(mods[0].weight._tensor, f8), _OPTIMIZER_GENERATION[0])
        assert batch.take(mods[0], mods[0].weight._tensor, _OPTIMIZER_GENERATION[0]) is None  # not together
    finally:
        fc.to_float8_tensorwise_many = orig


def test_dcp_round_trip_resumes_exactly(runs):
    for r in runs:
        assert r["dcp"]["state_dict_local_types"] == ["Tensor"]  # checkpoints hold plain high precision
        assert r["dcp"]["after_load"] == r["dcp"]["after_save"]


def test_mxfp8_all_gather_equals_quantize_after_gather_without_all_reduce(runs):
    for r in runs:
        mx = r["mxfp8"]
        assert mx["exact"] and all(mx["exact"].values()), mx["exact"]
        assert mx["max_allreduce_on"] == [0, 0, 0]
        assert mx["losses_on"] == mx["losses_off"]


def test_weight_subclass_unwraps_foreach_and_nested_args():
    """The subclass's dispatch unwraps flat argument lists with a plain loop (the optimizer's foreach ops) and
    anything nested through pytree; either way the op runs on the plain tensors and views stay wrapped."""
    from titan_fp8.float8.config import Float8Config
    from titan_fp8.float8.weights import Float8TrainingWeight, _unwrap_flat
    cfg = Float8Config(enable_fsdp_float8_all_gather=True, emulate=True)
    plain = [torch.randn(3, 4), torch.randn(5)]
    wrapped = [Float8TrainingWeight(t.clone(), cfg) for t in plain]
    torch._foreach_mul_(wrapped, 2.0)  # in place on the inner tensors
    assert all(torch.equal(w._tensor, 2 * p) for w, p in zip(wrapped, plain))
    norms = torch._foreach_norm(wrapped, ord=float("inf"))
    assert all(torch.equal(n, (2 * p).abs().max()) for n, p in zip(norms, plain))
    v = wrapped[0].view(12)
    assert type(v) is Float8TrainingWeight and torch.equal(v._tensor, 2 * plain[0].view(12))
    args, kwargs, first = _unwrap_flat(([wrapped[0], 1.0], wrapped[1]), {"alpha": 2, "other": wrapped[1]})
    assert first is wrapped[0] and type(args[0]) is list and args[0][0] is wrapped[0]._tensor
    assert args[1] is wrapped[1]._tensor and kwargs == {"alpha": 2, "other": wrapped[1]._tensor}
    assert _unwrap_flat(([[wrapped[0]]],), {}) is None  # nested: pytree's job
    # a nested op still works (torch.cat takes a flat list; stack of a tuple too)
    assert torch.equal(torch.cat([wrapped[1], wrapped[1]]), torch.cat([2 * plain[1]] * 2))


def test_pre_all_gather_hook_signature_is_precomputed():
    """FSDP2 inspects fsdp_pre_all_gather's signature at every all-gather of every parameter; both float8 weight
    classes carry it precomputed (inspect then skips parsing the function), and it is the hook's real signature
    with FSDP2's five arguments."""
    import inspect

    from titan_fp8.float8.expert_weights import Float8ExpertWeight
    from titan_fp8.float8.weights import Float8TrainingWeight
    for cls in (Float8TrainingWeight, Float8ExpertWeight):
        hook = cls.__dict__["fsdp_pre_all_gather"]
        assert "__signature__" in hook.__dict__, cls.__name__
        del_sig = hook.__dict__.pop("__signature__")
        try:
            assert del_sig == inspect.signature(hook)
        finally:
            hook.__signature__ = del_sig
        bound = cls.__new__(cls, torch.zeros(2, 2), None).fsdp_pre_all_gather
        assert list(inspect.signature(bound).parameters) == ["mesh", "outer_size", "outer_stride", "module", "mp_policy"]


def test_parallelize_batches_each_blocks_tensorwise_weight_casts():
    """parallelize groups every block's tensorwise float8-all-gather weights into one WeightCastBatch (one
    cast launch per block all-gather); weights outside the blocks (none are float8 by default) stay alone."""
    from tests.cpu._train_runs import parallelized_debug_model
    from titan_fp8.float8 import Float8Linear
    with parallelized_debug_model(["--float8.enable=true", "--float8.recipe_name=tensorwise",
                                   "--float8.enable_fsdp_float8_all_gather=true", "--float8.emulate=true",
                                   "--compile.enable=false"]) as model:
        for block in model.layers.values():
            linears = [m for m in block.modules() if isinstance(m, Float8Linear)]
            assert len(linears) >= 2
            batch = linears[0]._float8_cast_batch
            assert all(m._float8_cast_batch is batch for m in linears) and len(batch) == len(linears)
        assert not hasattr(model.output, "_float8_cast_batch")


def test_mx128_linear_weights_of_a_block_quantized_by_one_call():
    """batch_weight_casts groups a block's mx128 MXFP8 Linear weights: their pre-all-gather hooks return the same
    bytes and tile scales as one quantization per weight (zeros, a huge value and a NaN tile included), made by
    one call for the block."""
    from titan_fp8.float8.config import Float8Config
    from titan_fp8.float8.weights import Float8TrainingWeight, _OneRank, batch_weight_casts
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity="mx128", enable_fsdp_float8_all_gather=True,
                       emulate=True)
    g = torch.Generator().manual_seed(11)
    mods = [torch.nn.Linear(128, 256, bias=False), torch.nn.Linear(256, 128, bias=False)]
    for m in mods:
        m.weight = torch.nn.Parameter(Float8TrainingWeight(torch.randn(m.weight.shape, generator=g), cfg))
    with torch.no_grad():
        mods[0].weight._tensor[:128] = 0
        mods[1].weight._tensor[3, 200] = 3e38
        mods[1].weight._tensor[100, 5] = float("nan")

    def hook(m):
        w = m.weight
        return w.fsdp_pre_all_gather(_OneRank(), w.shape, w.stride(), m, None)
    alone = [hook(m) for m in mods]
    assert batch_weight_casts(torch.nn.Sequential(*mods)) == {"mx128": 2}
    batch = mods[0]._float8_cast_batch
    calls = []
    cast_all = batch._cast_all
    batch._cast_all = lambda *a: calls.append(1) or cast_all(*a)
    together = [hook(m) for m in mods]
    assert len(calls) == 1
    for (a_in, a_meta), (b_in, b_meta) in zip(alone, together):
        assert torch.equal(a_in[0], b_in[0]) and torch.equal(a_meta[0], b_meta[0])
