"""MoE layer numerics against naive float64 references: grouped GEMM, experts, dispatch, router, aux loss."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from titan_fp8.models import moe as moe_mod
from titan_fp8.models.moe import GroupedExperts, MoE, MoEArgs, dispatch_plan, grouped_mm, padded_buffer_rows


def _offs(sizes):
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)


def _grouped_mm_reference(x, w, sizes):
    """Slice per group with host-known sizes; rows past the groups stay zero."""
    out = x.new_zeros(x.shape[0], w.shape[1])
    start = 0
    for e, n in enumerate(sizes):
        out[start:start + n] = x[start:start + n] @ w[e].T
        start += n
    return out


# group sizes: uneven, empty first/middle/last experts, everything in one expert; (sizes, tail rows)
GROUPS = [([3, 0, 9, 1], 0), ([0, 5, 0, 11], 4), ([16, 0, 0, 0], 3), ([0, 0, 0, 8], 0), ([2, 7, 4, 0], 5)]


@pytest.mark.parametrize("sizes,tail", GROUPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_grouped_mm_matches_per_group_loop(sizes, tail, dtype):
    torch.manual_seed(sum(sizes) * 7 + tail)
    rows, d_in, d_out, e = sum(sizes) + tail, 16, 24, len(sizes)
    x64 = torch.randn(rows, d_in, dtype=torch.float64)
    if tail:  # padding rows hold garbage, even non-finite values: it must not leak anywhere
        x64[-tail:] = float("nan")
        x64[-1, 0] = float("inf")
    w64 = torch.randn(e, d_out, d_in, dtype=torch.float64)
    g64 = torch.randn(rows, d_out, dtype=torch.float64)
    offs = _offs(sizes)

    x = x64.to(dtype).requires_grad_()
    w = w64.to(dtype).requires_grad_()
    out = grouped_mm(x, w, offs)
    out.backward(g64.to(dtype))

    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    ref = _grouped_mm_reference(xr, wr, sizes)
    ref.backward(g64)

    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    valid = sum(sizes)

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()

    assert rel(out[:valid], ref[:valid]) < tol
    assert torch.equal(out[valid:], torch.zeros_like(out[valid:]))  # padding rows exactly zero
    assert rel(x.grad[:valid], xr.grad[:valid]) < tol
    assert torch.equal(x.grad[valid:], torch.zeros_like(x.grad[valid:]))
    assert torch.isfinite(w.grad).all()
    assert rel(w.grad, wr.grad) < tol
    for i, n in enumerate(sizes):  # empty experts get exactly zero weight gradient
        if n == 0:
            assert torch.equal(w.grad[i], torch.zeros_like(w.grad[i]))


def test_grouped_mm_takes_torch_path_on_cpu_where_available():
    # The fp32/bf16 runs above exercise torch._grouped_mm on CPU (torch >= 2.13), not only the loop.
    x, w = torch.randn(8, 16), torch.randn(2, 8, 16)
    expected = torch.float32 in moe_mod._CPU_GROUPED_MM_DTYPES
    assert moe_mod._use_torch_grouped_mm(x, w) == expected
    assert not moe_mod._use_torch_grouped_mm(x.double(), w.double())
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13):
        assert expected, "torch 2.13 runs _grouped_mm on CPU; the probe should have found it"


def test_grouped_mm_rejects_bad_offsets():
    x, w = torch.randn(8, 16), torch.randn(2, 8, 16)
    with pytest.raises(ValueError, match="int32"):
        grouped_mm(x, w, torch.tensor([4, 8]))
    with pytest.raises(ValueError, match="offs"):
        grouped_mm(x, w, torch.tensor([8], dtype=torch.int32))
    with pytest.raises(ValueError, match="w"):
        grouped_mm(x, torch.randn(2, 8, 12), torch.tensor([4, 8], dtype=torch.int32))


def _swiglu(x, w1, w2, w3):
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_experts_matches_loop(dtype):
    torch.manual_seed(1)
    sizes, tail = [5, 0, 12, 3], 6
    experts = GroupedExperts(16, 32, 4).to(dtype)
    experts.init_weights(0.1)
    x = torch.randn(sum(sizes) + tail, 16, dtype=dtype, requires_grad=True)
    g = torch.randn(x.shape[0], 16, dtype=dtype)
    out = experts(x, _offs(sizes))
    out.backward(g)

    params = [p.detach().double().requires_grad_() for p in (experts.w13, experts.w2)]
    xr = x.detach().double().requires_grad_()
    ref = torch.zeros(x.shape[0], 16, dtype=torch.float64)
    start = 0
    for e, n in enumerate(sizes):
        w1, w3 = params[0][e].chunk(2, dim=0)
        ref[start:start + n] = _swiglu(xr[start:start + n], w1, params[1][e], w3)
        start += n
    ref.backward(g.double())

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=tol, atol=tol)
    for p, pr in zip((experts.w13, experts.w2), params):
        torch.testing.assert_close(p.grad.double(), pr.grad, rtol=tol, atol=tol)
    assert torch.equal(experts.w13.grad[1], torch.zeros_like(experts.w13.grad[1]))  # empty expert


def test_grouped_experts_mm_is_swappable_per_instance():
    experts = GroupedExperts(8, 8, 2)
    experts.init_weights(0.1)
    calls = []

    def spy(x, w, offs):
        calls.append(tuple(w.shape))
        return grouped_mm(x, w, offs)

    experts.mm = spy
    experts(torch.randn(4, 8), torch.tensor([1, 4], dtype=torch.int32))
    assert calls == [(2, 16, 8), (2, 8, 8)]  # one GEMM for w1 and w3 (w13), one for w2
    assert GroupedExperts.mm is not spy and GroupedExperts(8, 8, 2).mm is grouped_mm


@pytest.mark.parametrize("align", [1, 8, 32])
def test_dispatch_plan_layout(align):
    torch.manual_seed(align)
    n, k, e = 37, 2, 5
    scores = torch.randn(n, e)
    scores[:, 3] = -1e9  # expert 3 empty
    scores[:, 0] += 2.0  # expert 0 crowded
    experts = scores.topk(k, dim=-1).indices
    src, pos, offs, counts = dispatch_plan(experts, e, align)
    rows = padded_buffer_rows(n * k, e, align)

    assert src.shape == (rows,) and pos.shape == (n * k,) and offs.dtype == torch.int32
    assert torch.equal(counts, torch.bincount(experts.flatten(), minlength=e))
    assert counts[3] == 0 and counts.sum() == n * k
    assert offs[-1] == rows
    starts = torch.cat([offs.new_zeros(1), offs[:-1]])
    sizes = (offs - starts).long()
    assert ((sizes % align) == 0).all() and (sizes >= counts).all()
    assert (sizes[:-1] < counts[:-1] + align).all()  # no more padding than needed (last absorbs slack)
    # every (token, slot) pair lands in its expert's group, on a row that names its token
    flat = experts.flatten()
    tokens = torch.arange(n * k) // k
    group_of_row = torch.searchsorted(offs.long(), torch.arange(rows), right=True)
    assert torch.equal(group_of_row[pos], flat)
    assert torch.equal(src[pos], tokens)
    assert len(set(pos.tolist())) == n * k  # unique rows
    padding = torch.ones(rows, dtype=torch.bool)
    padding[pos] = False
    assert (src[padding] == n).all()
    # stable: inside a group, pairs keep (token, slot) order
    for i in range(e):
        rows_i = pos[flat == i]
        assert torch.equal(rows_i, rows_i.sort().values)


def _reference_moe(m: MoE, x, bias):
    """Token-by-token float64 MoE with the module's parameters (shared autograd leaves)."""
    a = m.args
    gate = m.router.gate.weight
    w1, w3 = m.experts.w13.chunk(2, dim=1)
    w2 = m.experts.w2
    xf = x.reshape(-1, x.shape[-1])
    outs, probs_sum = [], 0
    counts = torch.zeros(a.num_experts, dtype=torch.float64)
    for t in range(xf.shape[0]):
        logits = gate @ xf[t]
        scores = torch.softmax(logits, 0) if a.score_func == "softmax" else torch.sigmoid(logits)
        select = (scores + bias) if a.load_balance == "aux_free" else scores
        chosen = sorted(range(a.num_experts), key=lambda i: -select[i].item())[:a.top_k]
        wts = torch.stack([scores[i] for i in chosen])
        if a.route_norm:
            wts = wts / wts.sum()
        y = sum(wts[j] * _swiglu(xf[t], w1[i], w2[i], w3[i]) for j, i in enumerate(chosen))
        if m.shared_expert is not None:
            s = m.shared_expert
            y = y + _swiglu(xf[t], s.w1.weight, s.w2.weight, s.w3.weight)
        outs.append(y)
        for i in chosen:
            counts[i] += 1
        probs_sum = probs_sum + (scores if a.score_func == "softmax" else scores / scores.sum())
    n = xf.shape[0]
    aux = torch.zeros((), dtype=torch.float64)
    if a.load_balance == "aux_loss":
        f = counts * a.num_experts / (a.top_k * n)
        aux = a.aux_loss_coef * (f * probs_sum / n).sum()
    return torch.stack(outs).view(x.shape), aux, counts


