"""bf16 torch._grouped_mm path of the MoE on CUDA against float64 references (skips without CUDA)."""
import itertools

import pytest
import torch

from titan_fp8.models.moe import MoE, MoEArgs, grouped_mm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("sizes,tail", [([37, 0, 211, 5], 0), ([0, 64, 0, 129], 19), ([256, 0, 0, 0], 0)])
def test_grouped_mm_bf16_cuda_matches_fp64(sizes, tail):
    torch.manual_seed(0)
    rows, d_in, d_out = sum(sizes) + tail, 256, 384
    x64 = torch.randn(rows, d_in, dtype=torch.float64)
    w64 = torch.randn(len(sizes), d_out, d_in, dtype=torch.float64) * d_in ** -0.5
    g64 = torch.randn(rows, d_out, dtype=torch.float64)
    offs = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device="cuda")

    x = x64.cuda().bfloat16().requires_grad_()
    w = w64.cuda().bfloat16().requires_grad_()
    out = grouped_mm(x, w, offs)
    out.backward(g64.cuda().bfloat16())

    xr, wr = x.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    ref = torch.zeros(rows, d_out, dtype=torch.float64)
    start = 0
    for e, n in enumerate(sizes):
        ref[start:start + n] = xr[start:start + n] @ wr[e].T
        start += n
    ref.backward(g64)
    valid = sum(sizes)
    assert _rel(out[:valid].cpu(), ref[:valid]) < 1e-2
    assert _rel(x.grad[:valid].cpu(), xr.grad[:valid]) < 1e-2
    assert _rel(w.grad.cpu(), wr.grad) < 1e-2
    assert (out[valid:] == 0).all() and (x.grad[valid:] == 0).all()
    for e, n in enumerate(sizes):
        if n == 0:
            assert (w.grad[e] == 0).all(), f"empty expert {e} got a nonzero weight gradient"


@pytest.mark.parametrize("align", [1, 8, 16, 32])
def test_moe_bf16_cuda_matches_fp64_cpu(align):
    torch.manual_seed(1)
    args = MoEArgs(num_experts=8, top_k=2, hidden_dim=256, num_shared_experts=1, shared_hidden_dim=256)
    ref_layer = MoE(128, args).double()
    ref_layer.init_weights(0.05)
    layer = MoE(128, args).cuda()
    layer.load_state_dict(ref_layer.state_dict())
    layer = layer.bfloat16()
    layer.token_group_align = align
    x = torch.randn(4, 100, 128, dtype=torch.float64)
    ref = ref_layer(x)
    out = layer(x.cuda().bfloat16())
    torch.cuda.synchronize()
    sqnr = 10 * torch.log10(ref.pow(2).sum() / (out.double().cpu() - ref).pow(2).sum())
    assert sqnr > 30, f"SQNR {sqnr:.1f} dB"
    out.float().pow(2).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_moe_forward_has_no_host_sync():
    args = MoEArgs(num_experts=8, top_k=2, hidden_dim=256)
    layer = MoE(128, args).cuda().bfloat16()
    layer.init_weights(0.05)
    layer.token_group_align = 16
    x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x)  # warm up (allocator, lazy init)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = layer(x)
        y.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("compiled", [False, True])
def test_router_logits_bf16_cuda_matches_fp64(compiled):
    """The fp32-copy-free router logits (bf16 GEMM with fp32 output; compiled: the fused broadcast backward)
    against float64: logits and dw rel. error < 1e-5, dx within one bf16 rounding (eps 2^-8)."""
    from titan_fp8.models.moe import router_logits

    torch.manual_seed(1)
    n, d, e = 4099, 1024, 8
    x = (torch.randn(n, d, device="cuda") * 2).bfloat16()
    x[0] = 0
    x[1, :3] = torch.tensor([1e30, -1e-30, 2.0 ** -130], device="cuda").bfloat16()
    w = (torch.randn(e, d, device="cuda") * 0.02).bfloat16()
    g = torch.randn(n, e, device="cuda")
    fn = torch.compile(router_logits, fullgraph=True) if compiled else router_logits
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = fn(xa, wa)
    out.backward(g)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.nn.functional.linear(x64, w64)
    ref.backward(g.double())
    assert out.dtype == torch.float32 and _rel(out, ref) < 1e-5
    assert _rel(xa.grad, x64.grad) < 2 ** -8 and _rel(wa.grad, w64.grad) < 2 ** -8
