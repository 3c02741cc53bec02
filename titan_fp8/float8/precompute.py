"""precompute_float8_dynamic_scale_for_fsdp: every tensorwise float8 weight's scale from ONE all-reduce.

After `optimizer.step()` (and once after `parallelize`, so step 1 pays no per-weight all-reduce either):
  1. local amax of every float8 weight shard: one multi-tensor kernel (torch._foreach_norm, ord=inf);
  2. ONE all_reduce(MAX) of the stacked [n_weights] amax vector;
  3. scales for all weights in one vectorized amax_to_scale;
  4. each shard cast to float8 once and cached on the weight, so FSDP2's pre-all-gather (forward AND
     backward re-gathers) launches no kernel at all for float8 weights.
A rank whose shard is empty contributes amax 0 and still joins the all-reduce.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .config import E4M3
from .scaling import amax_to_scale, to_float8
from .weights import _OPTIMIZER_GENERATION, CastCache, Float8TrainingWeight, _mesh_group


def float8_weights(model: nn.Module):
    """[(fqn, param, local Float8TrainingWeight, module)] for every tensorwise float8-all-gather weight."""
    from .linear import Float8Linear

    found = []
    for fqn, mod in model.named_modules():
        if not isinstance(mod, Float8Linear) or mod.float8_config.recipe_name != "tensorwise":
            continue
        w = mod.weight
        local = getattr(w, "_local_tensor", w)
        if isinstance(local, Float8TrainingWeight):
            found.append((f"{fqn}.weight" if fqn else "weight", w, local, mod))
    return found


@torch.no_grad()
def precompute_float8_dynamic_scale_for_fsdp(model: nn.Module, check_finite: bool = False) -> None:
    """Compute and cache the float8 cast of every tensorwise float8 weight shard with ONE all-reduce.

    check_finite=True raises a ValueError naming every weight whose amax is inf/NaN (costs one device sync);
    otherwise such a weight gets a NaN scale and NaN outputs (never silently finite)."""
    entries = float8_weights(model)
    if not entries:
        return
    meshes = {w.device_mesh for _, w, _, _ in entries if hasattr(w, "device_mesh")}
    if len(meshes) > 1:
        raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: float8 weights live on {len(meshes)} "
                         f"different device meshes; one all-reduce needs one mesh")
    shards = [local._tensor for _, _, local, _ in entries]
    nonempty = [i for i, t in enumerate(shards) if t.numel() > 0]
    device = shards[0].device
    amax = torch.zeros(len(shards), dtype=torch.float32, device=device)
    if nonempty:
        norms = torch._foreach_norm([shards[i] for i in nonempty], ord=float("inf"))
        amax[torch.tensor(nonempty, device=device)] = torch.stack(norms).to(torch.float32)
    if meshes:
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=_mesh_group(next(iter(meshes))))
    if check_finite:
        bad = ~torch.isfinite(amax)
        if bool(bad.any()):
            names = [entries[i][0] for i in bad.nonzero().flatten().tolist()]
            raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: non-finite values (inf/NaN) in "
                             f"weights {names}")
    scales = amax_to_scale(amax, E4M3)
    gen = _OPTIMIZER_GENERATION[0]
    for i, (_, _, local, mod) in enumerate(entries):
        scale = scales[i]
        mod._float8_cast_cache = CastCache(to_float8(local._tensor, scale, E4M3), scale, gen)
