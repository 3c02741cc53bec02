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
    nonempty = [t for t in shards if t.numel() > 0]
    norms = iter(torch._foreach_norm(nonempty, ord=float("inf")) if nonempty else [])
    # an empty shard contributes 0 (no host->device index copy: that could stall the CPU's run-ahead)
    amax = torch.stack([next(norms).to(torch.float32) if t.numel() > 0
                        else torch.zeros((), dtype=torch.float32, device=t.device) for t in shards])
    if meshes:
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=_shard_group(entries[0][1]))
    if check_finite:
        bad = ~torch.isfinite(amax)
        if bool(bad.any()):
            names = [entries[i][0] for i in bad.nonzero().flatten().tolist()]
            raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: non-finite values (inf/NaN) in "
                             f"weights {names}")
    scales = amax_to_scale(amax, E4M3)
    gen = _OPTIMIZER_GENERATION[0]
    scale_list = list(scales.unbind(0))
    datas = _cast_all(shards, scale_list)
    for (_, _, _, mod), data, scale in zip(entries, datas, scale_list):
        mod._float8_cast_cache = CastCache(data, scale, gen)


def _shard_group(w):
    """The process group over which the weight is sharded (HSDP: the shard dim; replicas hold equal weights,
    so their amax is the same and needs no reduction)."""
    from torch.distributed.tensor import Shard
    mesh = w.device_mesh
    dims = [i for i, p in enumerate(w.placements) if isinstance(p, Shard)]
    if mesh.ndim == 1:
        return _mesh_group(mesh)
    if len(dims) != 1:
        raise NotImplementedError(f"precompute_float8_dynamic_scale_for_fsdp: weight placements {w.placements} on a "
                                  f"{mesh.ndim}-D mesh; expected exactly one sharded mesh dim")
    return mesh.get_group(dims[0])


def _cast_all_eager(shards, scales):
    return [to_float8(t, s, E4M3) for t, s in zip(shards, scales)]


_compiled_cast_all = None


def _cast_all(shards, scales):
    """Every shard to float8. On CUDA one compiled graph: one fused read-fp32/write-fp8 kernel per weight and a
    single Python call per step (eager would run mul, clamp and cast as three full passes each). Inductor's
    fused cast equals the eager one bit for bit (fp32 multiply, clamp, round-to-nearest-even cast)."""
    global _compiled_cast_all
    if not shards[0].is_cuda:
        return _cast_all_eager(shards, scales)
    if _compiled_cast_all is None:
        _compiled_cast_all = torch.compile(_cast_all_eager, dynamic=False)
    return _compiled_cast_all(shards, scales)