VARIANTS = [
    # score_func, route_norm, shared, load_balance, align
    ("softmax", False, False, "aux_loss", 1),
    ("softmax", True, True, "aux_loss", 8),
    ("sigmoid", False, True, "none", 1),
    ("sigmoid", True, False, "aux_free", 8),
    ("sigmoid", True, True, "aux_loss", 32),
    ("softmax", False, True, "aux_free", 1),
]


@pytest.mark.parametrize("score_func,route_norm,shared,load_balance,align", VARIANTS)
def test_moe_matches_token_loop_reference(score_func, route_norm, shared, load_balance, align):
    torch.manual_seed(3)
    dim, e = 16, 4
    args = MoEArgs(num_experts=e, top_k=2, hidden_dim=24, score_func=score_func, route_norm=route_norm,
                   load_balance=load_balance, aux_loss_coef=0.1,
                   num_shared_experts=1 if shared else 0, shared_hidden_dim=20)
    m = MoE(dim, args).double()
    m.init_weights(0.2)
    m.token_group_align = align
    # crafted routing: feature 0 is large and positive, and the gate's column 0 ranks the experts,
    # so expert 3 never wins a top-2 place and experts 0 / 1 are crowded -> uneven + empty groups
    with torch.no_grad():
        m.router.gate.weight.normal_(0, 0.3)
        m.router.gate.weight[:, 0] = torch.tensor([1.0, 0.6, 0.0, -8.0])
        if load_balance == "aux_free":  # the bias steers selection only: it moves experts 1 <-> 2
            m.router.expert_bias.copy_(torch.tensor([0.0, -0.3, 0.3, 0.0]))
    x = torch.randn(3, 7, dim, dtype=torch.float64)
    x[..., 0] = 3.0 + x[..., 0].abs()
    x.requires_grad_()
    g = torch.randn(3, 7, dim, dtype=torch.float64)

    out = m(x)
    ((out * g).sum() + m.aux_loss).backward()
    got = {name: p.grad.clone() for name, p in m.named_parameters()}
    got_x = x.grad.clone()

    m.zero_grad()
    x.grad = None
    ref, ref_aux, ref_counts = _reference_moe(m, x, m.router.expert_bias.double())
    ((ref * g).sum() + ref_aux).backward()

    assert torch.equal(m.tokens_per_expert.double(), ref_counts)
    assert ref_counts[3] == 0 and len(set(ref_counts.tolist())) > 2  # the test really is uneven
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.aux_loss, ref_aux, rtol=1e-10, atol=1e-14)
    if load_balance == "aux_loss":
        assert m.aux_loss > 0
    else:
        assert m.aux_loss == 0
    torch.testing.assert_close(got_x, x.grad, rtol=1e-10, atol=1e-12)
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(got[name], p.grad, rtol=1e-10, atol=1e-12, msg=name)
    assert torch.equal(got["experts.w13"][3], torch.zeros_like(got["experts.w13"][3]))


