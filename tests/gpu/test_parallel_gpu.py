"""titan_fp8.parallel.reduce_scatter_copy_in on CUDA writes what torch's chunk_cat writes (bf16 gradients into
the fp32 reduce buffer, the llama_moe block's shapes, uneven dim 0)."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_copy_in_equals_chunk_cat_on_cuda(world):
    from torch.distributed.fsdp._fully_shard._fsdp_common import _get_dim0_padded_size

    from titan_fp8.parallel import reduce_scatter_copy_in
    shapes = [(8, 5632, 4096), (8, 4096, 2816), (4096, 4096), (1024, 4096), (4096,), (5, 7), (1, 3)]
    grads = [torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    numel = sum(_get_dim0_padded_size(g.size(), world).numel() for g in grads)
    want = torch.full((numel,), float("nan"), device="cuda")
    torch._chunk_cat(grads, 0, world, out=want.view(world, -1))
    got = torch.full((numel,), float("nan"), device="cuda")
    reduce_scatter_copy_in(grads, got, world)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
