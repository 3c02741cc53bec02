"""benchmarks/moe_layer.py's variant names: "tw:" converts the shared expert's Linears (and only them) to float8
tensorwise, "%traced" asks for kernels.moe's traced launches; wrong combinations are clear errors."""
import pytest
import torch

from benchmarks.moe_layer import build_variant, split_variant
from titan_fp8.float8.linear import Float8Linear
from titan_fp8.models.moe import MoE, MoEArgs


def _moe(shared, dim=32, hidden=64):
    args = MoEArgs(num_experts=4, top_k=2, hidden_dim=hidden, load_balance="none",
                   num_shared_experts=1 if shared else 0, shared_hidden_dim=64 if shared else 0)
    m = MoE(dim, args)
    m.init_weights(0.02)
    return m


def test_split_variant():
    assert split_variant("tw:mxfp8_mx128%traced") == ("mxfp8_mx128", True, True)
    assert split_variant("fp8_rowwise%opaque") == ("fp8_rowwise", False, False)
    assert split_variant("fp8_rowwise") == ("fp8_rowwise", False, None)
    assert split_variant("mxfp8_mx128+cutlass") == ("mxfp8_mx128+cutlass", False, None)


@pytest.mark.parametrize("name", ["tw:bf16", "tw:fp8_rowwise"])
def test_tw_converts_only_the_shared_expert(name):
    moe = build_variant(_moe(True), name, emulate=True)
    lin = [type(m) for m in moe.shared_expert.modules() if isinstance(m, torch.nn.Linear)]
    assert lin and all(t is Float8Linear for t in lin)
    assert not any(isinstance(m, Float8Linear) for n, m in moe.named_modules() if not n.startswith("shared_expert"))
    assert moe.traced_launch is None


def test_plain_variant_keeps_shared_expert_bf16():
    moe = build_variant(_moe(True), "bf16", emulate=True)
    assert not any(isinstance(m, Float8Linear) for m in moe.modules())


def test_errors_name_the_variant():
    with pytest.raises(ValueError, match="no shared expert"):
        build_variant(_moe(False), "tw:bf16", emulate=True)
    with pytest.raises(ValueError, match="'bf16%traced'"):
        build_variant(_moe(True), "bf16%traced", emulate=True)
    with pytest.raises(ValueError, match="needs CUDA"):
        build_variant(_moe(True), "fp8_rowwise%traced", emulate=True)


def test_cutlass_config_suffix(monkeypatch):
    monkeypatch.delenv("TITAN_FP8_CUTLASS_SCHEDULE", raising=False)
    moe = build_variant(_moe(True, 128, 128), "tw:mxfp8_mx128^fprop=cooperative_2x1:swizzle=4", emulate=True)
    assert moe.cutlass_schedule == "fprop=cooperative_2x1:swizzle=4"
    assert build_variant(_moe(True, 128, 128), "mxfp8_mx128", emulate=True).cutlass_schedule is None
    import os
    assert "TITAN_FP8_CUTLASS_SCHEDULE" not in os.environ  # the check leaves the environment as it was
    with pytest.raises(ValueError, match="swizzle=3"):
        build_variant(_moe(True), "mxfp8_mx128^cooperative:swizzle=3", emulate=True)
    with pytest.raises(ValueError, match="is for mxfp8_mx128"):
        build_variant(_moe(True), "fp8_rowwise^cooperative", emulate=True)


def test_copy_suffix_holds_the_token_major_copy():
    """"~copy" runs the experts as before session 20 (x_kept off: they save x's float8 token-major copy); same
    output and gradients as the plain variant, bit for bit; an error on variants without fused experts."""
    base = _moe(True, 128, 256)  # dim 128 != hidden 256: x's token-major copy is the float8 [128, P]
    x = torch.randn(2, 64, 128)
    runs = []
    for name in ("mxfp8_mx128", "mxfp8_mx128~copy"):
        moe = build_variant(base, name, emulate=True)
        saved = []
        xi = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = moe(xi)
        out.square().sum().backward()
        runs.append([out.detach(), xi.grad, moe.experts.w13.grad, moe.experts.w2.grad])
        P = [t for t in saved if t.dtype == torch.float8_e4m3fn and t.shape[0] == 128 and t.dim() == 2]
        assert bool(P) == (name.endswith("~copy")), (name, [tuple(t.shape) for t in P])
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="~copy is for our float8"):
        build_variant(base, "tw:bf16~copy", emulate=True)
