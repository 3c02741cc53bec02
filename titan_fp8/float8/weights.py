"""Float8TrainingWeight: the high-precision weight of a Float8Linear, with FSDP2 hooks that all-gather it
already quantized.

FSDP2 calls `fsdp_pre_all_gather` on each rank's shard and `fsdp_post_all_gather` on the gathered bytes:

tensorwise  pre:  float8 e4m3 shard = saturate(shard * scale) with the REPLICATED scale, one fused pass
                  (read fp32/bf16, write fp8; no fp32 temporary). Under `parallelize` the first hook of a block
                  casts all of the block's tensorwise weights with ONE launch (cast_batch.py, batch_weight_casts)
                  and the others take their bytes. The scale comes from ONE all-reduce of every
                  float8 weight's AMAX in the model per optimizer step: made by
                  `precompute_float8_dynamic_scale_for_fsdp` after the step, or, without it, lazily by the first
                  pre-all-gather of the step (for all weights of the model at once). Only the 4-byte scale is
                  cached between gathers, never the cast shard (that would cost 1 byte per local parameter for
                  the whole step: 0.78 GiB per rank on 8 Llama-3-8B blocks over 2 GPUs).
            post: a torchao Float8TrainingTensor(data, scale): the linear does not cast the weight again.
mxfp8       pre:  MXFP8 with one E8M0 scale per 128x128 tile (linear_granularity "mx32" and "mx128": the same bytes,
                  kernels.grouped_gemm's quantizers; "mx32_tile32": per 32x32 tile, kernels.mxfp8.to_mxfp8_tiles32).
                  Tiles lie inside a shard when each shard holds a multiple of 128 (32) rows, so the shard
                  quantizes exactly as the unsharded weight would: NO all-reduce at all (other shardings are a
                  start-up error, convert.check_float8_all_gather).
                  Both travel: the e4m3 bytes and ONE E8M0 byte per tile (compact [rows/tile, K/tile]).
            post: a gathered.Float8GatheredWeight(data, tile scales) with the parameter dtype outside: the
                  Linear's GEMMs (linear.py) read those bytes and scales as they are (mx32 / mx128: w^T for
                  grad-input is the same tiles transposed), so the weight is never decoded and quantized again,
                  and numerics are quantize-after-gather's bit for bit. Backward's regather refills the same data
                  storage (FSDP2's `out=` call): only the scales are swapped in. The bytes on the wire are just
                  over half of bf16's.

Every all-gather input is handed to FSDP2 as uint8 bytes (gloo cannot all-gather float8 dtypes; NCCL does
not care) and viewed back as float8 after the gather.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._prims_common import suggest_memory_format
from torch.optim.optimizer import register_optimizer_step_post_hook

from .cast_batch import WeightCastBatch
from .config import E4M3, Float8Config
from .gathered import Float8GatheredWeight
from .scaling import amax_to_scale, mx_quantize_weight, mx_quantize_weight_tiles, to_float8_fused

aten = torch.ops.aten

# ops whose results stay weights (FSDP2 shards, pads and moves the tensor; optimizers clone it)
_PRESERVE = {
    aten.empty_like.default, aten.new_zeros.default, aten.new_empty.default, aten.slice.Tensor,
    aten.copy_.default, aten.view.default, aten.as_strided.default, aten._to_copy.default,
    aten._pin_memory.default, aten.split.Tensor, aten.clone.default, aten.detach.default,
    aten.alias.default, aten.chunk.default,
}

# Bumped after every optimizer step (any torch optimizer, fused ones included: they do not bump tensors'
# version counters). A cached cast is valid only in the optimizer generation it was made in.
_OPTIMIZER_GENERATION = [0]


def _on_optimizer_step(optimizer, args, kwargs):
    _OPTIMIZER_GENERATION[0] += 1


register_optimizer_step_post_hook(_on_optimizer_step)


@dataclasses.dataclass
class ScaleCache:
    """A weight's replicated tensorwise scale, valid until the next optimizer step (or load_state_dict, which
    clears it). Weights edited in place by hand afterwards need another precompute call."""
    scale: torch.Tensor  # fp32 0-d, replicated
    generation: int

    def valid(self) -> bool:
        return self.generation == _OPTIMIZER_GENERATION[0]


class ScaleGroup:
    """The float8 all-gather weights of one model (set by convert_to_float8_training): their scales are made
    together, with ONE all-reduce. Holds (fqn, module) pairs; plain references, so deepcopy copies it
    consistently with the modules."""

    def __init__(self, members):
        self.members = list(members)


_warned_stale = [False]


def linear_mm_config(emulate: bool):
    """torchao's LinearMMConfig for the tensorwise / rowwise GEMMs (None without torchao): fast accumulation in
    the forward GEMM only (torchao's default: gradients keep full accumulation)."""
    try:
        from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig
    except ImportError:
        return None
    return LinearMMConfig(
        ScaledMMConfig(emulate, True, False, False),
        ScaledMMConfig(emulate, False, False, False),
        ScaledMMConfig(emulate, False, False, False),
    )


def warn_stale_precompute(config: Float8Config) -> None:
    if config.precompute_float8_dynamic_scale_for_fsdp and not _warned_stale[0]:
        _warned_stale[0] = True
        warnings.warn("float8: no valid precomputed scale for a weight (call "
                      "precompute_float8_dynamic_scale_for_fsdp(model) after parallelize and after every "
                      "optimizer step); computing every weight's scale now, in the all-gather path")


def _unwrap_one(t, first):
    if isinstance(t, Float8TrainingWeight):
        return t._tensor, first if first is not None else t
    return t, first


def _unwrap_flat(args: tuple, kwargs: dict):
    """(args, kwargs, first wrapped weight) with every Float8TrainingWeight replaced by its tensor, where args
    and kwargs values are tensors, scalars or flat lists / tuples of them (what aten ops, foreach ones
    included, take); None for anything nested deeper (pytree then does it). A plain loop: pytree's
    flatten / unflatten of the optimizer's foreach ops (lists of every parameter, gradient and state) took
    ~1 ms of host time per call (H100 profile of llama_moe, 2026-11-23)."""
    first = None
    out_args = []
    for a in args:
        if type(a) in (list, tuple):
            items = []
            for t in a:
                if type(t) in (list, tuple, dict):
                    return None
                t, first = _unwrap_one(t, first)
                items.append(t)
            a = type(a)(items)
        elif type(a) is dict:
            return None
        else:
            a, first = _unwrap_one(a, first)
        out_args.append(a)
    out_kwargs = {}
    for k, v in kwargs.items():
        if type(v) in (list, tuple, dict):
            if type(v) is dict or any(type(t) in (list, tuple, dict) for t in v):
                return None
            items = []
            for t in v:
                t, first = _unwrap_one(t, first)
                items.append(t)
            v = type(v)(items)
        else:
            v, first = _unwrap_one(v, first)
        out_kwargs[k] = v
    return tuple(out_args), out_kwargs, first


class Float8TrainingWeight(torch.Tensor):
    """Wrapper subclass around the high-precision weight (`_tensor`); every op but the ones FSDP2 needs to
    shard it sees the plain tensor."""

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, config: Float8Config, *args):
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.size(), strides=tensor.stride(), storage_offset=tensor.storage_offset(),
            memory_format=suggest_memory_format(tensor), dtype=tensor.dtype, layout=tensor.layout,
            device=tensor.device, pin_memory=tensor.is_pinned(), requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, config: Float8Config):
        self._tensor = tensor
        self._config = config

    def __repr__(self):
        return f"Float8TrainingWeight(recipe={self._config.recipe_name}, {self._tensor!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        flat = _unwrap_flat(args, kwargs)
        if flat is not None:  # the common case, the optimizer's foreach ops over every parameter included
            args, kwargs, first = flat
        else:
            first = None

            def unwrap(t):
                nonlocal first
                first = first if first is not None else t
                return t._tensor

            args, kwargs = pytree.tree_map_only(Float8TrainingWeight, unwrap, (args, kwargs))
        out = func(*args, **kwargs)
        if func not in _PRESERVE:
            return out
        return pytree.tree_map_only(torch.Tensor, first._rewrap, out)

    def _rewrap(self, tensor: torch.Tensor) -> "Float8TrainingWeight":
        """A weight of this kind (class and settings) around `tensor` (results of the ops FSDP2 shards with)."""
        return Float8TrainingWeight(tensor, self._config)

    def __tensor_flatten__(self):
        return ["_tensor"], {"config": self._config}

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return Float8TrainingWeight(inner_tensors["_tensor"], meta["config"])

    def needs_amax_all_reduce(self, param: torch.Tensor) -> bool:
        """Does this weight's scale come from the one AMAX all-reduce (compute_scales)? tensorwise: always
        (one replicated scale; without FSDP the "all-reduce" is skipped); mxfp8 tiles are shard-local."""
        return self._config.recipe_name == "tensorwise"

    # ------------------------------------------------------------------------------------------ FSDP2
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        # `mesh` is FSDP2's shard mesh (HSDP: the dp_shard sub-mesh), so `world` is the shard group's size
        world = mesh.size()
        padded_rows = math.ceil(outer_size[0] / world)
        if self._config.recipe_name == "mxfp8":
            return self._pre_all_gather_mxfp8(outer_size, world, module)
        data, scale = self._tensorwise_shard(mesh, module)
        u8 = data.view(torch.uint8)
        if u8.shape[0] != padded_rows:  # uneven sharding: FSDP2 wants every rank's input padded
            pad = u8.new_zeros((padded_rows - u8.shape[0],) + tuple(u8.shape[1:]))
            u8 = torch.cat([u8, pad])
        return (u8,), (scale,)

    def _tensorwise_shard(self, mesh, module):
        # The scale lives on the module: FSDP2 may hand an empty shard's hook a different tensor object than
        # the parameter's local tensor. Its validity depends only on the optimizer generation, which is the
        # same on every rank, so all ranks take the same branch (a per-rank test could deadlock the
        # all-reduce in compute_scales).
        cache = getattr(module, "_float8_scale_cache", None)
        if cache is None or not cache.valid():
            warn_stale_precompute(self._config)
            compute_scales(group_entries(module))
            cache = module._float8_scale_cache
        batch = getattr(module, "_float8_cast_batch", None)
        data = batch.take(module, self._tensor, cache.generation) if batch is not None else None
        if data is None:
            data = to_float8_fused(self._tensor, cache.scale, E4M3)
        return data, cache.scale

    def _pre_all_gather_mxfp8(self, outer_size, world, module=None):
        rows, tile = outer_size[0], self._config.linear_dim_multiple
        if rows % world or (rows // world) % tile:
            raise ValueError(f"float8 all-gather (mxfp8 {self._config.linear_granularity}): weight of shape "
                             f"{tuple(outer_size)} sharded over {world} ranks gives {rows / world:g} rows per rank; "
                             f"MXFP8 {tile}x{tile} tiles stay inside a shard only when that is a whole multiple of "
                             f"{tile}")
        batch = getattr(module, "_float8_cast_batch", None)
        got = batch.take(module, self._tensor, _OPTIMIZER_GENERATION[0]) if batch is not None else None
        if got is not None:  # the block's one launch made it: bytes + one E8M0 byte per 128x128 tile
            data, scale = got
        else:
            if tile == 32:
                data, scale_k = mx_quantize_weight(self._tensor)
            else:
                data, scale_k = mx_quantize_weight_tiles(self._tensor, tile)
            scale = scale_k[::tile, ::tile // 32].contiguous()  # one E8M0 byte per tile (each 1x32 block repeats it)
        if world == 1:
            # FSDP2's one-rank path (torch 2.11-2.14, FSDPParamGroup.wait_for_unshard) copies only the FIRST
            # all-gather input into the unsharded parameter: the scales ride in the metadata instead.
            return (data.view(torch.uint8),), (scale,)
        return (data.view(torch.uint8), scale), ()

    def fsdp_post_all_gather(self, all_gather_outputs, metadata: Any, param_dtype: torch.dtype, *,
                             out: Optional[torch.Tensor] = None):
        if self._config.recipe_name == "mxfp8":
            data, scale = all_gather_outputs if len(all_gather_outputs) == 2 else (*all_gather_outputs, *metadata)
            if out is not None:
                # backward's regather: FSDP2 re-filled the data storage `out` views (its copy-out keeps the
                # version, so the Linear's saved weight stays valid); only the scale tensor is new (1 rank: the
                # metadata's). No copy.
                if not isinstance(out, Float8GatheredWeight):
                    raise RuntimeError(f"float8 all-gather (mxfp8): FSDP2 handed back {type(out).__name__}, "
                                       f"expected the Float8GatheredWeight built by the first all-gather")
                out._scale = scale
                return
            w = Float8GatheredWeight(data.view(E4M3), scale, "mxfp8", self._config.linear_granularity, param_dtype,
                                     self._config.linear_dim_multiple)
            return w, tuple(all_gather_outputs)
        from torchao.float8.float8_training_tensor import Float8TrainingTensor, GemmInputRole

        (data,) = all_gather_outputs
        (scale,) = metadata
        if out is not None:
            inner = out._local_tensor if hasattr(out, "_local_tensor") else out
            if not isinstance(inner, Float8TrainingTensor):
                raise RuntimeError(f"float8 all-gather: FSDP2 handed back {type(inner).__name__}, expected the "
                                   f"Float8TrainingTensor built by the first all-gather")
            inner._scale = scale
            return
        f8 = data.view(E4M3)
        return Float8TrainingTensor(f8, scale, param_dtype, linear_mm_config(self._config.emulate),
                                    GemmInputRole.WEIGHT), (data,)


def precompute_hook_signature(cls) -> None:
    """FSDP2 (torch 2.11-2.14, FSDPParam.all_gather_inputs) calls inspect.signature(fsdp_pre_all_gather) at
    every all-gather of every parameter, to tell its old one-argument hook from the five-argument one: 40-60 us
    of host each, ~9 weights a llama_moe block, twice a step. A precomputed __signature__ is returned at once."""
    hook = cls.__dict__["fsdp_pre_all_gather"]
    hook.__signature__ = inspect.signature(hook)


precompute_hook_signature(Float8TrainingWeight)


def _local_shard(module, attr: str) -> Optional[torch.Tensor]:
    """The plain local shard behind module.<attr> (a DTensor of a Float8TrainingWeight), None otherwise."""
    w = getattr(module, attr, None)
    local = getattr(w, "_local_tensor", w)
    return local._tensor if isinstance(local, Float8TrainingWeight) else None


class _TensorwiseCasts:
    """cast_all of a tensorwise WeightCastBatch: every member with its own valid scale, one launch. The stacked
    scales are remade when the members' scale caches change (once per optimizer step)."""

    def __init__(self):
        self._caches: tuple = ()
        self._scales: Optional[torch.Tensor] = None

    def __call__(self, members, shards):
        from kernels.float8_cast import to_float8_tensorwise_many

        caches = tuple(getattr(m, "_float8_scale_cache", None) for m, _ in members)
        if any(c is None or not c.valid() for c in caches):
            return None
        if len(caches) != len(self._caches) or any(a is not b for a, b in zip(caches, self._caches)):
            self._caches, self._scales = caches, torch.stack([c.scale.reshape(()) for c in caches])
        return to_float8_tensorwise_many(shards, self._scales, E4M3)


def _mx128_tiles_all(members, shards):
    """cast_all of an mx128 WeightCastBatch: (bytes, one E8M0 byte per 128x128 tile) of every member; one launch
    on CUDA, the plain PyTorch rule per weight elsewhere (same bits)."""
    if shards[0].is_cuda:
        from kernels.grouped_gemm.quant_triton import to_mxfp8_tiles_many
        return to_mxfp8_tiles_many([s.contiguous() for s in shards], 128)
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    out = []
    for s in shards:
        data, scale_k = to_mxfp8_blocked(s, -1, 128, 128)
        out.append((data, scale_k[..., ::128, ::4].contiguous()))
    return out


def _batch_kind(module, attr: str, local) -> Optional[str]:
    """Which batch the weight module.<attr> (local shard `local`) joins: "tensorwise", "mx128", or None."""
    cfg = local._config
    if not cfg.enable_fsdp_float8_all_gather or local._tensor.numel() == 0:
        return None
    if type(local) is Float8TrainingWeight:
        if cfg.recipe_name == "tensorwise":
            return "tensorwise"
        if cfg.recipe_name == "mxfp8" and cfg.linear_dim_multiple == 128:
            return "mx128"
        return None
    # an expert weight: mxfp8 with 128x128 tiles whose scales travel with the shard (no all-reduce)
    if getattr(local, "_attr", None) == attr and cfg.moe_recipe_name == "mxfp8" and cfg.moe_granularity != "mx32_plain":
        param = getattr(module, attr)
        if getattr(param, "device_mesh", None) is not None and not local.needs_amax_all_reduce(param):
            return "mx128"
    return None


def batch_weight_casts(unit: nn.Module) -> dict:
    """Let the first pre-all-gather hook of FSDP unit `unit` (a fully_shard'ed block) cast or quantize the unit's
    float8-all-gather weights with ONE launch per kind (cast_batch.py): the tensorwise Linear weights together, the
    mx128 Linear and expert weights together. Call after fully_shard; returns {kind: number of weights grouped}
    (a kind with fewer than 2 weights or mixed dtypes is left alone). Weights of FSDP units nested inside `unit`
    are left out: they are gathered at other times."""
    from torch.distributed.fsdp import FSDPModule

    kinds: dict = {}
    stack = [unit]
    while stack:
        mod = stack.pop()
        for attr, w in mod._parameters.items():
            local = getattr(w, "_local_tensor", w)
            kind = _batch_kind(mod, attr, local) if isinstance(local, Float8TrainingWeight) else None
            if kind is not None:
                kinds.setdefault(kind, []).append((mod, attr))
        stack.extend(c for c in reversed(list(mod.children())) if not isinstance(c, FSDPModule))
    grouped = {}
    for kind, members in kinds.items():
        if len(members) < 2 or len({(_local_shard(m, a).dtype, _local_shard(m, a).device) for m, a in members}) != 1:
            continue
        cast_all = _TensorwiseCasts() if kind == "tensorwise" else _mx128_tiles_all
        batch = WeightCastBatch(kind, members, _local_shard, cast_all)
        for m, _ in members:
            m.__dict__.setdefault("_float8_cast_batch", batch)  # a module's weights are all of one kind
        grouped[kind] = len(members)
    return grouped


class _OneRank:
    """The one method of FSDP2's shard mesh the mxfp8 pre-all-gather reads."""

    def size(self) -> int:
        return 1


def gather_on_one_rank(weight: torch.Tensor, config: Float8Config, param_dtype: Optional[torch.dtype] = None):
    """What FSDP2's float8 all-gather hands an mxfp8 Float8Linear on one rank: the pre- then post-all-gather
    hook on the whole weight, with no collective (a Float8GatheredWeight). For tests and benchmarks of the GEMMs
    on gathered weights."""
    if config.recipe_name != "mxfp8":
        raise ValueError(f"gather_on_one_rank: recipe_name={config.recipe_name!r}; only 'mxfp8' weights gather "
                         f"without a module (tensorwise needs its model's scale all-reduce)")
    w = Float8TrainingWeight(weight.detach(), config)
    inputs, metadata = w.fsdp_pre_all_gather(_OneRank(), weight.shape, weight.stride(), None, None)
    gathered, _ = w.fsdp_post_all_gather(inputs, metadata, param_dtype or weight.dtype)
    return gathered


# ---------------------------------------------------------------------------------- the ONE AMAX all-reduce
class AmaxEntry(NamedTuple):
    """A float8 weight whose scale(s) come from the combined all-reduce."""
    name: str
    param: torch.Tensor                # the parameter (a DTensor under FSDP2)
    local: "Float8TrainingWeight"      # its local shard
    module: nn.Module                  # where its scale cache lives


def module_entries(fqn: str, mod: nn.Module) -> list:
    """AmaxEntry of every parameter of `mod` (not of its children) that needs the combined all-reduce."""
    out = []
    for name, p in mod.named_parameters(recurse=False):
        local = getattr(p, "_local_tensor", p)
        if isinstance(local, Float8TrainingWeight) and local.needs_amax_all_reduce(p):
            out.append(AmaxEntry(f"{fqn}.{name}" if fqn else name, p, local, mod))
    return out


def model_entries(model: nn.Module) -> list:
    """Every AmaxEntry of `model`, in module order (the same on every rank)."""
    return [e for fqn, mod in model.named_modules() for e in module_entries(fqn, mod)]


def group_entries(module: nn.Module) -> list:
    """The entries of the model `module` was converted in (its ScaleGroup); just `module`'s if it has none
    (a Float8Linear made with from_linear outside convert_to_float8_training)."""
    group = getattr(module, "_float8_scale_group", None)
    members = group.members if group is not None else [("", module)]
    if not any(m is module for _, m in members):
        members = [("", module)]
    return [e for f, m in members for e in module_entries(f, m)]


@torch.no_grad()
def compute_scales(entries, check_finite: bool = False) -> None:
    """ONE all-reduce(MAX) of every entry's local amax (tensorwise Linear weights: one value each; expert
    weights whose scale groups straddle shards: one per group); each keeps its replicated result."""
    if not entries:
        return
    meshes = {e.param.device_mesh for e in entries if hasattr(e.param, "device_mesh")}
    if len(meshes) > 1:
        raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: float8 weights live on {len(meshes)} "
                         f"different device meshes; one all-reduce needs one mesh")
    tensorwise = [e for e in entries if type(e.local) is Float8TrainingWeight]
    grouped = [e for e in entries if type(e.local) is not Float8TrainingWeight]
    shards = [e.local._tensor for e in tensorwise]
    nonempty = [t for t in shards if t.numel() > 0]
    norms = iter(torch._foreach_norm(nonempty, ord=float("inf")) if nonempty else [])
    # an empty shard contributes 0 (no host->device index copy: that could stall the CPU's run-ahead)
    pieces = [next(norms).to(torch.float32).reshape(1) if t.numel() > 0
              else torch.zeros(1, dtype=torch.float32, device=t.device) for t in shards]
    pieces += [e.local.local_amax(e.param) for e in grouped]
    amax = torch.cat(pieces)
    if meshes:
        sharded = next(e.param for e in entries if hasattr(e.param, "device_mesh"))
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=shard_group(sharded))
    parts = amax.split([1] * len(tensorwise) + [p.numel() for p in pieces[len(tensorwise):]])
    if check_finite:
        names = [e.name for e, a in zip(tensorwise + grouped, parts) if not bool(torch.isfinite(a).all())]
        if names:
            raise ValueError(f"precompute_float8_dynamic_scale_for_fsdp: non-finite values (inf/NaN) in "
                             f"weights {names}")
    gen = _OPTIMIZER_GENERATION[0]
    scales = amax_to_scale(amax[:len(tensorwise)], E4M3)
    # one storage per scale (clone), not views at 40 storage offsets of one vector: the compiled cast in the
    # all-gather path then sees the same tensor layout for every weight and compiles once
    for e, scale in zip(tensorwise, scales.unbind(0)):
        e.module._float8_scale_cache = ScaleCache(scale.clone(), gen)
    for e, part in zip(grouped, parts[len(tensorwise):]):
        e.local.store_global_amax(e.module, e.param, part, gen)


