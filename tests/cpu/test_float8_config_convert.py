"""Float8Config validation and convert_to_float8_training's choice of layers."""
import pytest
import torch
import torch.nn as nn

from titan_fp8.float8 import Float8Config, Float8Linear, Float8TrainingWeight, convert_to_float8_training
from titan_fp8.float8.roofline import analytic_speedup, predicted_speedup


@pytest.mark.parametrize("kwargs, field", [
    (dict(recipe_name="fp4"), "recipe_name"),
    (dict(recipe_name="rowwise", enable_fsdp_float8_all_gather=True), "enable_fsdp_float8_all_gather"),
    (dict(recipe_name="blockwise", enable_fsdp_float8_all_gather=True), "enable_fsdp_float8_all_gather"),
    (dict(precompute_float8_dynamic_scale_for_fsdp=True), "precompute_float8_dynamic_scale_for_fsdp"),
    (dict(recipe_name="mxfp8", enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True),
     "precompute_float8_dynamic_scale_for_fsdp"),
    (dict(filter_fqns="output"), "filter_fqns"),
    (dict(filter_fqns=["output", 3]), "filter_fqns"),
    (dict(emulate="yes"), "emulate"),
    (dict(enable_fsdp_float8_all_gather=1), "enable_fsdp_float8_all_gather"),
    (dict(moe_recipe_name="fp8"), "moe_recipe_name"),
    (dict(moe_recipe_name="mxfp8", moe_granularity="mx64"), "moe_granularity"),
    (dict(moe_recipe_name="fp8_rowwise", moe_granularity="mx128"), "moe_granularity"),
    (dict(moe_granularity="mx32"), "moe_granularity"),
    (dict(moe_recipe_name="mxfp8", moe_granularity="mx32_plain", enable_fsdp_float8_all_gather=True),
     "moe_granularity"),
    (dict(moe_recipe_name="mxfp8", moe_keep_input_copy="no"), "moe_keep_input_copy"),
])
def test_config_errors_start_with_the_field(kwargs, field):
    with pytest.raises(ValueError) as e:
        Float8Config(**kwargs)
    assert str(e.value).startswith(field + ":"), str(e.value)


def test_moe_keys_defaults_and_alignment():
    assert Float8Config().moe_recipe_name == "none" and Float8Config().moe_granularity is None
    assert Float8Config().moe_token_group_align == 1
    c = Float8Config(recipe_name="tensorwise", moe_recipe_name="mxfp8")
    assert c.moe_granularity == "mx128" and c.moe_token_group_align == 128
    assert Float8Config(moe_recipe_name="mxfp8", moe_granularity="mx32").moe_token_group_align == 32
    assert Float8Config(moe_recipe_name="fp8_rowwise").moe_token_group_align == 16
    # precompute covers expert weights too (their scale groups may straddle shards), with any Linear recipe
    Float8Config(recipe_name="mxfp8", moe_recipe_name="mxfp8", enable_fsdp_float8_all_gather=True,
                 precompute_float8_dynamic_scale_for_fsdp=True)


def test_config_frozen_and_list_filter_becomes_tuple():
    c = Float8Config(filter_fqns=["output", "router"], recipe_name="mxfp8", enable_fsdp_float8_all_gather=True)
    assert c.filter_fqns == ("output", "router")
    with pytest.raises(Exception):
        c.recipe_name = "tensorwise"
    assert Float8Config() == Float8Config()


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(64, 16, bias=False)


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = Router()
        self.shared_w1 = nn.Linear(64, 128, bias=False)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(64, 64, bias=False)
        self.wk = nn.Linear(64, 48, bias=False)   # 48: multiple of 16, not of 32
        self.norm = nn.RMSNorm(64)
        self.moe = MoE()
        self.odd = nn.Linear(64, 40, bias=False)  # not a multiple of 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(100, 64)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.output = nn.Linear(64, 128, bias=False)
        self.output_proj = nn.Linear(64, 64, bias=False)


def converted(model):
    return sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))


