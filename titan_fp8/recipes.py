"""Named training recipes for launch/compare.py: the ONE list of presets, each a set of `[float8]` keys.

A preset sets only the keys it names; every other key comes from the job file, so compare a config whose
[float8] section is at its defaults. `--recipes` takes preset names and ad-hoc recipes, comma-separated:

    bf16,tensorwise                                  two presets
    noag:enable=true,recipe_name=tensorwise          ad-hoc: keys relative to [float8] ...
    ctas8:tensorwise,comm.nccl_max_ctas=8            ... or fully dotted; a preset right after the ':' is the base
    py:mxfp8_mx128_linears,env.TITAN_FP8_BLOCKWISE_MM=python   env.NAME: an environment variable of that run's
                                                     processes (A/B of a switch the job file does not hold)

This module imports nothing heavy: compare.py checks the recipe list before starting anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Tensorwise float8 Linears whose weights FSDP2 all-gathers already in float8, every scale from ONE
# AMAX all-reduce per step (precompute): the fastest measured tensorwise setup (README).
_TENSORWISE = {"enable": True, "recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": True,
               "precompute_float8_dynamic_scale_for_fsdp": True}
# MXFP8 Linears (1x32 E8M0 blocks) with float8 all-gather, plus MXFP8 routed experts.
_MXFP8 = {"enable": True, "recipe_name": "mxfp8", "enable_fsdp_float8_all_gather": True, "moe_recipe_name": "mxfp8"}

PRESETS: dict[str, dict[str, object]] = {
    # the reference every other recipe is measured against
    "bf16": {"enable": False},
    # routed experts stay bf16 (moe_recipe_name's default "none")
    "tensorwise": dict(_TENSORWISE),
    # + routed experts in float8 with one scale per row (fp8_rowwise grouped GEMMs)
    "tensorwise_fp8_rowwise_experts": {**_TENSORWISE, "moe_recipe_name": "fp8_rowwise"},
    # + routed experts in mxfp8 "mx128" (the fastest expert recipe per MoE layer on Hopper: benchmarks/moe_layer.py)
    "tensorwise_mx128_experts": {**_TENSORWISE, "moe_recipe_name": "mxfp8", "moe_granularity": "mx128"},
    # experts with "mx128" scale sharing: one power-of-two scale per 1x128 activations / 128x128 weight tile
    "mxfp8_mx128": {**_MXFP8, "moe_granularity": "mx128"},
    # mxfp8_mx128 with the Linears on mx128 too (linear_granularity; mxfp8_mx128's Linears keep the default
    # "mx32_tile32")
    "mxfp8_mx128_linears": {**_MXFP8, "moe_granularity": "mx128", "linear_granularity": "mx128"},
    # the same but experts with plain 1x32 scales: differs from mxfp8_mx128 only in the expert granularity
    "mxfp8_mx32_experts": {**_MXFP8, "moe_granularity": "mx32"},
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # also a folder name
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
ENV = "env."  # key prefix of an environment variable: env.TITAN_FP8_BLOCKWISE_MM=python
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class RecipeError(ValueError):
    """A bad --recipes value; str(err) is one line naming the culprit and what is allowed."""


@dataclass(frozen=True)
class Recipe:
    name: str
    keys: dict  # fully dotted key ("float8.enable", "comm.nccl_max_ctas") -> value (Python value or CLI text)

    def overrides(self) -> list[str]:
        """The `--section.key=value` arguments of launch/train.py that make this recipe (env.* keys excluded)."""
        return [f"--{key}={_cli_text(value)}" for key, value in self.keys.items() if not key.startswith(ENV)]

    def env(self) -> dict[str, str]:
        """The environment variables (env.NAME=value keys) this recipe's runs set."""
        return {key[len(ENV):]: _cli_text(value) for key, value in self.keys.items() if key.startswith(ENV)}


def _cli_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _dotted(key: str) -> str:
    return key if "." in key else f"float8.{key}"


def _preset(name: str, spec: str) -> Recipe:
    if name not in PRESETS:
        raise RecipeError(f"--recipes {spec!r}: unknown recipe {name!r}; presets: {', '.join(PRESETS)}; "
                          "or an ad-hoc name:key=value,... (keys of [float8], or section.key)")
    return Recipe(name, {_dotted(k): v for k, v in PRESETS[name].items()})


def _split_top_level(spec: str) -> list[str]:
    """Split at commas outside [...] and quotes, so `filter_fqns=["output","router"]` stays one item."""
    items, depth, quote, cur = [], 0, None, ""
    for ch in spec:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
            continue
        cur += ch
    items.append(cur.strip())
    return items


def parse_recipes(spec: str) -> list[Recipe]:
    """`bf16,tensorwise,noag:enable=true,recipe_name=tensorwise` -> [Recipe, ...] in the given order.

    An item `name:...` starts an ad-hoc recipe; the `key=value` items after it belong to it; an item without
    ':' or '=' is a preset name."""
    recipes: list[Recipe] = []
    adhoc: dict | None = None  # keys of the ad-hoc recipe being read
    for item in _split_top_level(spec):
        if not item:
            raise RecipeError(f"--recipes {spec!r}: empty item; give comma-separated names, e.g. bf16,tensorwise")
        head, colon, rest = item.partition(":")
        if colon and "=" not in head:
            if not _NAME.match(head):
                raise RecipeError(f"--recipes {spec!r}: recipe name {head!r} must be letters, digits, '_', '.', '-'")
            base = rest.strip()
            adhoc = {}
            if base and "=" not in base:  # name:preset,key=value: start from that preset's keys
                adhoc.update(_preset(base, spec).keys)
                base = ""
            recipes.append(Recipe(head, adhoc))
            item = base
            if not item:
                continue
        if "=" in item:
            if adhoc is None:
                raise RecipeError(f"--recipes {spec!r}: {item!r} belongs to no recipe; an ad-hoc recipe is "
                                  "name:key=value,key=value")
            key, _, value = item.partition("=")
            key = key.strip()
            if not _KEY.match(key):
                raise RecipeError(f"--recipes {spec!r}: {key!r} is not a key; use a [float8] key or section.key")
            if key.startswith(ENV) and not _ENV_NAME.match(key[len(ENV):]):
                raise RecipeError(f"--recipes {spec!r}: {key!r}: an environment variable name is upper-case "
                                  f"letters, digits and '_' (env.NAME=value)")
            adhoc[_dotted(key)] = value.strip()
        else:
            adhoc = None
            recipes.append(_preset(item, spec))
    for r in recipes:
        if not r.keys:
            raise RecipeError(f"--recipes {spec!r}: ad-hoc recipe {r.name!r} sets no key; write {r.name}:key=value")
    names = [r.name for r in recipes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RecipeError(f"--recipes {spec!r}: recipe name(s) {', '.join(dup)} given twice; names must differ")
    return recipes