def shard_group(w):
    """The process group over which the weight is sharded: the group of its one Shard placement's mesh dim (1-D
    FSDP: the whole mesh; HSDP (dp_replicate, dp_shard): the dp_shard group). The AMAX all-reduce spans exactly
    these ranks and no more: across the replicate dim every replica holds the same weights (FSDP2 all-reduces
    the gradient shards across replicas, so the optimizer steps keep them equal), hence the same amax."""
    from torch.distributed.tensor import Shard
    mesh = w.device_mesh
    dims = [i for i, p in enumerate(w.placements) if isinstance(p, Shard)]
    if len(dims) != 1:
        raise NotImplementedError(f"float8 AMAX all-reduce: weight placements {w.placements} on a {mesh.ndim}-D mesh "
                                  f"{mesh.mesh_dim_names}; expected exactly one sharded mesh dim (FSDP or HSDP)")
    return mesh.get_group(dims[0])


def unwrap_weight(t: torch.Tensor) -> torch.Tensor:
    """The plain high-precision tensor behind a (DTensor of a) Float8TrainingWeight, sharing storage."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, Float8TrainingWeight):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local._tensor, t.device_mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride())
    if isinstance(t, Float8TrainingWeight):
        return t._tensor
    return t


# Checkpoints: allow this subclass (and its config) through torch.load(weights_only=True).
torch.serialization.add_safe_globals([Float8TrainingWeight, Float8Config])
