"""mxfp8 Linears on float8-all-gathered weights, on a Hopper GPU: the GEMMs read the gathered bytes and tile scales
(titan_fp8.float8.gathered.Float8GatheredWeight, built here by the real FSDP2 hooks on one rank, whose
pre-all-gather quantizes with kernels.grouped_gemm's Triton tile quantizer) and must give exactly what the plain
weight gives (the Linear's own Triton quantizer, to_mx128_blockwise, on the full weight): output and both
gradients bit for bit on the cuBLAS blockwise path (mx128), the Gluon 1x32 kernels (mx32) and the bf16-dequantized
path (mx32_tile32), eager and under inductor. The CPU tests check the same with the emulated GEMMs
(tests/cpu/test_float8_mx128_linear.py) and the cuBLAS arguments with a recorder
(tests/cpu/test_float8_blockwise_layout.py)."""
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0) or not hasattr(F, "scaled_mm"),
    reason="needs a CUDA GPU with cuBLAS fp8 blockwise GEMMs (sm_90) and torch.nn.functional.scaled_mm")

from titan_fp8.float8 import Float8Config  # noqa: E402
from titan_fp8.float8 import linear as f8linear  # noqa: E402
from titan_fp8.float8.gathered import Float8GatheredWeight  # noqa: E402
from titan_fp8.float8.weights import gather_on_one_rank  # noqa: E402


def blocky(rows, cols, tile_rows=1, decades=3):
    t = torch.randn(rows, cols, device="cuda")
    mag = torch.pow(10.0, torch.empty(-(-rows // tile_rows), cols // 128, device="cuda").uniform_(-decades, decades))
    return (t * mag.repeat_interleave(tile_rows, 0)[:rows].repeat_interleave(128, 1)).to(torch.bfloat16)


def same_bits(a, b):
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(torch.where(nan, 0, a), torch.where(nan, 0, b))


def fwd_bwd(f, x, w, g):
    xq, wp = x.clone().requires_grad_(), torch.nn.Parameter(w)
    y = f(xq, wp)
    y.backward(g)
    return y, xq.grad, wp.grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
@pytest.mark.parametrize("gran", ["mx128", "mx32", "mx32_tile32"])
# (M, K, N): the small shape of the task (K/128 = 4, N/128 = 3: padded tile-scale layouts), a Llama-3-8B one
@pytest.mark.parametrize("M,K,N", [(256, 512, 384), (8192, 4096, 4096)])
def test_gathered_weight_equals_plain_weight_bit_for_bit(M, K, N, gran, compiled):
    torch.manual_seed(0)
    torch._dynamo.reset()
    x, w, g = blocky(M, K), blocky(N, K, 128) * 0.02, blocky(M, N) * 1e-3
    w[:128, 5] = float("nan")  # one NaN tile: its outputs NaN on both paths
    w[128:256, 256:384] *= 1e30  # one huge tile
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity=gran, enable_fsdp_float8_all_gather=True)
    gathered = gather_on_one_rank(w, cfg)
    assert type(gathered) is Float8GatheredWeight and gathered.dtype == torch.bfloat16

    def linear(x, w):
        return f8linear.float8_linear(x, w, cfg)
    f = torch.compile(linear, fullgraph=True) if compiled else linear
    got = fwd_bwd(f, x, gathered, g)
    torch._dynamo.reset()
    f = torch.compile(linear, fullgraph=True) if compiled else linear
    ref = fwd_bwd(f, x, w.clone(), g)
    for what, a, b in zip(("output", "grad_input", "grad_weight"), got, ref):
        assert type(a) is torch.Tensor and a.dtype == torch.bfloat16, what
        assert same_bits(a, b), (what, (a.float() - b.float()).abs().nan_to_num().max().item())


def test_gathered_operands_equal_the_linear_quantizer_bitwise():
    """The pre-all-gather's Triton tile quantizer (to_mxfp8_blocked_rowcol) and the Linear's own
    (to_mx128_blockwise) give the same bytes and factors: the premise of the bit-equality above."""
    torch.manual_seed(1)
    w = blocky(4096, 4096, 128, decades=20)
    w[:128, 5] = float("nan")
    w[300, 300] = float("-inf")
    w[512:640] = 0
    gathered = gather_on_one_rank(w, Float8Config(recipe_name="mxfp8", linear_granularity="mx128",
                                                  enable_fsdp_float8_all_gather=True))
    (rq, rs), (cq, cs) = f8linear._quantize_mx128(w, True, True, True, False)
    g = torch.zeros(1, 1, device="cuda", dtype=torch.bfloat16)
    for (q, s), (q_ref, s_ref) in ((f8linear._mx128_weight_from_gathered(gathered), (rq, rs)),
                                   (f8linear._mx128_weight_from_gathered(gathered, g), (cq, cs))):
        assert q.shape == q_ref.shape and s.shape == s_ref.shape and s.stride() == s_ref.stride()
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiles_many_equals_the_one_weight_quantizer(dtype):
    """The one-launch quantizer of a block's MXFP8 weights (mx128 Linear shards and expert shards of llama_moe over
    2 ranks, odd ones too): bit for bit what the all-gather hooks make one weight at a time on this GPU
    (to_mxfp8_blocked_rowcol with 128x128 tiles), zero, huge, inf and NaN tiles included; twice (cached table)."""
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol, to_mxfp8_tiles_many
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(2048, 4096), (512, 4096), (512, 4096), (2048, 4096), (1408, 4096), (2048, 2816), (4, 5632, 4096),
              (4, 4096, 2816), (128, 128)]
    xs = [torch.randn(s, device="cuda", generator=g, dtype=torch.float32).to(dtype) for s in shapes]
    xs[0][:128, :128] = 0
    xs[1][5, 7] = 3e38
    xs[2][300, 1000] = float("inf")
    xs[6][1, 10, 20] = float("nan")
    for _ in range(2):
        got = to_mxfp8_tiles_many(xs)
        for i, ((data, scale), x) in enumerate(zip(got, xs)):
            want_d, want_s = to_mxfp8_blocked_rowcol(x, row_block=128, row_tile=128, do_col=False)[:2]
            assert torch.equal(data.view(torch.uint8), want_d.view(torch.uint8)), (i, dtype)
            assert torch.equal(scale, want_s[..., ::128, ::4]), (i, dtype)
        for x in xs:
            x.mul_(-0.5)
