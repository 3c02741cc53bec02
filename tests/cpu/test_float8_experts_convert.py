"""convert_to_float8_training with moe_recipe_name "mxfp8" converts routed experts (independently of the Linear
recipe) and pads the MoE's token groups to the op's scale block."""
import copy

import pytest
import torch
import torch.nn as nn

from titan_fp8.float8 import Float8Config, convert_to_float8_training
from titan_fp8.float8.config import MOE_GRANULARITIES
from titan_fp8.float8.experts import GRANULARITIES, Float8GroupedExperts
from titan_fp8.models.moe import GroupedExperts, MoE, MoEArgs

DIM, HID, E = 128, 128, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.moe = MoE(DIM, MoEArgs(num_experts=E, top_k=2, hidden_dim=HID, load_balance="none"))
        self.moe.init_weights(0.05)


def sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - got).pow(2).sum().clamp_min(1e-300)))


def test_config_granularity_names_match_experts_module():
    assert set(MOE_GRANULARITIES) == set(GRANULARITIES)
    assert all(MOE_GRANULARITIES[n] == g.block for n, g in GRANULARITIES.items())
    with pytest.raises(ValueError, match="^moe_granularity"):
        Float8Config(moe_recipe_name="mxfp8", moe_granularity="mx64")


@pytest.mark.parametrize("recipe, granularity, align", [("mxfp8", "mx128", 128), ("mxfp8", "mx32", 32),
                                                        ("fp8_rowwise", None, 16)])
def test_converted_moe_close_to_high_precision(recipe, granularity, align):
    torch.manual_seed(0)
    ref = Net()
    net = copy.deepcopy(ref)
    convert_to_float8_training(net, Float8Config(recipe_name="tensorwise", emulate=True, moe_recipe_name=recipe,
                                               moe_granularity=granularity))
    ex = net.moe.experts
    assert isinstance(ex, Float8GroupedExperts) and (ex.moe_recipe, ex.granularity) == (recipe, granularity)
    assert ex.w13 is ref.moe.experts.w13 or ex.w13.shape == ref.moe.experts.w13.shape
    assert net.moe.token_group_align == align
    assert type(ref.moe.experts) is GroupedExperts and ref.moe.token_group_align == 1
    # uneven groups, an empty expert (column 0 of the gate ranks experts; expert 3 never wins)
    for m in (ref, net):
        with torch.no_grad():
            m.moe.router.gate.weight[:, 0] = torch.tensor([1.0, 0.6, 0.0, -8.0])
    x = torch.randn(2, 96, DIM)
    x[..., 0] = 3.0 + x[..., 0].abs()
    g = torch.randn(2, 96, DIM)
    outs, grads = [], []
    for m in (ref, net):
        xi = x.clone().requires_grad_()
        out = m.moe(xi)
        (out * g).sum().backward()
        outs.append(out.detach())
        grads.append([xi.grad] + [getattr(m.moe.experts, n).grad for n in ("w13", "w2")])
    assert int(net.moe.tokens_per_expert[3]) == 0  # the empty expert really was empty
    # measured 23.2 dB (out) and 23.1-23.6 dB (grads): three chained MXFP8 GEMMs (w1, w3 -> SwiGLU -> w2)
    assert sqnr(outs[0], outs[1]) >= 20, sqnr(outs[0], outs[1])
    for name, a, b in zip(("x", "w13", "w2"), grads[0], grads[1]):
        assert sqnr(a, b) >= 17, (name, sqnr(a, b))
    # the empty expert's weight gradient stays exactly zero
    assert torch.count_nonzero(grads[1][1][3]) == 0


