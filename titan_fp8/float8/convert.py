"""convert_to_float8_training: swap eligible nn.Linear for Float8Linear, in place.

A Linear is converted when
  - it is exactly nn.Linear (not a subclass, not already converted);
  - in_features and out_features are multiples of the recipe's dim_multiple (16; mxfp8 32; blockwise 128);
    with recipe "mxfp8" and linear_granularity "mx32" or "mx128", a Linear the filters select whose dims are
    not multiples of 128 (the weight tiles) is a start-up error naming it (exclude it with filter_fqns, or use
    the default "mx32_tile32"; dims that are not even multiples of 32 are skipped, as for "mx32_tile32");
  - no entry of config.filter_fqns is a whole dotted component run of its fqn (default ("output", "router"):
    the output head and the MoE router gate `layers.<i>.moe.router.gate` stay high precision; embedding,
    norms and the attention core are not nn.Linear and are never touched);
  - with "auto_filter_small_kn" in filter_fqns: the roofline (roofline.py) predicts a speedup;
  - module_filter_fn(module, fqn), if given, returns True.
With config.moe_recipe_name != "none", every MoE's routed experts are converted too (convert_experts; the same
filter_fqns / module_filter_fn apply to the fqn "<moe>.experts").
"""
from __future__ import annotations

from typing import Callable, Optional

import torch.nn as nn

from .config import AUTO_FILTER, Float8Config
from .linear import Float8Linear
from .weights import Float8TrainingWeight, ScaleGroup, unwrap_weight


def fqn_matches(fqn: str, pattern: str) -> bool:
    return f".{pattern}." in f".{fqn}."


def is_eligible(mod: nn.Module, fqn: str, config: Float8Config) -> bool:
    if type(mod) is not nn.Linear:
        return False
    m = config.recipe.dim_multiple
    if mod.in_features % m or mod.out_features % m:
        return False
    if any(fqn_matches(fqn, p) for p in config.filter_fqns if p != AUTO_FILTER):
        return False
    if config.auto_filter:
        from .roofline import predicted_speedup
        if predicted_speedup(config.recipe_name, K=mod.in_features, N=mod.out_features) <= 1.0:
            return False
    return True


def convert_to_float8_training(model: nn.Module, config: Optional[Float8Config] = None,
                               module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None) -> nn.Module:
    """Swap eligible nn.Linear modules of `model` for Float8Linear (in place) and return `model`.
    Call before `parallelize` (fully_shard / compile)."""
    config = config or Float8Config()
    if not isinstance(config, Float8Config):
        raise TypeError(f"convert_to_float8_training: config must be a Float8Config, got {type(config).__name__}")
    if type(model) is nn.Linear:
        raise ValueError("convert_to_float8_training: pass the model that holds the Linear, not the Linear itself")
    for parent_fqn, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            fqn = f"{parent_fqn}.{name}" if parent_fqn else name
            if not is_eligible(child, fqn, config):
                continue
            if module_filter_fn is not None and not module_filter_fn(child, fqn):
                continue
            _check_linear_dims(child, fqn, config)
            setattr(parent, name, Float8Linear.from_linear(child, config))
    if config.moe_recipe_name != "none":
        convert_experts(model, config, module_filter_fn)
    _stamp_scale_group(model)
    return model


def _check_linear_dims(mod: nn.Linear, fqn: str, config: Float8Config) -> None:
    m = config.linear_dim_multiple
    if mod.in_features % m or mod.out_features % m:
        raise ValueError(f"linear_granularity: {fqn} [in_features={mod.in_features}, out_features="
                         f"{mod.out_features}] cannot run recipe_name='mxfp8' with linear_granularity="
                         f"{config.linear_granularity!r}: its dims must be multiples of {m}; exclude it with "
                         f"filter_fqns=[..., {fqn.rsplit('.', 1)[-1]!r}] or use linear_granularity='mx32_tile32' "
                         f"(32x32 weight tiles, dims multiples of 32; its GEMMs dequantize to bf16)")


