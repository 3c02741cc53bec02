"""convert_to_float8_training: swap eligible nn.Linear for Float8Linear, in place.

A Linear is converted when
  - it is exactly nn.Linear (not a subclass, not already converted);
  - in_features and out_features are multiples of the recipe's dim_multiple (16; mxfp8 32; blockwise 128);
  - no entry of config.filter_fqns is a whole dotted component run of its fqn (default ("output", "router"):
    the output head and the MoE router gate `layers.<i>.moe.router.gate` stay high precision; embedding,
    norms and the attention core are not nn.Linear and are never touched);
  - with "auto_filter_small_kn" in filter_fqns: the roofline (roofline.py) predicts a speedup;
  - module_filter_fn(module, fqn), if given, returns True.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch.nn as nn

from .config import AUTO_FILTER, Float8Config
from .linear import Float8Linear


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
            setattr(parent, name, Float8Linear.from_linear(child, config))
    if config.recipe_name == "mxfp8" and config.convert_experts:
        _convert_experts(model, config, module_filter_fn)
    _stamp_scale_group(model)
    return model


def _convert_experts(model: nn.Module, config: Float8Config, module_filter_fn) -> None:
    """Routed experts: GroupedExperts.mm -> the MXFP8 grouped GEMM; the owning MoE pads each expert's token
    group to the op's scale block (so wgrad's token blocks never straddle two experts)."""
    from titan_fp8.models.moe import MoE

    from .experts import GRANULARITIES, make_mxfp8_grouped_mm

    gran = GRANULARITIES[config.experts_granularity]
    for fqn, moe in model.named_modules():
        if not isinstance(moe, MoE):
            continue
        efqn = f"{fqn}.experts" if fqn else "experts"
        if any(fqn_matches(efqn, p) for p in config.filter_fqns if p != AUTO_FILTER):
            continue
        if module_filter_fn is not None and not module_filter_fn(moe.experts, efqn):
            continue
        ex = moe.experts
        bad = [f"{n} {tuple(getattr(ex, n).shape)}" for n in ("w1", "w2", "w3") if any(d % 32 for d in getattr(ex, n).shape[1:])]
        if bad:
            raise ValueError(f"convert_to_float8_training: {efqn} cannot run MXFP8 (its out/in dims must be multiples "
                             f"of 32): {', '.join(bad)}; exclude it with filter_fqns=[..., 'experts']")
        moe.token_group_align = max(moe.token_group_align, gran.block)
        # the op learns the padding so its "auto" backend may run wgrad on CUTLASS (needs 128-token groups)
        ex.mm = make_mxfp8_grouped_mm(config.experts_granularity, backend="emulated" if config.emulate else "auto",
                                      token_align=moe.token_group_align)
        ex.float8_granularity = config.experts_granularity


def _stamp_scale_group(model: nn.Module) -> None:
    """Every tensorwise float8-all-gather Linear of `model` (also ones made earlier with from_linear) shares one
    ScaleGroup: without precompute, the first all-gather of a step computes all their scales with ONE
    all-reduce (weights.py)."""
    from .weights import ScaleGroup
    members = [(fqn, m) for fqn, m in model.named_modules()
               if isinstance(m, Float8Linear) and m.float8_config.enable_fsdp_float8_all_gather
               and m.float8_config.recipe_name == "tensorwise"]
    if members:
        group = ScaleGroup(members)
        for _, m in members:
            m._float8_scale_group = group


def check_float8_all_gather(model: nn.Module, world_size: int) -> None:
    """Start-up check (call in parallelize, before the first step): every float8-all-gather weight can be gathered
    as configured over `world_size` FSDP shards; raises ValueError naming the layer otherwise."""
    bad = []
    for fqn, mod in model.named_modules():
        if not isinstance(mod, Float8Linear) or not mod.float8_config.enable_fsdp_float8_all_gather:
            continue
        rows = mod.out_features
        if mod.float8_config.recipe_name == "mxfp8" and (rows % world_size or (rows // world_size) % 32):
            bad.append(f"{fqn} [out_features={rows}]")
    if bad:
        raise ValueError(f"enable_fsdp_float8_all_gather: with recipe 'mxfp8' every FSDP shard must hold a multiple "
                         f"of 32 rows (32x32 tiles must not straddle shards); over {world_size} ranks these do not: "
                         f"{', '.join(bad)}")