def test_filter_fqns_and_flag_exclude_experts():
    for cfg in (Float8Config(moe_recipe_name="mxfp8", emulate=True, filter_fqns=["output", "router", "experts"]),
                Float8Config(recipe_name="mxfp8", emulate=True),  # the Linear recipe does not touch experts
                Float8Config(recipe_name="tensorwise", emulate=True)):
        net = convert_to_float8_training(Net(), cfg)
        assert type(net.moe.experts) is GroupedExperts and net.moe.token_group_align == 1, cfg
    net = convert_to_float8_training(Net(), Float8Config(moe_recipe_name="mxfp8", emulate=True),
                                     module_filter_fn=lambda mod, fqn: not fqn.endswith("experts"))
    assert type(net.moe.experts) is GroupedExperts


def test_expert_dims_not_multiple_of_the_block_is_a_one_line_error_naming_the_key():
    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = MoE(64, MoEArgs(num_experts=2, top_k=1, hidden_dim=96, load_balance="none"))

    with pytest.raises(ValueError, match=r"^moe_granularity: moe.experts .*multiples of 128: w13 \(2, 192, 64\)"):
        convert_to_float8_training(Small(), Float8Config(moe_recipe_name="mxfp8", emulate=True))
    # mx32 too: its weights' 128-row tiles and wgrad's 128-feature token-major tiles; mx32_plain needs 32 only
    with pytest.raises(ValueError, match=r"^moe_granularity: moe.experts .*multiples of 128: w13 \(2, 192, 64\)"):
        convert_to_float8_training(Small(), Float8Config(moe_recipe_name="mxfp8", moe_granularity="mx32",
                                                         emulate=True))
    net = convert_to_float8_training(Small(), Float8Config(moe_recipe_name="mxfp8", moe_granularity="mx32_plain",
                                                           emulate=True))
    assert net.moe.token_group_align == 32


def test_float8_all_gather_wraps_expert_weights_and_checkpoints_stay_plain():
    from titan_fp8.float8.expert_weights import Float8ExpertWeight
    torch.manual_seed(0)
    ref = Net()
    net = convert_to_float8_training(copy.deepcopy(ref), Float8Config(moe_recipe_name="mxfp8", emulate=True,
                                                                      enable_fsdp_float8_all_gather=True))
    ex = net.moe.experts
    assert isinstance(ex.w13, Float8ExpertWeight) and isinstance(ex.w2, Float8ExpertWeight)
    assert (ex.w13._attr, ex.w2._attr) == ("w13", "w2")
    sd = net.state_dict()
    assert type(sd["moe.experts.w13"]) is torch.Tensor and torch.equal(sd["moe.experts.w13"], ref.moe.experts.w13)
    # without FSDP the wrapped parameters train like plain ones (same float8 numerics as unwrapped)
    plain = convert_to_float8_training(copy.deepcopy(ref), Float8Config(moe_recipe_name="mxfp8", emulate=True))
    x = torch.randn(2, 64, DIM)
    outs = []
    for m in (net, plain):
        out = m.moe(x)
        out.float().pow(2).mean().backward()
        outs.append((out.detach(), m.moe.experts.w13.grad, m.moe.experts.w2.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    net.load_state_dict(plain.state_dict())
    assert net.moe.experts._float8_expert_amax == {}


def test_check_float8_all_gather_covers_expert_weights():
    from titan_fp8.float8 import check_float8_all_gather
    from titan_fp8.float8.convert import wrap_expert_weights_for_all_gather
    cfg = Float8Config(moe_recipe_name="mxfp8", emulate=True, enable_fsdp_float8_all_gather=True)
    net = convert_to_float8_training(Net(), cfg)
    for world in (1, 2, 3, 8):  # any number of ranks: straddling scale groups take the one all-reduce
        check_float8_all_gather(net, world)
    plain = Net()
    wrap_expert_weights_for_all_gather(plain.moe.experts, cfg)  # float8-gathered, but run by bf16 experts
    with pytest.raises(ValueError, match=r"^enable_fsdp_float8_all_gather: expert weights moe.experts.w13, "
                                         r"moe.experts.w2 "):
        check_float8_all_gather(plain, 2)