def test_moe_bf16_close_to_fp64():
    # the bf16 path (torch._grouped_mm on CPU where available) against the same layer in fp64
    torch.manual_seed(5)
    args = MoEArgs(num_experts=4, top_k=2, hidden_dim=32, num_shared_experts=1, shared_hidden_dim=32)
    m = MoE(32, args)
    m.init_weights(0.05)
    x = torch.randn(2, 24, 32)
    m64 = MoE(32, args).double()
    m64.load_state_dict(m.state_dict())
    ref = m64(x.double())
    out = m.bfloat16()(x.bfloat16())
    assert out.dtype == torch.bfloat16
    # a near-tie token may route differently in bf16; the SQNR bound leaves room for a few
    sqnr = 10 * torch.log10(ref.pow(2).sum() / (out.double() - ref).pow(2).sum())
    assert sqnr > 30, f"SQNR {sqnr:.1f} dB"


@pytest.mark.parametrize("align", [1, 8])
def test_moe_compiles_fullgraph_without_host_sync(align):
    # .item() / .tolist() / nonzero would graph-break (or fail) under fullgraph=True
    torch.manual_seed(0)
    args = MoEArgs(num_experts=4, top_k=2, hidden_dim=32, num_shared_experts=1, shared_hidden_dim=16,
                   load_balance="aux_free")
    m = MoE(16, args)
    m.init_weights(0.1)
    m.token_group_align = align
    x = torch.randn(2, 9, 16, requires_grad=True)
    eager = m(x)
    eager.sum().backward()
    grad_eager = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, grad_eager, rtol=1e-5, atol=1e-6)
    assert torch.equal(m.tokens_per_expert, torch.bincount(m.router(x.detach().view(-1, 16))[1].flatten(),
                                                           minlength=4))


