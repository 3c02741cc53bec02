"""The mx32 MXFP8 Linear (recipe_name="mxfp8", linear_granularity="mx32") on Hopper: its three GEMMs
on kernels.grouped_gemm's Gluon kernels (one group) with the Triton quantizers, against the emulated twin (plain
PyTorch quantizers, fp32 GEMMs of the decoded operands) and the float64 product of the same operands; the gathered
weight; and that no GEMM runs on dequantized bf16 operands (inductor against eager: test_float8_mx128_linear_gpu.py)."""
import pytest
import torch
import torch.nn as nn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (the Gluon mx32 kernels)")

from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402
from kernels.mxfp8 import from_mxfp8  # noqa: E402
from titan_fp8.float8 import Float8Config  # noqa: E402
from titan_fp8.float8.linear import float8_linear  # noqa: E402

TOL = 3e-3  # norm-wise relative error, bf16 outputs (bf16 rounding alone ~1.7e-3)


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def fwd_bwd(emulate, x, w, g, cfg=None):
    xq, wq = x.clone().requires_grad_(), nn.Parameter(w.clone()) if not hasattr(w, "_scale") else w
    y = float8_linear(xq, wq, cfg or Float8Config(recipe_name="mxfp8", linear_granularity="mx32", emulate=emulate))
    y.backward(g)
    return y, xq.grad, getattr(wq, "grad", None)


def blocky(rows, cols, decades=3):
    """bf16 values whose 1x32 blocks span 2 * decades decades."""
    t = torch.randn(rows, cols, device="cuda")
    mag = torch.pow(10.0, torch.empty(rows, cols // 32, device="cuda").uniform_(-decades, decades))
    return (t * mag.repeat_interleave(32, 1)).to(torch.bfloat16)


def _deq(t, dim, block, tile):
    q, s = to_mxfp8_blocked(t, dim, block, tile)
    return from_mxfp8(q, s, dim, torch.float64)


def _deq_tokens(t, tile):
    pad = (-t.shape[0]) % 32
    return _deq(torch.nn.functional.pad(t, (0, 0, 0, pad)).t().contiguous(), -1, 32, tile).t()[:t.shape[0]]


# (M, K, N): token counts 1, 31, 33, 127, 129 (partial 32-token blocks and 128-row tiles), the llama shapes
@pytest.mark.parametrize("M,K,N", [(1, 256, 128), (31, 384, 640), (33, 256, 256), (127, 512, 384),
                                   (129, 1024, 256), (1024, 2816, 1024), (2048, 4096, 2816), (8192, 4096, 4096)])
def test_gluon_path_matches_emulation_and_float64(M, K, N):
    torch.manual_seed(M)
    x, w, g = blocky(M, K), blocky(N, K) * 0.02, blocky(M, N) * 1e-3
    hw = fwd_bwd(False, x, w, g)
    em = fwd_bwd(True, x, w, g)
    wd = _deq(w.float(), -1, 128, 128)
    xf, gf = x.float(), g.float()
    refs = (_deq(xf, -1, 32, 1) @ wd.t(), _deq(gf, -1, 32, 1) @ wd, _deq_tokens(gf, 1).t() @ _deq_tokens(xf, 128))
    for what, a, b, r in zip(("output", "grad_input", "grad_weight"), hw, em, refs):
        assert a.dtype == b.dtype == torch.bfloat16 and a.shape == r.shape
        assert torch.isfinite(a).all(), what
        assert rel(a, b) < TOL, (what, rel(a, b))
        assert rel(a, r) < TOL, (what, rel(a, r))


def test_gemms_run_on_the_gluon_kernels_not_on_bf16():
    """The profile of one fwd+bwd: the three Gluon kernels (two NT launches, one wgrad), no cuBLAS / CUTLASS GEMM
    (which a dequantize-then-matmul path would launch)."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(4)
    x, w, g = blocky(512, 1024), blocky(768, 1024) * 0.02, blocky(512, 768) * 1e-3
    fwd_bwd(False, x, w, g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd(False, x, w, g)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gemms = [n for n in names if any(k in n for k in ("gemm", "Gemm", "cutlass", "nvjet", "xmma", "sm90_"))]
    assert sum("_nt_" in n for n in names) == 2 and sum("wgrad" in n for n in names) == 1, names
    assert not gemms, gemms


def test_nan_and_inf_propagate_on_the_gpu():
    torch.manual_seed(1)
    x, w, g = blocky(256, 256), blocky(256, 256) * 0.02, blocky(256, 256) * 1e-3
    x[10, 5] = float("nan")
    x[200, 130] = float("inf")
    g[20, 3] = float("nan")
    y, gx, gw = fwd_bwd(False, x, w, g)
    assert y[10].isnan().all() and y[200].isnan().all()
    assert torch.isfinite(y[[i for i in range(256) if i not in (10, 200)]]).all()
    assert gx[20].isnan().all() and torch.isfinite(gx[:20]).all()
    assert gw[:, :256].isnan().all()  # x^T's NaN tiles (features 0..255) and g^T's NaN block (row 3)
    x2, w2 = blocky(256, 256), w.clone()
    w2[1, 1] = float("nan")  # weight tile (0, 0): output features 0..127
    y2, _, _ = fwd_bwd(False, x2, w2, g)
    assert y2[:, :128].isnan().all() and torch.isfinite(y2[:, 128:]).all()


def test_gathered_weight_equals_plain_weight_bit_for_bit():
    from titan_fp8.float8.weights import gather_on_one_rank
    torch.manual_seed(5)
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity="mx32", enable_fsdp_float8_all_gather=True)
    x, w, g = blocky(384, 1024), blocky(512, 1024) * 0.02, blocky(384, 512) * 1e-3
    gathered = gather_on_one_rank(w, cfg)
    y_g, gx_g, _ = fwd_bwd(False, x, gathered, g, cfg)
    y_p, gx_p, _ = fwd_bwd(False, x, w, g, cfg)
    assert torch.equal(y_g, y_p) and torch.equal(gx_g, gx_p)


# inductor against eager: tests/gpu/test_float8_mx128_linear_gpu.py::test_compiled_module_matches_eager (its mx32 cases)
