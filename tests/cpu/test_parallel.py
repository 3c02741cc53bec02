"""Activation checkpointing (full and op-level selective) recomputes, it must not change the numbers:
the 1-rank debug run with either mode matches the run without, step for step (fp32, CPU)."""

import pytest
import torch

from _train_runs import metrics, one_rank


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_keeps_losses(tmp_path_factory, mode):
    root = str(tmp_path_factory.getbasetemp())
    plain, ac = metrics(one_rank(root)), metrics(one_rank(root, mode))
    assert len(plain) == len(ac) == 6
    for a, b in zip(plain, ac):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (mode, a["step"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (mode, a["step"])


def test_meta_init_after_sharding_matches_direct_init(tmp_path):
    """The GPU flow (meta device -> parallelize -> to_empty -> init_weights on DTensor shards) builds the same
    weights as building directly on a device, here with one gloo rank on CPU."""
    import torch
    import torch.distributed as dist

    from titan_fp8.config import load_config
    from titan_fp8.models.llama_moe import Transformer
    from titan_fp8.parallel import build_mesh, parallelize

    cfg = load_config("train_configs/debug_moe.toml", ["--activation_checkpoint.mode=selective"], world_size=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        direct = Transformer(cfg.model_args())
        torch.manual_seed(0)
        direct.init_weights()  # the constructors' own draws came first: re-draw from the same seed
        with torch.device("meta"):
            model = Transformer(cfg.model_args())
        model = parallelize(model, cfg, build_mesh(cfg, "cpu", 1))
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        with torch.no_grad():
            model.init_weights()
        got = {k.replace("_checkpoint_wrapped_module.", ""): v.full_tensor() if hasattr(v, "full_tensor") else v
               for k, v in model.state_dict().items()}
        want = direct.state_dict()
        assert set(got) == set(want)
        for k in want:
            assert torch.equal(got[k], want[k]), k
        x = torch.randint(0, 256, (2, 16))
        assert torch.allclose(model(x), direct(x), rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reduce_scatter_copy_in_equals_chunk_cat(world):
    """titan_fp8's FSDP2 copy-in writes what torch's chunk_cat writes (bf16 grads into an fp32 buffer, fp32 into
    fp32), bit for bit, with dim 0 uneven over the ranks (zero padding), 1-row and 3-D gradients; the buffer
    starts as NaN so that a byte it leaves unwritten shows."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _get_dim0_padded_size

    from titan_fp8.parallel import reduce_scatter_copy_in
    g = torch.Generator().manual_seed(world)
    for dtype in (torch.bfloat16, torch.float32):
        grads = [torch.randn(*s, generator=g).to(dtype) for s in [(8, 5, 3), (7,), (1, 4), (5, 6), (3, 2, 2)]]
        grads[1][2] = float("inf")
        numel = sum(_get_dim0_padded_size(t.size(), world).numel() for t in grads)
        want = torch.full((numel,), float("nan"))
        torch._chunk_cat(grads, 0, world, out=want.view(world, -1))
        got = torch.full((numel,), float("nan"))
        reduce_scatter_copy_in(grads, got, world)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (world, dtype)


def test_reduce_scatter_copy_in_is_what_fsdp2_calls():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc

    from titan_fp8.parallel import install_reduce_scatter_copy_in, reduce_scatter_copy_in
    assert install_reduce_scatter_copy_in()
    assert fc.foreach_reduce_scatter_copy_in is reduce_scatter_copy_in