def test_moe_profiler_scopes_present():
    m = MoE(16, MoEArgs(num_experts=4, top_k=2, hidden_dim=16))
    m.init_weights(0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        m(torch.randn(1, 5, 16))
    names = {ev.name for ev in prof.events()}
    assert {"moe.route", "moe.permute", "moe.experts", "moe.unpermute"} <= names


def test_moe_args_validation_names_the_key():
    for kwargs, key in [({"score_func": "relu"}, "score_func"), ({"load_balance": "x"}, "load_balance"),
                        ({"top_k": 9}, "top_k"), ({"num_shared_experts": 1}, "shared_hidden_dim")]:
        with pytest.raises(ValueError, match=key):
            MoEArgs(**kwargs)
    with pytest.raises(ValueError, match=r"\[B, S, 16\]"):
        MoE(16, MoEArgs(num_experts=2, top_k=1, hidden_dim=8))(torch.randn(3, 8))


def test_old_state_dict_with_w1_w3_loads_into_w13():
    torch.manual_seed(3)
    experts = GroupedExperts(8, 16, 2)
    experts.init_weights(0.1)
    w1, w3 = experts.w13.detach().chunk(2, dim=1)
    old = {"w1": w1.clone(), "w3": w3.clone(), "w2": experts.w2.detach().clone()}
    fresh = GroupedExperts(8, 16, 2)
    fresh.load_state_dict(old)
    assert torch.equal(fresh.w13, experts.w13) and torch.equal(fresh.w2, experts.w2)


@pytest.mark.parametrize("compiled,e", [(False, 8), (True, 8), (True, 24)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_router_logits_low_precision_matches_fp32_path(compiled, e, dtype):
    """router_logits for bf16 x and gate weight (the fp32-copy-free Function; fp16 takes the plain path) equals
    the plain fp32 path,
    logits and both gradients, up to fp32 summation order; compiled, its backward takes the broadcast form that
    inductor fuses. Against a float64 reference: rel. error < 1e-5 on logits and dw; dx (rounded to the low
    precision dtype once, like the reference's) within one rounding of it."""
    torch.manual_seed(3 if compiled else 4)
    n, d = 37, 96  # e > moe._FUSED_DX_MAX_EXPERTS: the compiled input gradient takes the GEMM form
    x = (torch.randn(n, d) * 3).to(dtype)
    x[0] = 0  # a zero row
    x[1, :4] = torch.tensor([3e3 if dtype == torch.float16 else 1e30, -1e-5, 0.0, 2.0 ** -14], dtype=dtype)
    w = (torch.randn(e, d) * 0.02).to(dtype)
    g = torch.randn(n, e)
    g[2] = 0

    def ours(x, w):
        return moe_mod.router_logits(x, w)

    fn = torch.compile(ours, backend="inductor", fullgraph=True) if compiled else ours
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = fn(xa, wa)
    assert out.dtype == torch.float32
    out.backward(g)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    ref = F.linear(x64, w64)
    ref.backward(g.double())

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    assert rel(out, ref) < 1e-5
    assert xa.grad.dtype == dtype and wa.grad.dtype == dtype
    eps = torch.finfo(dtype).eps
    assert rel(xa.grad, x64.grad) < eps and rel(wa.grad, w64.grad) < eps
    # the reference path's own low-precision gradients: the same up to fp32 order (one rounding apart at most)
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.linear(xb.float(), wb.float()).backward(g)
    assert torch.allclose(xa.grad.float(), xb.grad.float(), rtol=eps, atol=0)
    assert torch.allclose(wa.grad.float(), wb.grad.float(), rtol=eps, atol=1e-30)


def test_router_logits_keeps_fp64_and_mixed_dtypes_on_the_plain_path():
    x, w = torch.randn(5, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
    assert moe_mod.router_logits(x, w).dtype == torch.float64
    out = moe_mod.router_logits(x.to(torch.bfloat16), w.float().requires_grad_())  # fp32 gate: the fp32 path
    assert out.dtype == torch.float32 and "Bf16" not in type(out.grad_fn).__name__


def test_bf16_terms_sum_exactly_to_fp32():
    g = torch.randn(1000, 8) * torch.logspace(-30, 30, 1000)[:, None]
    g[0] = 0
    g[1, :4] = torch.tensor([-3e38, 2.0 ** -110, -(2.0 ** -110) * 1.9999, 3.4e38])  # huge, the exactness edge
    t = moe_mod._bf16_terms(g).float()
    assert torch.equal(t[:, :8] + t[:, 8:16] + t[:, 16:], g)
    assert torch.equal((t[:, :8].double() + t[:, 8:16].double() + t[:, 16:].double()), g.double())
    tiny = torch.tensor([[1e-40, -1e-38, 2.0 ** -120, 0.0]])  # subnormal residuals: within 2^-133
    t = moe_mod._bf16_terms(tiny).float()
    assert ((t[:, :4] + t[:, 4:8] + t[:, 8:]) - tiny).abs().max() <= 2.0 ** -133