def test_default_exclusions_and_dim_rules():
    m = convert_to_float8_training(Model(), Float8Config(emulate=True))
    assert converted(m) == sorted([
        "layers.0.wq", "layers.0.wk", "layers.0.moe.shared_w1",
        "layers.1.wq", "layers.1.wk", "layers.1.moe.shared_w1", "output_proj"])
    assert isinstance(m.tok_embeddings, nn.Embedding) and type(m.output) is nn.Linear
    assert type(m.layers[0].moe.router.gate) is nn.Linear and isinstance(m.layers[0].norm, nn.RMSNorm)
    # mxfp8 needs multiples of 32: wk [64 -> 48] stays high precision
    tile32 = Float8Config(recipe_name="mxfp8", linear_granularity="mx32_tile32", emulate=True)
    m = convert_to_float8_training(Model(), tile32)
    assert "layers.0.wk" not in converted(m) and "layers.0.wq" in converted(m)
    assert converted(convert_to_float8_training(Model(), Float8Config(recipe_name="mxfp8", emulate=True))) == \
        converted(m)  # the default is "mx32_tile32"
    # "mx32" (128x128 weight tiles) refuses the 64-wide ones "mx32_tile32" takes, by name
    with pytest.raises(ValueError, match=r"^linear_granularity: output_proj \[in_features=64, out_features=64\]"):
        convert_to_float8_training(Model(), Float8Config(recipe_name="mxfp8", linear_granularity="mx32",
                                                         emulate=True))


def test_filters_configurable_and_module_filter_fn():
    m = convert_to_float8_training(Model(), Float8Config(filter_fqns=(), emulate=True))
    assert "output" in converted(m) and "layers.0.moe.router.gate" in converted(m)
    m = convert_to_float8_training(Model(), Float8Config(filter_fqns=["wq", "output"], emulate=True),
                                   module_filter_fn=lambda mod, fqn: not fqn.startswith("layers.1"))
    assert converted(m) == sorted(["layers.0.wk", "layers.0.moe.shared_w1", "layers.0.moe.router.gate", "output_proj"])


def test_conversion_keeps_parameters_and_wraps_for_all_gather():
    m = Model()
    w = m.layers[0].wq.weight
    convert_to_float8_training(m, Float8Config(emulate=True))
    assert m.layers[0].wq.weight is w
    m = convert_to_float8_training(Model(), Float8Config(emulate=True, enable_fsdp_float8_all_gather=True))
    assert isinstance(m.layers[0].wq.weight, Float8TrainingWeight)
    sd = m.state_dict()
    assert type(sd["layers.0.wq.weight"]) is torch.Tensor  # checkpoints hold plain high precision
    # works on meta (model built before materialization) and survives to_empty
    with torch.device("meta"):
        mm = Model()
    convert_to_float8_training(mm, Float8Config(emulate=True, enable_fsdp_float8_all_gather=True))
    mm.to_empty(device="cpu")
    assert isinstance(mm.layers[0].wq.weight, Float8TrainingWeight) and mm.layers[0].wq.weight.device.type == "cpu"


def test_auto_filter_small_kn_uses_roofline():
    c = Float8Config(filter_fqns=("output", "router", "auto_filter_small_kn"), emulate=True)
    big = nn.Sequential(nn.Linear(8192, 16384, bias=False, device="meta"), nn.Linear(64, 64, bias=False, device="meta"))
    convert_to_float8_training(big, c)
    assert isinstance(big[0], Float8Linear) and type(big[1]) is nn.Linear
    assert predicted_speedup("tensorwise", 8192, 16384) > 1 > predicted_speedup("tensorwise", 64, 64)
    # the formula behaves like a roofline: speedup grows with the GEMM
    assert analytic_speedup("tensorwise", 1024, 1024) < analytic_speedup("tensorwise", 8192, 8192)


def test_gpu_matmul_without_emulate_on_cpu_is_a_clear_error():
    m = convert_to_float8_training(nn.Sequential(nn.Linear(32, 32, bias=False)), Float8Config())
    with pytest.raises(RuntimeError, match="emulate"):
        m(torch.randn(16, 32))


def test_check_float8_all_gather_flags_mxfp8_shards_straddling_tiles():
    from titan_fp8.float8 import check_float8_all_gather
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity="mx32_tile32", emulate=True,
                       enable_fsdp_float8_all_gather=True)
    ok = convert_to_float8_training(nn.Sequential(nn.Linear(64, 128, bias=False)), cfg)
    check_float8_all_gather(ok, 2)  # 128/2 = 64 rows: whole tiles
    m = convert_to_float8_training(nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 96, bias=False)), cfg)
    with pytest.raises(ValueError, match=r"enable_fsdp_float8_all_gather: .*1 \[out_features=96\]"):
        check_float8_all_gather(m, 2)  # 96/2 = 48 rows: tiles straddle the shards


def test_measured_roofline_rows_win_over_the_formula():
    """A (recipe, K, N) that benchmarks/float8_linear.py measured is decided by that measurement."""
    import json
    from titan_fp8.float8 import roofline
    table = json.load(open(roofline.__file__.replace("roofline.py", "roofline.json")))
    rows = table["measured"]
    assert rows, "roofline.json holds no measured rows"
    for r in rows:
        assert predicted_speedup(r["recipe"], r["K"], r["N"]) == pytest.approx(r["speedup"])
