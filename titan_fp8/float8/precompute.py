"""precompute_float8_dynamic_scale_for_fsdp: every float8 weight's replicated scale from ONE all-reduce.

After `optimizer.step()` (and once after `parallelize`, so step 1 pays no all-reduce in the gather path):
  1. local amax of every float8 weight shard that needs a replicated scale: tensorwise Linear weights (one
     multi-tensor kernel, torch._foreach_norm ord=inf) and expert weights whose scale groups straddle FSDP
     shards (one amax per group: per expert, or per 128x128 tile; expert_weights.py);
  2. ONE all_reduce(MAX) of all of them concatenated, over the shard group only (HSDP: replicas hold equal
     weights, so equal amax; weights.py `shard_group`);
  3. the scales (or group amax) kept on each module.
FSDP2's pre-all-gather then casts the shard with them (weights.py, expert_weights.py). Nothing else is kept:
caching the cast shards instead would hold 1 byte per local parameter for the whole step (measured +0.79 GiB
peak on 8 Llama-3-8B blocks over 2 H200s) to save a cast that overlaps compute anyway.

Without precompute, the first pre-all-gather after an optimizer step runs the same `compute_scales` for every
float8 weight of its model (the ScaleGroup convert_to_float8_training made), so that path also pays ONE
all-reduce per step, not one per weight and gather.
A rank whose shard is empty contributes amax 0 and still joins the all-reduce.
"""
from __future__ import annotations

import torch.nn as nn

from .weights import compute_scales, model_entries


def float8_weights(model: nn.Module):
    """[AmaxEntry(fqn, param, local weight, module)] of every float8 weight whose scale the all-reduce makes."""
    return model_entries(model)


def precompute_float8_dynamic_scale_for_fsdp(model: nn.Module, check_finite: bool = False) -> None:
    """Compute every float8 weight's replicated scale (tensorwise Linear weights; expert weights whose scale
    groups straddle FSDP shards) with ONE all-reduce; FSDP2's pre-all-gather casts each shard with it.

    check_finite=True raises a ValueError naming every weight whose amax is inf/NaN (costs one device sync);
    otherwise such a weight gets a NaN scale and NaN outputs (never silently finite)."""
    compute_scales(model_entries(model), check_finite)
