"""The fused float8 expert path on CUDA against its emulated twin (CPU), eager and torch.compile'd (fullgraph).

The twin quantizes with the same rules (mxfp8: the Triton quantizer is bit-identical to it) and multiplies the
decoded operands in float64; the GPU GEMMs accumulate in fp32 (fp8_rowwise: torch._scaled_grouped_mm with fast
accumulation), so bf16 intermediates can round differently and flip a later quantization. Bound: SQNR >= 30 dB
between GPU and twin (both are ~23 dB from the float64 truth: the two agree far better than either agrees with it).
"""
import pytest
import torch

from titan_fp8.float8.experts import Float8GroupedExperts, fused_experts
from titan_fp8.models.moe import DispatchPlan, dispatch_plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CASES = [("fp8_rowwise", None), ("mxfp8", "mx128"), ("mxfp8", "mx32")]
D, H, E, N = 256, 512, 4, 500


def sqnr(ref, got):
    ref, got = ref.double().cpu(), got.double().cpu()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - got).pow(2).sum().clamp_min(1e-300)))


def _setup(recipe, gran):
    torch.manual_seed(0)
    m = Float8GroupedExperts(D, H, E, recipe, gran, "auto")
    m.init_weights(0.05)
    m = m.to(torch.bfloat16)
    first = torch.multinomial(torch.tensor([0.6, 0.3, 0.1, 0.0]), N, replacement=True)  # expert 3 empty
    ids = torch.stack([first, (first + 1) % 3], 1)
    x = torch.randn(N, D).to(torch.bfloat16)
    w = torch.rand(N, 2)
    g = torch.randn(N, D)
    return m, ids, x, w, g


def _run(fn, m, x, w, g):
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    m.zero_grad(set_to_none=True)
    y = fn(xi, wi)
    (y.float() * g).sum().backward()
    return [y.detach(), xi.grad, wi.grad, m.w13.grad, m.w2.grad]


@pytest.mark.parametrize("recipe,gran", CASES)
def test_gpu_matches_emulated_twin_eager_and_compiled(recipe, gran):
    m, ids, x, w, g = _setup(recipe, gran)
    plan = dispatch_plan(ids, E, m.token_group_align)
    twin = Float8GroupedExperts(D, H, E, recipe, gran, "emulated").to(torch.bfloat16)
    twin.load_state_dict(m.state_dict())
    want = _run(lambda a, b: twin.routed(a, b, plan), twin, x, w, g)

    m = m.cuda()
    cplan = DispatchPlan(*[t.cuda() for t in plan])
    xc, wc, gc = x.cuda(), w.cuda(), g.cuda()
    eager = _run(lambda a, b: m.routed(a, b, cplan), m, xc, wc, gc)
    spec = m.spec("cuda")

    def step(a, b, w13, w2, src, pos, offs):
        return fused_experts(a, b, w13, w2, DispatchPlan(src, pos, offs, offs), spec)

    torch._dynamo.reset()
    compiled_fn = torch.compile(step, fullgraph=True)
    compiled = _run(lambda a, b: compiled_fn(a, b, m.w13, m.w2, cplan.src, cplan.pos, cplan.offs), m, xc, wc, gc)
    for name, a, b, c in zip(["out", "dx", "dweights", "dw13", "dw2"], eager, compiled, want):
        assert torch.isfinite(a).all(), name
        assert sqnr(c, a) > 30, f"{name} eager vs twin: {sqnr(c, a):.1f} dB"
        assert sqnr(c, b) > 30, f"{name} compiled vs twin: {sqnr(c, b):.1f} dB"
        if name in ("dw13", "dw2"):
            assert torch.count_nonzero(a[3]) == 0 and torch.count_nonzero(b[3]) == 0  # the empty expert


@pytest.mark.parametrize("recipe,gran", CASES)
def test_x_kept_equals_the_saved_copy_on_gpu(recipe, gran):
    """x_kept (x saved, its token-major float8 copy made again in backward, tied to w13's dgrad when compiled)
    gives the same output and gradients bit for bit as the op that saves the copy, eager and compiled (inductor)."""
    m, ids, x, w, g = _setup(recipe, gran)
    m = m.cuda()
    plan = DispatchPlan(*[t.cuda() for t in dispatch_plan(ids, E, m.token_group_align)])
    xc, wc, gc = x.cuda(), w.cuda(), g.cuda()
    spec = m.spec("cuda")
    for kept in (False, True):
        assert all(torch.equal(a, b) for a, b in zip(_run(lambda a, b: m.routed(a, b, plan), m, xc, wc, gc),
                                                     _run(lambda a, b: m.routed(a, b, plan, x_kept=kept),
                                                          m, xc, wc, gc)))
    runs = []
    for kept in (False, True):
        def step(a, b, w13, w2, src, pos, offs, kept=kept):
            return fused_experts(a, b, w13, w2, DispatchPlan(src, pos, offs, offs), spec, x_kept=kept)

        torch._dynamo.reset()
        fn = torch.compile(step, fullgraph=True)
        runs.append(_run(lambda a, b: fn(a, b, m.w13, m.w2, plan.src, plan.pos, plan.offs), m, xc, wc, gc))
    for name, a, b in zip(["out", "dx", "dweights", "dw13", "dw2"], *runs):
        assert torch.equal(a, b), f"{name}: compiled x_kept differs from the saved copy"


def test_dgrad_weight_operand_equals_contract_1():
    """The compiled path's backward weight operand (experts.dgrad_weight_operand, W^T quantized directly; compiled,
    through quant_triton's traced triton op) equals contract 1's transposed fprop operand byte for byte on the GPU,
    at a llama_moe expert weight, eager and compiled."""
    from titan_fp8.float8.expert_weights import expert_weight_operands
    torch.manual_seed(0)
    w = (torch.randn(8, 4096, 2816, device="cuda") * torch.logspace(-3, 3, 2816, device="cuda")).to(torch.bfloat16)
    w[0, 5, 7], w[3, 200, 300] = 3e4, 1e-30
    from titan_fp8.float8.experts import dgrad_weight_operand
    after = w[:1, :1, :1].clone()
    for data, scale in (dgrad_weight_operand(w, after), torch.compile(dgrad_weight_operand)(w, after)):
        for gran in ("mx128", "mx32"):
            ops = expert_weight_operands(w, "mxfp8", gran, which="bwd")
            assert torch.equal(data.view(torch.uint8), ops.bwd_data.view(torch.uint8)), gran
            assert torch.equal(scale.transpose(1, 2), ops.bwd_scale), gran
