"""titan_fp8.train.optim: clipping as the fused AdamW's grad_scale equals clipping the gradients in place."""
import pytest
import torch

from titan_fp8.train.optim import grad_norm_and_clip, take_grad_scale


def _params(seed, grad_gain):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (7, 5, 3)]
    ps = [torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float32)) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float32) * grad_gain
    return ps


def _clone(ps):
    out = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for q, p in zip(out, ps):
        q.grad = p.grad.clone()
    return out


@pytest.mark.parametrize("grad_gain, max_norm", [(10.0, 1.0), (1e-3, 1.0), (10.0, 0.0)])
def test_grad_scale_clipping_matches_clipping_in_place(grad_gain, max_norm):
    """Three AdamW steps, fp32 (as the trainer): the fused AdamW given the clipping as grad_scale vs the gradients clipped in
    place (torch's clip_grads_with_norm_) then the same fused AdamW: parameters within 1e-6 relative (the two
    round the scaled gradient differently), the norms equal; without any clipping the parameters differ (the
    test can fail), and the gradients the fused path leaves are the unclipped ones (no in-place pass)."""
    ps, qs, rs = _params(0, grad_gain), None, None
    qs, rs = _clone(ps), _clone(ps)
    opt = lambda xs: torch.optim.AdamW(xs, lr=0.1, weight_decay=0.1, fused=True)  # noqa: E731
    o_p, o_q, o_r = opt(ps), opt(qs), opt(rs)
    for step in range(3):
        g = torch.Generator().manual_seed(step + 1)
        grads = [torch.randn(p.shape, generator=g, dtype=torch.float32) * grad_gain for p in ps]
        for xs in (ps, qs, rs):
            for x, gr in zip(xs, grads):
                x.grad = gr.clone()
        n_p = grad_norm_and_clip(ps, max_norm, o_p)
        assert all(torch.equal(p.grad, gr) for p, gr in zip(ps, grads))  # not touched: the kernel scales
        assert hasattr(o_p, "grad_scale") == (max_norm > 0)
        o_p.step()
        take_grad_scale(o_p)
        assert not hasattr(o_p, "grad_scale")
        n_q = grad_norm_and_clip(qs, max_norm)  # in place
        o_q.step()
        o_r.step()  # never clipped
        assert torch.equal(n_p, n_q)
    for p, q, r in zip(ps, qs, rs):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7), (p - q).abs().max()
    clipped = max_norm > 0 and grad_gain > 1
    assert any(not torch.allclose(p, r, rtol=1e-4, atol=0) for p, r in zip(ps, rs)) == clipped
