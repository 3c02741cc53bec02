"""Float8 numerics on CPU (emulate=True): the amax->scale rule and its edge cases, SQNR of every recipe's
forward and both gradients against a float64 reference, outliers, torch.compile equality."""

import pytest
import torch
import torch.nn as nn
import torchao.float8.float8_training_tensor as ao

from titan_fp8.float8 import (Float8Config, convert_to_float8_training,
                              precompute_float8_dynamic_scale_for_fsdp)
from titan_fp8.float8.linear import cast_weight_tensorwise, float8_linear, linear_mm_config
from titan_fp8.float8.scaling import EPS, amax_to_scale, quantize_1x128, quantize_128x128, to_float8

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
RECIPES = ["tensorwise", "rowwise", "blockwise", "mxfp8"]


def sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return (20 * torch.log10(ref.norm() / (ref - got).norm())).item()


def run(recipe, x, w, g):
    cfg = Float8Config(recipe_name=recipe, emulate=True)
    xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = float8_linear(xq, wq, cfg)
    y.backward(g)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    yr = xr @ wr.t()
    yr.backward(g.double())
    return sqnr(yr, y), sqnr(xr.grad, xq.grad), sqnr(wr.grad, wq.grad)


# Thresholds (dB): e4m3 operands give ~28.5 dB per GEMM output; tensorwise gradients use e5m2 for
# grad_output (2 mantissa bits: ~24.6 dB measured)
THRESH = {"tensorwise": (27.0, 23.0, 23.0), "rowwise": (27.0, 27.0, 27.0),
          "blockwise": (27.0, 27.0, 27.0), "mxfp8": (27.0, 27.0, 27.0)}


@pytest.mark.parametrize("recipe", RECIPES)
def test_sqnr_forward_and_both_gradients(recipe):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = torch.randn(256, 512, generator=gen)
    w = torch.randn(384, 512, generator=gen) * 0.02
    g = torch.randn(256, 384, generator=gen) * 1e-3
    got = run(recipe, x, w, g)
    for name, s, t in zip(("output", "grad_input", "grad_weight"), got, THRESH[recipe]):
        assert s >= t, f"{recipe} {name}: SQNR {s:.2f} dB < {t} dB"
    # and not suspiciously perfect: the quantization really happens
    assert max(got) < 45


def test_fine_grained_recipes_beat_tensorwise_on_outlier_rows():
    torch.manual_seed(7)
    # token magnitudes spread over 6 decades: one tensorwise scale underflows the small rows
    x = torch.randn(256, 512) * torch.pow(10.0, torch.empty(256, 1).uniform_(-5, 1))
    w = torch.randn(384, 512) * 0.02
    yr = x.double() @ w.double().t()

    def row_sqnr(recipe):
        y = float8_linear(x, w, Float8Config(recipe_name=recipe, emulate=True)).double()
        return (20 * torch.log10(yr.norm(dim=1) / (yr - y).norm(dim=1))).mean().item()

    tw = row_sqnr("tensorwise")
    for r in ("blockwise", "mxfp8"):
        assert row_sqnr(r) >= tw + 3.0, (r, row_sqnr(r), tw)


# ----------------------------------------------------------------------------------------- (d) edge cases
def test_scale_rule_edge_cases():
    s = amax_to_scale(torch.tensor([0.0, 1e-30, 1.0, 448.0, 3e38, float("inf"), float("nan")]), E4M3)
    assert torch.isfinite(s[:5]).all()
    assert s[0] == s[1] == torch.tensor(448.0 / EPS, dtype=torch.float32)   # zero -> finite (clamped)
    assert s[2] == 448.0 and s[3] == 1.0
    assert torch.isnan(s[5]) and torch.isnan(s[6])                          # non-finite -> NaN, never 0
    p = amax_to_scale(torch.tensor([1.0, 3.0, 448.0 * 1.5]), E4M3, round_to_pow2=True)
    assert p.tolist() == [256.0, 128.0, 0.5]                                # floor to a power of two
    # to_float8 is bit-identical to torchao's cast (the one the GEMMs use)
    x = torch.randn(4096) * 30
    sc = amax_to_scale(x.abs().max(), E4M3)
    ref = ao.hp_tensor_and_scale_to_float8(x, sc, E4M3)._data
    assert torch.equal(to_float8(x, sc, E4M3).view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.parametrize("recipe", RECIPES)
def test_zero_weight_gives_exact_zeros_and_finite_grads(recipe):
    cfg = Float8Config(recipe_name=recipe, emulate=True)
    x = torch.randn(128, 256, requires_grad=True)
    w = torch.zeros(128, 256, requires_grad=True)
    y = float8_linear(x, w, cfg)
    assert torch.equal(y, torch.zeros_like(y))
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad, torch.zeros_like(x.grad)) and torch.isfinite(w.grad).all()
    # all-zero block data quantizes to exact zeros with a finite scale
    d, s = quantize_128x128(torch.zeros(128, 128))
    assert torch.isfinite(s).all() and not d.view(torch.uint8).any()


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("magnitude", [1e-8, 1e30])
def test_tiny_and_huge_weights_keep_precision(recipe, magnitude):
    torch.manual_seed(1)
    x = torch.randn(128, 256)
    w = torch.randn(128, 256) * magnitude
    y = float8_linear(x, w, Float8Config(recipe_name=recipe, emulate=True))
    assert torch.isfinite(y).all()
    assert sqnr(x.double() @ w.double().t(), y) >= 25.0


