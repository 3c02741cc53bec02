"""Float8Config: what the `[float8]` TOML section holds, validated once at start-up.

The recipe table says, per recipe, which float8 dtypes each operand uses, how its scales are shaped and
whether the weight can be all-gathered in float8 by FSDP2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2

AUTO_FILTER = "auto_filter_small_kn"

# Routed experts' recipes (`moe_recipe_name`), independent of the Linear `recipe_name`:
#   "none"         bf16 experts (the MoE's own grouped GEMM)
#   "fp8_rowwise"  e4m3, torch._scaled_grouped_mm; weights one scale per expert (expert_weights.py)
#   "mxfp8"        e4m3 + E8M0 blocks, kernels/grouped_gemm; granularity `moe_granularity`
MOE_RECIPES = ("none", "fp8_rowwise", "mxfp8")
# mxfp8 granularity -> the activations' scale block along the reduction axis (tokens in wgrad). Names kept
# equal to titan_fp8.float8.experts.GRANULARITIES (a test checks; the config imports no kernels).
MOE_GRANULARITIES = {"mx128": 128, "mx32": 32, "mx32_plain": 32}
DEFAULT_MOE_GRANULARITY = "mx128"
# mxfp8 Linear granularity (`linear_granularity`) -> dims of a converted Linear must be multiples of this:
#   "mx32_tile32"  (default) OCP MX: E8M0 scale per 1x32 block of x / grad_out (along tokens for grad-weight), per
#            32x32 tile of w. No kernel reads those tiles: the operands are dequantized to bf16 for cuBLAS.
#   "mx32"   1x32 blocks as "mx32_tile32" but w in 128x128 tiles (and grad-weight's x^T one scale per 32 tokens x
#            128 features): the routed experts' "mx32" numbers, whose GEMMs run on kernels.grouped_gemm's true-1x32
#            kernels (Gluon on sm_90), which need the 128-row weight tiles. Not the default: on an H100 it took the
#            same GPU time as "mx32_tile32" (0.81 vs 0.80x bf16 at 8192x4096->4096) and more host time per call
#            (benchmarks/results/mx32_linear_s28/NOTE.md).
#   "mx128"  MXFP8 numbers (e4m3, power-of-two scales) shared over 1x128 blocks of x / grad_out and 128x128
#            tiles of w: the GEMMs run on cuBLAS's fp8 blockwise kernels (linear.py).
LINEAR_GRANULARITIES = {"mx32_tile32": 32, "mx32": 128, "mx128": 128}
DEFAULT_LINEAR_GRANULARITY = "mx32_tile32"
# fp8_rowwise: torch._scaled_grouped_mm wants every group's rows 16-aligned
FP8_ROWWISE_TOKEN_ALIGN = 16


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
    moe_recipe_name: routed experts (every MoE's `experts` not excluded by filter_fqns / module_filter_fn):
        "none" (default: bf16), "fp8_rowwise" or "mxfp8"; independent of recipe_name. The MoE pads each
        expert's token group to the recipe's block (moe_token_group_align).
    moe_granularity: mxfp8 experts only: "mx128" (default when moe_recipe_name = "mxfp8"), "mx32" or
        "mx32_plain" (titan_fp8/float8/experts.py says what each shares a scale over). Left unset (None) for
        the other MoE recipes; setting it there is an error (it would mean nothing).
    linear_granularity: recipe_name = "mxfp8" only: "mx32_tile32" (default; OCP MX 1x32 blocks on activations
        and gradients, 32x32 weight tiles; dequantized to bf16 for the GEMMs), "mx32" (1x32 blocks, 128x128
        weight tiles; GEMMs on kernels.grouped_gemm's 1x32 kernels) or "mx128" (scales shared over 1x128
        blocks / 128x128 weight tiles; GEMMs on cuBLAS fp8 blockwise, the fast one on Hopper). Linear dims must
        be multiples of 32 ("mx32_tile32") or 128 ("mx32", "mx128"). Unset (None) for the other recipes.
    moe_keep_input_copy: float8 experts only. False (default): an MoE's experts save the layer input (which its
        router keeps for its own weight gradient anyway) and remake its float8 token-major copy, the operand of
        w13's weight gradient, in backward right before that GEMM. True: they keep that copy from forward to
        backward (1 byte per routed token slot and model dim per layer, e.g. 68 MB at llama_moe shapes), which
        skips one more read of the input in backward (measured on one H100, the remake's cost in layer time:
        +0.5% at llama_moe; -0.4% to +4.5% over three runs at dsv3_layer, about the run-to-run noise there;
        for 67 / 227 MB less at the layer's peak: benchmarks/results/issue9_s20/).
    enable_fsdp_float8_all_gather covers the expert weights too (expert_weights.py; not with "mx32_plain",
    whose two differently scaled weight copies cannot come from one gathered copy).
    """

    recipe_name: str = "tensorwise"
    enable_fsdp_float8_all_gather: bool = False
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    filter_fqns: tuple = ("output", "router")
    emulate: bool = False
    moe_recipe_name: str = "none"
    moe_granularity: Optional[str] = None
    linear_granularity: Optional[str] = None
    dispatch_dtype: str = "bf16"  # expert parallelism's dispatch all-to-all (validated in titan_fp8.config)
    moe_keep_input_copy: bool = False
    recipe: Recipe = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.recipe_name not in RECIPES:
            raise ValueError(f"recipe_name: {self.recipe_name!r} is not a float8 recipe; allowed: "
                             f"{', '.join(map(repr, RECIPES))}")
        if self.moe_recipe_name not in MOE_RECIPES:
            raise ValueError(f"moe_recipe_name: {self.moe_recipe_name!r} is not an MoE expert recipe; allowed: "
                             f"{', '.join(map(repr, MOE_RECIPES))}")
        self._check_granularity("moe_granularity", "moe_recipe_name", "expert", MOE_GRANULARITIES,
                                DEFAULT_MOE_GRANULARITY)
        self._check_granularity("linear_granularity", "recipe_name", "Linear", LINEAR_GRANULARITIES,
                                DEFAULT_LINEAR_GRANULARITY)
        if self.enable_fsdp_float8_all_gather and self.moe_granularity == "mx32_plain":
            raise ValueError("moe_granularity: 'mx32_plain' cannot be all-gathered in float8 "
                             "(enable_fsdp_float8_all_gather): it scales the expert weights 1x32 along K for "
                             "fprop and along N for dgrad, two copies that one gathered copy cannot give; use "
                             "'mx128' or 'mx32' (square 128x128 weight tiles serve both)")
        for name in ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "emulate",
                     "moe_keep_input_copy"):
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
            if self.recipe_name != "tensorwise" and self.moe_recipe_name == "none":
                raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: only for recipe_name='tensorwise' or "
                                 f"float8 experts (moe_recipe_name); {self.recipe_name!r} scales are local to "
                                 f"each shard, so its float8 all-gather already runs without any AMAX all-reduce")

    def _check_granularity(self, key: str, recipe_key: str, what: str, allowed: dict, default: str) -> None:
        """`key` applies to getattr(self, recipe_key) == "mxfp8" only: defaulted there, an error elsewhere."""
        value, recipe = getattr(self, key), getattr(self, recipe_key)
        if recipe == "mxfp8":
            if value is None:
                object.__setattr__(self, key, default)
            elif value not in allowed:
                raise ValueError(f"{key}: {value!r} is not an MXFP8 {what} granularity; allowed: "
                                 f"{', '.join(map(repr, allowed))}")
        elif value is not None:
            raise ValueError(f"{key}: {value!r} is set but {recipe_key} is {recipe!r}; a granularity applies to "
                             f"{recipe_key}='mxfp8' only (leave it unset)")

    @property
    def auto_filter(self) -> bool:
        return AUTO_FILTER in self.filter_fqns

    @property
    def linear_dim_multiple(self) -> int:
        """in_features and out_features of a converted Linear must be multiples of this (the recipe's, or the
        mxfp8 granularity's block / tile)."""
        if self.recipe_name == "mxfp8":
            return LINEAR_GRANULARITIES[self.linear_granularity]
        return self.recipe.dim_multiple

    @property
    def mx128_linear(self) -> bool:
        return self.recipe_name == "mxfp8" and self.linear_granularity == "mx128"

    @property
    def moe_block(self) -> int:
        """Elements sharing a scale along an expert GEMM's reduction axis; 0 for bf16 experts. Expert weight dims
        must be multiples of it (convert.py checks)."""
        if self.moe_recipe_name == "mxfp8":
            return MOE_GRANULARITIES[self.moe_granularity]
        return FP8_ROWWISE_TOKEN_ALIGN if self.moe_recipe_name == "fp8_rowwise" else 0

    @property
    def moe_dim_multiple(self) -> int:
        """Expert weight dims (dim, hidden_dim) must be multiples of this: the block, and for mx128 / mx32 the
        128-row weight tiles and the 128-feature tiles of wgrad's token-major operands (kernels.moe col_tile)."""
        if self.moe_recipe_name == "mxfp8" and self.moe_granularity != "mx32_plain":
            return 128
        return self.moe_block

    @property
    def moe_token_group_align(self) -> int:
        """Rows every expert's token group is padded to: fp8_rowwise 16 (torch._scaled_grouped_mm), mxfp8 the
        block (128 for mx128: wgrad's token blocks must not straddle two experts, and the CUTLASS backend
        needs 128-token groups), 1 for bf16 experts."""
        return self.moe_block or 1
