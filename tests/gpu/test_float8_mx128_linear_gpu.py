"""The mx128 MXFP8 Linear (recipe_name="mxfp8", linear_granularity="mx128") on a Hopper GPU: the cuBLAS blockwise
path with the Triton quantizers against the emulated twin (plain PyTorch quantizers, fp32 GEMMs of the
dequantized operands), the Triton quantizers bit for bit against their reference, and inductor against eager (for
the mx32 Linear too)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0) or not hasattr(F, "scaled_mm"),
    reason="needs a CUDA GPU with cuBLAS fp8 blockwise GEMMs (sm_90) and torch.nn.functional.scaled_mm")

from kernels.grouped_gemm.quant import to_mx128_blockwise_reference  # noqa: E402
from titan_fp8.float8 import Float8Config, convert_to_float8_training  # noqa: E402
from titan_fp8.float8.linear import float8_linear  # noqa: E402

TOL = 3e-3  # norm-wise relative error, bf16 outputs (bf16 rounding alone ~1.7e-3)


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def fwd_bwd(emulate, x, w, g):
    xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity="mx128", emulate=emulate)
    y = float8_linear(xq, wq, cfg)
    y.backward(g)
    return y, xq.grad, wq.grad


def blocky(rows, cols, tile_rows=1, decades=3):
    t = torch.randn(rows, cols, device="cuda")
    mag = torch.pow(10.0, torch.empty(-(-rows // tile_rows), cols // 128, device="cuda").uniform_(-decades, decades))
    return (t * mag.repeat_interleave(tile_rows, 0)[:rows].repeat_interleave(128, 1)).to(torch.bfloat16)


# (M, K, N): block counts not multiples of 4 (padded 128x128 scale layouts), the llama shapes, a wide one
@pytest.mark.parametrize("xt_tile", [False, True], ids=["wgrad_x_1x128", "wgrad_x_tiles"])
@pytest.mark.parametrize("M,K,N", [(256, 384, 640), (1024, 2816, 1024), (2048, 4096, 2816), (8192, 4096, 4096)])
def test_cublas_path_matches_emulation(monkeypatch, M, K, N, xt_tile):
    from titan_fp8.float8 import linear
    monkeypatch.setattr(linear, "MX128_WGRAD_X_TILES", xt_tile)
    torch.manual_seed(0)
    x, w, g = blocky(M, K), blocky(N, K, 128) * 0.02, blocky(M, N) * 1e-3
    hw = fwd_bwd(False, x, w, g)
    em = fwd_bwd(True, x, w, g)
    for what, a, b in zip(("output", "grad_input", "grad_weight"), hw, em):
        assert a.dtype == b.dtype == torch.bfloat16
        assert torch.isfinite(a).all(), what
        assert rel(a, b) < TOL, (what, rel(a, b))


def test_nan_propagates_on_the_gpu():
    torch.manual_seed(1)
    x, w, g = blocky(256, 256), blocky(256, 256, 128) * 0.02, blocky(256, 256) * 1e-3
    x[10, 5] = float("nan")
    x[200, 130] = float("inf")
    y, gx, gw = fwd_bwd(False, x, w, g)
    assert y[10].isnan().all() and y[200].isnan().all() and gw[:, 5].isnan().all() and gw[:, 130].isnan().all()
    assert torch.isfinite(y[:10]).all() and torch.isfinite(gx).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tile,col_tile", [(False, False), (True, True), (False, True)])
def test_triton_quantizer_bitwise(dtype, tile, col_tile):
    from kernels.grouped_gemm.quant_triton import to_mx128_blockwise
    torch.manual_seed(2)
    x = blocky(1024, 2816, 128 if tile else 1, decades=20).to(dtype)
    x[3] = 0
    x[4, 7] = float("nan")
    x[900, 2000] = float("-inf")
    got = to_mx128_blockwise(x, tile, col_tile=col_tile)
    ref = to_mx128_blockwise_reference(x, tile, col_tile=col_tile)
    for (qg, sg), (qr, sr) in zip(got, ref):
        assert sg.shape == sr.shape and sg.stride() == sr.stride()
        assert torch.equal(qg.view(torch.uint8), qr.view(torch.uint8))
        assert torch.equal(sg.view(torch.int32), sr.view(torch.int32))


# mx32 (tests/gpu/test_float8_mx32_linear_gpu.py's Linear, Gluon GEMMs) at 1000 tokens: a partial 32-token block
@pytest.mark.parametrize("gran,tokens", [("mx128", 512), ("mx32", 500)])
@pytest.mark.parametrize("traced", [True, False], ids=["triton_op", "custom_op"])
def test_compiled_module_matches_eager(monkeypatch, traced, gran, tokens):
    """inductor, fullgraph, with the quantizer's launch traced into the generated code (triton op) or called as
    an opaque custom op: both give eager's result (a re-laid-out scale buffer would not)."""
    import kernels.grouped_gemm.quant_triton as quant_triton
    monkeypatch.setattr(quant_triton, "TRACED_LAUNCH", traced)
    torch.manual_seed(3)
    torch._dynamo.reset()
    lin = nn.Sequential(nn.Linear(1024, 768, bias=True, device="cuda", dtype=torch.bfloat16))
    convert_to_float8_training(lin, Float8Config(recipe_name="mxfp8", linear_granularity=gran, filter_fqns=()))
    x = torch.randn(2, tokens, 1024, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(2, tokens, 768, device="cuda", dtype=torch.bfloat16)

    def step(f):
        xq = x.clone().requires_grad_()
        y = f(xq)
        y.backward(g)
        out = (y, xq.grad, lin[0].weight.grad.clone())
        lin[0].weight.grad = None
        lin[0].bias.grad = None
        return out
    eager = step(lin)
    compiled = step(torch.compile(lin, fullgraph=True))
    for what, a, b in zip(("output", "grad_input", "grad_weight"), eager, compiled):
        assert rel(b, a) < 1e-3, (what, rel(b, a))