def test_weights_below_eps_flush_to_zero_documented():
    # amax < EPS (1e-12) is clamped: such weights cast to (finite) zeros, never NaN
    w = torch.full((32, 32), 1e-20)
    sc = amax_to_scale(w.abs().max(), E4M3)
    assert torch.isfinite(sc) and not to_float8(w, sc, E4M3).view(torch.uint8).any()


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_weight_poisons_output_never_silently(recipe, bad):
    x = torch.randn(128, 256)
    w = torch.randn(128, 256)
    w[3, 5] = bad
    y = float8_linear(x, w, Float8Config(recipe_name=recipe, emulate=True))
    if recipe == "tensorwise":
        assert torch.isnan(y).all()  # the tensor's scale is NaN: everything it touches is NaN
    else:
        assert torch.isnan(y[:, 3]).all()  # the scale group holding it is NaN
    assert not torch.isfinite(y).all()


def test_precompute_check_finite_names_the_weight():
    cfg = Float8Config(emulate=True, enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False)), cfg)
    precompute_float8_dynamic_scale_for_fsdp(m, check_finite=True)  # finite: fine
    with torch.no_grad():
        m[1].weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"\['1.weight'\]"):
        precompute_float8_dynamic_scale_for_fsdp(m, check_finite=True)


def test_blockwise_block_scales_are_local():
    # a huge value in one 1x128 block does not change its neighbours' data
    x = torch.randn(2, 256)
    d0, s0 = quantize_1x128(x)
    x[0, 0] = 1e6
    d1, s1 = quantize_1x128(x)
    assert torch.equal(d0[:, 128:].view(torch.uint8), d1[:, 128:].view(torch.uint8))
    assert torch.equal(d0[1].view(torch.uint8), d1[1].view(torch.uint8))


# ----------------------------------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("recipe, ag", [("tensorwise", False), ("tensorwise", True), ("rowwise", False),
                                        ("blockwise", False), ("mxfp8", True)])
def test_compile_fullgraph_matches_eager(recipe, ag):
    torch.manual_seed(0)
    cfg = Float8Config(recipe_name=recipe, emulate=True, enable_fsdp_float8_all_gather=ag)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(128, 256, bias=False)), cfg)
    x = torch.randn(128, 128)
    y_e = m(x)
    y_e.sum().backward()
    g_e = m[0].weight.grad.clone()
    m[0].weight.grad = None
    y_c = torch.compile(m, backend="aot_eager", fullgraph=True)(x)
    y_c.sum().backward()
    assert torch.equal(y_e, y_c) and torch.equal(g_e, m[0].weight.grad)


def test_compile_with_post_all_gather_float8_weight_input():
    # what the compiled block sees after FSDP2's float8 all-gather: a Float8TrainingTensor weight
    torch.manual_seed(3)
    cfg = Float8Config(emulate=True)
    w8 = cast_weight_tensorwise(torch.randn(256, 128), linear_mm_config(True))
    x = torch.randn(64, 128)
    f = lambda x, w: float8_linear(x, w, cfg)
    assert torch.equal(f(x, w8), torch.compile(f, backend="aot_eager", fullgraph=True)(x, w8))
    # and the float8 weight is used as is: same result as casting the high-precision weight in forward
    w_hp = w8._data.float() / w8._scale
    assert torch.equal(f(x, w8), f(x, w_hp))
