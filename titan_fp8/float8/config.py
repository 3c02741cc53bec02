"""Float8Config: what the `[float8]` TOML section holds, validated once at start-up.

The recipe table says, per recipe, which float8 dtypes each operand uses, how its scales are shaped and
whether the weight can be all-gathered in float8 by FSDP2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2

AUTO_FILTER = "auto_filter_small_kn"
# titan_fp8.float8.experts.GRANULARITIES' names (kept here so the config imports no kernels; a test checks
# the two agree)
EXPERT_GRANULARITIES = ("mx128", "mx32", "mx32_plain")


class Recipe(NamedTuple):
    name: str
    input_dtype: torch.dtype
    weight_dtype: torch.dtype
    grad_dtype: torch.dtype
    # dims of a converted Linear must be multiples of this (both in_features and out_features)
    dim_multiple: int
    # can FSDP2 all-gather this recipe's weight already quantized?
    float8_all_gather: bool
    why_not_all_gather: str = ""


# Gradient dtypes, and why:
# - tensorwise: E5M2. One scale covers the whole gradient tensor; gradients span many binades (E5M2: 32 of
#   them vs E4M3's 18), so range beats the extra mantissa bit. Same choice as torchao's tensorwise default.
# - rowwise / blockwise / mxfp8: E4M3. Fine-grained scales (per row, per 1x128, per 32) keep each scale
#   group's range small, so the extra mantissa bit wins (torchao rowwise, DeepSeek V3, the OCP MX recipe).
RECIPES = {
    "tensorwise": Recipe("tensorwise", E4M3, E4M3, E5M2, 16, True),
    "rowwise": Recipe(
        "rowwise", E4M3, E4M3, E4M3, 16, False,
        "rowwise scales the weight per output row for the forward GEMM but per input column for the "
        "backward (grad-input) GEMM; the second scaling needs the whole unsharded weight, so a float8 shard "
        "cannot serve both. Use recipe_name='tensorwise' or 'mxfp8' for float8 all-gather."),
    "blockwise": Recipe(
        "blockwise", E4M3, E4M3, E4M3, 128, False,
        "blockwise float8 all-gather is not implemented yet (128x128 weight blocks would be shard-local "
        "only when every shard holds a multiple of 128 rows). Use 'tensorwise' or 'mxfp8'."),
    "mxfp8": Recipe("mxfp8", E4M3, E4M3, E4M3, 32, True),
}


def _fqn_list(value) -> tuple:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"filter_fqns: expected a list of strings, got {value!r}")
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise ValueError(f"filter_fqns: every entry must be a non-empty string, got {bad!r}")
    return tuple(value)


@dataclass(frozen=True)
class Float8Config:
    """Low-precision training of nn.Linear layers.

    recipe_name: "tensorwise" | "rowwise" | "blockwise" | "mxfp8".
    enable_fsdp_float8_all_gather: FSDP2 all-gathers weights already in float8 (tensorwise, mxfp8).
    precompute_float8_dynamic_scale_for_fsdp: tensorwise + float8 all-gather only; the trainer calls
        `precompute_float8_dynamic_scale_for_fsdp(model)` once after `parallelize` and after every
        optimizer step: ONE all-reduce for every float8 weight's scale (without it, the first all-gather of
        each step makes the same single all-reduce; precompute takes it off the all-gather path).
    filter_fqns: Linear layers whose fqn contains one of these as whole dotted components stay high
        precision ("output" matches "output", not "output_proj"; "router" matches
        "layers.0.moe.router.gate"). "auto_filter_small_kn" also skips layers too small to speed up
        (roofline in roofline.json).
    emulate: run the float8 numerics without fp8 hardware (CPU, tests): quantize exactly as on the GPU,
        then an fp32 matmul of the dequantized operands.
    convert_experts: recipe "mxfp8" only: routed experts (every GroupedExperts not excluded by filter_fqns)
        run titan_fp8.float8.experts.mxfp8_grouped_mm, and their MoE pads token groups to its scale block.
    experts_granularity: that op's scale granularity ("mx128" default: the one faster than bf16 on H200;
        "mx32", "mx32_plain"; see titan_fp8/float8/experts.py).
    """

    recipe_name: str = "tensorwise"
    enable_fsdp_float8_all_gather: bool = False
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    filter_fqns: tuple = ("output", "router")
    emulate: bool = False
    convert_experts: bool = True
    experts_granularity: str = "mx128"
    recipe: Recipe = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.recipe_name not in RECIPES:
            raise ValueError(f"recipe_name: {self.recipe_name!r} is not a float8 recipe; allowed: "
                             f"{', '.join(map(repr, RECIPES))}")
        if self.experts_granularity not in EXPERT_GRANULARITIES:
            raise ValueError(f"experts_granularity: {self.experts_granularity!r} is not an MXFP8 expert granularity; "
                             f"allowed: {', '.join(map(repr, EXPERT_GRANULARITIES))}")
        for name in ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "emulate",
                     "convert_experts"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true/false, got {getattr(self, name)!r}")
        object.__setattr__(self, "filter_fqns", _fqn_list(self.filter_fqns))
        recipe = RECIPES[self.recipe_name]
        object.__setattr__(self, "recipe", recipe)
        if self.enable_fsdp_float8_all_gather and not recipe.float8_all_gather:
            raise ValueError(f"enable_fsdp_float8_all_gather: not supported with recipe_name="
                             f"{self.recipe_name!r}: {recipe.why_not_all_gather}")
        if self.precompute_float8_dynamic_scale_for_fsdp:
            if not self.enable_fsdp_float8_all_gather:
                raise ValueError("precompute_float8_dynamic_scale_for_fsdp: needs "
                                 "enable_fsdp_float8_all_gather = true (it precomputes the all-gather's scales)")
            if self.recipe_name != "tensorwise":
                raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: only for recipe_name='tensorwise'; "
                                 f"{self.recipe_name!r} scales are local to each shard, so its float8 all-gather "
                                 f"already runs without any AMAX all-reduce")

    @property
    def auto_filter(self) -> bool:
        return AUTO_FILTER in self.filter_fqns