def convert_experts(model: nn.Module, config: Float8Config, module_filter_fn=None) -> None:
    """Routed experts of every MoE (not excluded by filter_fqns / module_filter_fn) run config.moe_recipe_name:
    moe.experts becomes titan_fp8.float8.experts.Float8GroupedExperts (the fused float8 expert path), its w13 /
    w2 become Float8ExpertWeight with float8 all-gather, and the MoE pads each expert's token group to
    config.moe_token_group_align (fp8_rowwise 16; mxfp8 the scale block, so wgrad's token blocks never
    straddle two experts)."""
    from titan_fp8.models.moe import MoE

    from .experts import Float8GroupedExperts

    block = config.moe_dim_multiple
    what = (f"moe_recipe_name={config.moe_recipe_name!r}" + (f", moe_granularity={config.moe_granularity!r}"
                                                             if config.moe_granularity else ""))
    for fqn, moe in model.named_modules():
        if not isinstance(moe, MoE):
            continue
        efqn = f"{fqn}.experts" if fqn else "experts"
        if any(fqn_matches(efqn, p) for p in config.filter_fqns if p != AUTO_FILTER):
            continue
        if module_filter_fn is not None and not module_filter_fn(moe.experts, efqn):
            continue
        ex = moe.experts
        bad = [f"{n} {tuple(getattr(ex, n).shape)}" for n in ("w13", "w2") if any(d % block for d in getattr(ex, n).shape[1:])]
        if bad:
            key = "moe_granularity" if config.moe_recipe_name == "mxfp8" else "moe_recipe_name"
            raise ValueError(f"{key}: {efqn} cannot run {what}: its weights' out/in dims must be multiples of "
                             f"{block}: {', '.join(bad)}; exclude it with filter_fqns=[..., 'experts']")
        ex = Float8GroupedExperts.from_grouped_experts(ex, config)
        if config.enable_fsdp_float8_all_gather:
            wrap_expert_weights_for_all_gather(ex, config)
        moe.experts = ex
        moe.token_group_align = max(moe.token_group_align, config.moe_token_group_align)


def wrap_expert_weights_for_all_gather(ex: nn.Module, config: Float8Config) -> None:
    """w13 / w2 of `ex` become Float8ExpertWeight (same storage): FSDP2 all-gathers them in float8.
    Checkpoints keep holding the plain high-precision tensors."""
    from .expert_weights import Float8ExpertWeight

    for name in ("w13", "w2"):
        p = getattr(ex, name)
        if isinstance(p, Float8TrainingWeight):
            continue
        setattr(ex, name, nn.Parameter(Float8ExpertWeight(p.data, config, name), requires_grad=p.requires_grad))
    ex._register_state_dict_hook(_plain_expert_weights_in_state_dict)
    ex.register_load_state_dict_post_hook(_drop_expert_scale_cache)


def _plain_expert_weights_in_state_dict(module, state_dict, prefix, local_metadata):
    for name in ("w13", "w2"):
        if prefix + name in state_dict:
            state_dict[prefix + name] = unwrap_weight(state_dict[prefix + name])
    return state_dict


def _drop_expert_scale_cache(module, incompatible_keys):
    module._float8_expert_amax = {}  # the loaded weights need new scales


def _stamp_scale_group(model: nn.Module) -> None:
    """Every module of `model` holding float8-all-gather weights (tensorwise Linears, float8 experts; also
    ones made earlier with from_linear) shares one ScaleGroup: the weights among them whose scales need the
    AMAX all-reduce get them from ONE all-reduce per step, also without precompute (weights.py)."""
    members = [(fqn, m) for fqn, m in model.named_modules()
               if any(isinstance(getattr(p, "_local_tensor", p), Float8TrainingWeight)
                      for p in m.parameters(recurse=False))]
    if members:
        group = ScaleGroup(members)
        for _, m in members:
            m._float8_scale_group = group


def check_float8_all_gather(model: nn.Module, world_size: int) -> None:
    """Start-up check (call in parallelize, before the first step): every float8-all-gather weight (Linear and
    expert) can be gathered as configured over `world_size` FSDP shards; raises ValueError naming the layer
    otherwise."""
    bad = []
    for fqn, mod in model.named_modules():
        if not isinstance(mod, Float8Linear) or not mod.float8_config.enable_fsdp_float8_all_gather:
            continue
        rows, c = mod.out_features, mod.float8_config
        tile = c.linear_dim_multiple
        if c.recipe_name == "mxfp8" and (rows % world_size or (rows // world_size) % tile):
            bad.append(f"{fqn} [out_features={rows}] ({c.linear_granularity})")
    if bad:
        raise ValueError(f"enable_fsdp_float8_all_gather: with recipe 'mxfp8' every FSDP shard must hold a multiple "
                         f"of the weight tile's rows (128 for mx32 and mx128, 32 for mx32_tile32: tiles must not "
                         f"straddle shards); "
                         f"over {world_size} ranks these do not: {', '.join(bad)}")
    # Expert weights gather over any number of ranks and shard placements (scale groups that straddle shards
    # take the one AMAX all-reduce), so only their pairing with a float8 expert module can be wrong.
    from .expert_weights import Float8ExpertWeight
    from .experts import Float8GroupedExperts
    bad = [f"{fqn}.{n}" for fqn, mod in model.named_modules() for n, p in mod.named_parameters(recurse=False)
           if isinstance(getattr(p, "_local_tensor", p), Float8ExpertWeight)
           and (not isinstance(mod, Float8GroupedExperts) or mod.moe_recipe != p._config.moe_recipe_name
                or p._config.moe_granularity == "mx32_plain")]
    if bad:
        raise ValueError(f"enable_fsdp_float8_all_gather: expert weights {', '.join(bad)} would be gathered in float8 "
                         f"but are not run by a Float8GroupedExperts of the same moe_recipe_name (or use "
                         f"'mx32_plain'); convert them with convert_to_float8_training")
