"""Float8 operands of the 3-D routed-expert weights, and their FSDP2 float8 all-gather.

Contract 1 (consumed by titan_fp8.float8.experts): for ONE expert weight w [E, N, K] (w13 [E, 2H, D], w2
[E, D, H]) the two GEMM directions read

    ExpertOperands(fwd_data [E, N, K] e4m3 contiguous, fwd_scale, bwd_data [E, K, N] e4m3 contiguous, bwd_scale)
      fprop: out[g] = x[g] @ w[e]^T reads (fwd_data, fwd_scale); dgrad: dx[g] = dout[g] @ w[e] reads
      (bwd_data, bwd_scale).

Scale conventions: fp8_rowwise scales follow the project's (scaling.py: data = w * scale, w ~ data / scale;
powers of two, so the reciprocal torch._scaled_grouped_mm multiplies by is exact); mxfp8 scales are E8M0
bytes (w ~ data * 2^(byte - 127)), as kernels.mxfp8 defines them.

Scale groups, and why:
  fp8_rowwise   ONE power-of-two scale per expert (amax -> scale: scaling.amax_to_scale, round_to_pow2,
                the rowwise Linear's rule), for w13 and w2 alike. fwd_scale fp32 [E, N] and bwd_scale fp32
                [E, K] are that scale broadcast (torch._scaled_grouped_mm's rowwise scale_b shapes). Not one
                scale per gate/up half of w13: dgrad contracts over N = 2H, and a rowwise scale_b varies
                only along the GEMM's output dim, so two scales along the contraction cannot be expressed;
                a per-expert scale makes the fprop layout and its transpose share scales exactly (only the
                e4m3 subnormal floor of the smaller half moves, by the halves' amax ratio).
  mxfp8 mx128/mx32  one E8M0 scale per 128x128 tile of w[e] (kernels/grouped_gemm/quant.py
                to_mxfp8_blocked(w, -1, 128, 128) bit for bit; partial edge tiles as it pads them). A square
                tile serves both directions: bwd_data is fwd_data transposed (transposing e4m3 bytes is
                exact) and the tile scales transposed. fwd_scale uint8 [E, N, K/32] (along K);
                bwd_scale uint8 [E, N/32, K] (along N), a transposed view of a contiguous [E, K, N/32]: the
                w_scale that kernels.grouped_gemm's dgrad takes with w_data = bwd_data.transpose(1, 2).
  mxfp8 mx32_plain  1x32 along K (fwd) and 1x32 along N (bwd): two differently scaled copies (plain
                to_mxfp8 both ways). No float8 all-gather (Float8Config refuses it).

`expert_weight_operands(w, ...)` takes the weight as the expert op receives it:
  - a plain high-precision tensor: quantized now; eager calls are cached once per optimizer step (key:
    weights._OPTIMIZER_GENERATION, the tensor's version and storage), so the forward and the backward of a
    step quantize once. Under torch.compile nothing is cached (inductor fuses the casts into the graph).
  - a gathered.Float8GatheredWeight (what FSDP2's post-all-gather built): the bytes that travelled are fwd_data;
    bwd_data is their transpose, made when asked for (`which="bwd"` in backward: the copy then lives only
    during the dgrad GEMM, as the tensorwise Linear does it).

FSDP2 float8 all-gather (Float8ExpertWeight, the parameter subclass): ONE layout travels, the fprop one
(e4m3 bytes as uint8: gloo cannot all-gather float8), with its compact scales (per expert, or per tile);
after the gather dgrad's layout is a transpose of those bytes, never a second quantization.
  - scale groups inside every shard and even shards (FSDP2's Shard(0) with E % world == 0: whole experts per
    rank; tiles never leave an expert): each rank quantizes its shard alone and the compact scales travel
    beside the data. NO all-reduce.
  - otherwise (fewer experts than ranks or an uneven split, so a shard is empty or padded; Shard(1), which
    splits experts' rows, hence tiles, across ranks): FSDP2 sizes every all-gather input like the padded
    shard (Shard(1) even views the outputs with the shard's shape), so scales cannot ride along. Every rank
    measures the amax of each GLOBAL scale group over its part (zero elsewhere) and the groups' amax join
    the SAME single all-reduce(MAX) that every tensorwise Linear weight's amax uses
    (weights.compute_scales: made by precompute_float8_dynamic_scale_for_fsdp, or by the first all-gather of
    the step). Every rank then holds every group's scale; only the data travels.
Either way the gathered bytes equal quantize-after-gather bit for bit (tests/cpu/test_float8_fsdp.py).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from kernels.float8_cast.reference import abs_amax
from kernels.grouped_gemm.quant import to_mxfp8_blocked
from kernels.mxfp8.reference import _quantize_blocks, e8m0_to_fp32

from .config import E4M3, Float8Config
from .gathered import Float8GatheredWeight, tile_scales_along_k
from .scaling import amax_to_scale, eager_warps, to_float8
from .weights import (
    _OPTIMIZER_GENERATION,
    Float8TrainingWeight,
    ScaleCache,
    compute_scales,
    group_entries,
    precompute_hook_signature,
    warn_stale_precompute,
)

WEIGHT_TILE = 128  # mxfp8 mx128 / mx32 expert weights: one E8M0 scale per 128x128 tile
MX_BLOCK = 32


class ExpertOperands(NamedTuple):
    """What the two GEMM directions read of one 3-D expert weight w [E, N, K] (module docstring)."""
    fwd_data: Optional[Tensor]   # float8_e4m3fn [E, N, K] contiguous
    fwd_scale: Optional[Tensor]  # fp8_rowwise fp32 [E, N] (data = w * scale); mxfp8 uint8 E8M0 [E, N, K/32]
    bwd_data: Optional[Tensor]   # float8_e4m3fn [E, K, N] contiguous
    bwd_scale: Optional[Tensor]  # fp8_rowwise fp32 [E, K]; mxfp8 uint8 E8M0 [E, N/32, K] (view)


def _check(moe_recipe: str, granularity: Optional[str]) -> None:
    if moe_recipe == "fp8_rowwise":
        if granularity is not None:
            raise ValueError(f"expert_weight_operands: granularity={granularity!r} given for moe_recipe "
                             f"'fp8_rowwise', which has none")
    elif moe_recipe == "mxfp8":
        if granularity not in ("mx128", "mx32", "mx32_plain"):
            raise ValueError(f"expert_weight_operands: mxfp8 granularity={granularity!r}; allowed: 'mx128', "
                             f"'mx32', 'mx32_plain'")
    else:
        raise ValueError(f"expert_weight_operands: moe_recipe={moe_recipe!r}; allowed: 'fp8_rowwise', 'mxfp8'")


def _tiled(moe_recipe: str, granularity: Optional[str]) -> bool:
    return moe_recipe == "mxfp8" and granularity in ("mx128", "mx32")


# ------------------------------------------------------------------------------- scale groups and quantization
def group_grid(shape, moe_recipe: str) -> tuple:
    """Shape of the GLOBAL scale-group grid of a weight of `shape` [E, N, K]: [E] (fp8_rowwise) or
    [E, ceil(N/128), ceil(K/128)] (square tiles)."""
    E, N, K = shape
    if moe_recipe == "fp8_rowwise":
        return (E,)
    return (E, -(-N // WEIGHT_TILE), -(-K // WEIGHT_TILE))


def _tile_view(w: Tensor, offset: tuple, full_shape) -> tuple[Tensor, tuple]:
    """Part `w` [e, n, k] of a global [E, N, K] starting at `offset` -> fp32 tiles [e, nt, kt, 128*128] of the
    global tile grid it touches (zero outside w), and the (n_tile0, k_tile0, n_lo, k_lo) placement."""
    e, n, k = w.shape
    _, n0, k0 = offset
    T = WEIGHT_TILE
    tn0, tk0 = n0 // T, k0 // T
    tn1, tk1 = -(-(n0 + n) // T), -(-(k0 + k) // T)
    lo_n, lo_k = n0 - tn0 * T, k0 - tk0 * T
    buf = w.new_zeros((e, (tn1 - tn0) * T, (tk1 - tk0) * T), dtype=torch.float32)
    buf[:, lo_n:lo_n + n, lo_k:lo_k + k] = w
    t = buf.reshape(e, tn1 - tn0, T, tk1 - tk0, T).transpose(2, 3).reshape(e, tn1 - tn0, tk1 - tk0, T * T)
    return t, (tn0, tk0, lo_n, lo_k)


def local_group_amax(w: Tensor, offset: tuple, full_shape, moe_recipe: str) -> Tensor:
    """fp32 amax of every GLOBAL scale group over the part `w` at `offset` (0 for groups w does not touch;
    NaN counted as inf so that a MAX all-reduce carries it)."""
    grid = group_grid(full_shape, moe_recipe)
    out = torch.zeros(grid, dtype=torch.float32, device=w.device)
    if w.numel() == 0:
        return out
    e0 = offset[0]
    if moe_recipe == "fp8_rowwise":
        out[e0:e0 + w.shape[0]] = abs_amax(w.reshape(w.shape[0], -1), 1)
        return out
    t, (tn0, tk0, _, _) = _tile_view(w, offset, full_shape)
    a = abs_amax(t, -1)
    out[e0:e0 + w.shape[0], tn0:tn0 + t.shape[1], tk0:tk0 + t.shape[2]] = a
    return out


def quantize_part(w: Tensor, offset: tuple, full_shape, group_amax: Tensor, moe_recipe: str) -> Tensor:
    """float8 e4m3 bytes of the part `w` [e, n, k] at `offset` of a global [E, N, K] weight, with the scales
    made from the GLOBAL groups' amax `group_amax` (group_grid; inf = a non-finite group)."""
    e0 = offset[0]
    if moe_recipe == "fp8_rowwise":
        scale = amax_to_scale(group_amax[e0:e0 + w.shape[0]], E4M3, round_to_pow2=True)
        return to_float8(w, scale.view(-1, 1, 1), E4M3)
    e, n, k = w.shape
    if w.numel() == 0:
        return torch.empty(w.shape, dtype=E4M3, device=w.device)
    t, (tn0, tk0, lo_n, lo_k) = _tile_view(w, offset, full_shape)
    amax = group_amax[e0:e0 + e, tn0:tn0 + t.shape[1], tk0:tk0 + t.shape[2]]
    data, _ = _quantize_blocks(t, amax, ~torch.isfinite(amax))
    T = WEIGHT_TILE
    data = data.reshape(e, t.shape[1], t.shape[2], T, T).transpose(2, 3).reshape(e, t.shape[1] * T, t.shape[2] * T)
    return data[:, lo_n:lo_n + n, lo_k:lo_k + k].contiguous().view(E4M3)


def compact_scale(group_amax: Tensor, moe_recipe: str) -> Tensor:
    """Compact scales of the groups: fp32 [E] (fp8_rowwise, data = w * scale) or uint8 E8M0 tiles [E, Nt, Kt]."""
    if moe_recipe == "fp8_rowwise":
        return amax_to_scale(group_amax, E4M3, round_to_pow2=True)
    t = group_amax.unsqueeze(-1)
    _, s = _quantize_blocks(t.new_zeros(t.shape), group_amax, ~torch.isfinite(group_amax))
    return s


def operands_from_compact(data: Tensor, scale: Tensor, moe_recipe: str, which: str = "both") -> ExpertOperands:
    """ExpertOperands from the fprop bytes data [E, N, K] and compact scales (compact_scale); the dgrad
    layout is their transpose (square groups)."""
    E, N, K = data.shape
    fwd = which in ("both", "fwd")
    bwd = which in ("both", "bwd")
    fd = fs = bd = bs = None
    if moe_recipe == "fp8_rowwise":
        if fwd:
            fd, fs = data, scale.view(E, 1).expand(E, N).contiguous()
        if bwd:
            bd, bs = data.transpose(1, 2).contiguous(), scale.view(E, 1).expand(E, K).contiguous()
        return ExpertOperands(fd, fs, bd, bs)
    if fwd:
        fd, fs = data, tile_scales_along_k(scale, WEIGHT_TILE, N, K)
    if bwd:
        bd = data.transpose(1, 2).contiguous()
        bs = tile_scales_along_k(scale.transpose(1, 2), WEIGHT_TILE, K, N).transpose(1, 2)
    return ExpertOperands(fd, fs, bd, bs)


def quantize_expert_weight(w: Tensor, moe_recipe: str, granularity: Optional[str],
                           which: str = "both") -> ExpertOperands:
    """Quantize a plain high-precision w [E, N, K] into the operands of contract 1 (no cache)."""
    _check(moe_recipe, granularity)
    if w.dim() != 3:
        raise ValueError(f"expert_weight_operands: expected a 3-D expert weight [E, N, K], got {tuple(w.shape)}")
    w = w.detach()
    if moe_recipe == "mxfp8" and granularity == "mx32_plain":
        fd = fs = bd = bs = None
        if which in ("both", "fwd"):
            fd, fs = to_mxfp8_blocked(w, -1, MX_BLOCK, 1)
        if which in ("both", "bwd"):
            bd, bs_c = to_mxfp8_blocked(w.transpose(1, 2), -1, MX_BLOCK, 1)
            bs = bs_c.transpose(1, 2)
        return ExpertOperands(fd, fs, bd, bs)
    if moe_recipe == "mxfp8":
        for d, name in ((1, "N"), (2, "K")):
            if w.shape[d] % MX_BLOCK:
                raise ValueError(f"expert_weight_operands: mxfp8 expert weight {tuple(w.shape)}: {name} is not a "
                                 f"multiple of {MX_BLOCK}")
    data, compact = quantize_whole(w, moe_recipe)
    return operands_from_compact(data, compact, moe_recipe, which)


def quantize_whole(w: Tensor, moe_recipe: str, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """(fprop bytes [E, N, K], compact scales) of a whole weight (or a shard holding whole scale groups).
    mxfp8 on CUDA ("auto") or backend="triton": the one-read Triton quantizer (kernels/grouped_gemm/
    quant_triton.py, bit-identical to to_mxfp8_blocked); otherwise the plain PyTorch groups of quantize_part."""
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"quantize_whole: backend={backend!r}; allowed: 'auto', 'triton', 'reference'")
    triton = backend == "triton" or (backend == "auto" and w.is_cuda)
    if moe_recipe == "mxfp8" and triton and w.numel():
        from kernels.grouped_gemm.quant_triton import BLOCKWISE_NUM_WARPS, to_mxfp8_blocked_rowcol

        # a fixed launch, not the autotuner's: this runs in FSDP2's all-gather hook, where the autotuner's
        # Python per call is step time (host-bound at 2 GPUs)
        data, scale = to_mxfp8_blocked_rowcol(w, row_block=WEIGHT_TILE, row_tile=WEIGHT_TILE, do_col=False,
                                              num_warps=eager_warps(BLOCKWISE_NUM_WARPS))[:2]
        return data, scale[:, ::WEIGHT_TILE, ::WEIGHT_TILE // MX_BLOCK].contiguous()
    origin = (0, 0, 0)
    amax = local_group_amax(w, origin, w.shape, moe_recipe)
    return quantize_part(w, origin, w.shape, amax, moe_recipe), compact_scale(amax, moe_recipe)


_CACHE_ATTR = "_float8_expert_operands"


def expert_weight_operands(w: Tensor, moe_recipe: str, granularity: Optional[str], *,
                           which: str = "both") -> ExpertOperands:
    """Contract 1: the operands of expert weight `w` (see the module docstring). `which` = "fwd" / "bwd"
    leaves the other direction's fields None (a gathered weight then makes its transpose only in backward)."""
    if which not in ("both", "fwd", "bwd"):
        raise ValueError(f"expert_weight_operands: which={which!r}; allowed: 'both', 'fwd', 'bwd'")
    if isinstance(w, Float8GatheredWeight):
        if (w._recipe, w._granularity) != (moe_recipe, granularity) or w._data.dim() != 3:
            raise ValueError(f"expert_weight_operands: the gathered weight {tuple(w.shape)} was quantized for "
                             f"({w._recipe!r}, {w._granularity!r}), asked for ({moe_recipe!r}, {granularity!r})")
        return operands_from_compact(w._data, w._scale, moe_recipe, which)
    if isinstance(w, Float8TrainingWeight):  # float8-all-gather parameter used without FSDP2
        w = w._tensor
    if torch.compiler.is_compiling():
        return quantize_expert_weight(w, moe_recipe, granularity, which)
    key = (_OPTIMIZER_GENERATION[0], w._version, w.data_ptr(), tuple(w.shape), w.dtype, moe_recipe, granularity)
    hit = getattr(w, _CACHE_ATTR, None)
    if hit is not None and hit[0] == key:
        return hit[1]
    ops = quantize_expert_weight(w, moe_recipe, granularity, "both")
    try:
        setattr(w, _CACHE_ATTR, (key, ops))
    except (AttributeError, RuntimeError):  # a tensor that takes no attributes: no cache
        pass
    return ops


def dequantize_operands(ops: ExpertOperands, moe_recipe: str, dtype=torch.float32) -> Tensor:
    """The fprop operand decoded to `dtype` [E, N, K] (emulation and tests)."""
    if moe_recipe == "fp8_rowwise":
        return (ops.fwd_data.to(torch.float32) / ops.fwd_scale.unsqueeze(-1)).to(dtype)
    E, N, K = ops.fwd_data.shape
    f = e8m0_to_fp32(ops.fwd_scale).repeat_interleave(MX_BLOCK, -1)
    return (ops.fwd_data.to(torch.float32) * f).to(dtype)


# ------------------------------------------------------------------------------------------ FSDP2 float8 all-gather
def _shard_layout(param: Tensor, local: Tensor, world: int, rank: int):
    """(shard dim, offset of `local` in the global tensor) for FSDP2's torch.chunk sharding."""
    placements = getattr(param, "placements", None)
    dim = 0
    if placements:
        from torch.distributed.tensor import Shard
        shards = [p.dim for p in placements if isinstance(p, Shard)]
        dim = shards[-1] if shards else 0
    full = param.shape[dim]
    chunk = math.ceil(full / world) if world else full
    offset = [0, 0, 0]
    offset[dim] = min(rank * chunk, full)
    return dim, tuple(offset)


def _shard_world_rank(param: Tensor) -> tuple[int, int]:
    """(ranks, this rank) of the mesh dim that shards `param` (HSDP: the shard dim, not the whole mesh)."""
    from torch.distributed.tensor import Shard
    mesh = param.device_mesh
    for i, p in enumerate(param.placements):
        if isinstance(p, Shard):
            return mesh.size(i), mesh.get_local_rank(i)
    return 1, 0


def scales_travel(shape, shard_dim: int, world: int) -> bool:
    """True when every rank's shard holds whole scale groups and FSDP2 lets the compact scales ride the
    all-gather (Shard(0), whole experts, even split); False: the groups' amax join the one all-reduce."""
    return shard_dim == 0 and shape[0] % world == 0


class Float8ExpertWeight(Float8TrainingWeight):
    """High-precision 3-D expert weight (w13 / w2 of a float8 expert module) whose FSDP2 all-gather moves
    float8 bytes (module docstring). `_attr` is the parameter's name on its module (where its scale cache
    lives)."""

    def __init__(self, tensor: Tensor, config: Float8Config, attr: str = ""):
        super().__init__(tensor, config)
        self._attr = attr

    def _rewrap(self, tensor: Tensor) -> "Float8ExpertWeight":
        return Float8ExpertWeight(tensor, self._config, self._attr)

    def __repr__(self):
        c = self._config
        return f"Float8ExpertWeight({c.moe_recipe_name}/{c.moe_granularity}, {self._attr}, {self._tensor!r})"

    def __tensor_flatten__(self):
        return ["_tensor"], {"config": self._config, "attr": self._attr}

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return Float8ExpertWeight(inner_tensors["_tensor"], meta["config"], meta["attr"])

    # ---------------------------------------------------------------------------- the one AMAX all-reduce
    def needs_amax_all_reduce(self, param: Tensor) -> bool:
        if getattr(param, "device_mesh", None) is None:
            return False
        world, _ = _shard_world_rank(param)
        dim, _ = _shard_layout(param, self._tensor, world, 0)
        return not scales_travel(param.shape, dim, world)

    def local_amax(self, param: Tensor) -> Tensor:
        world, rank = _shard_world_rank(param)
        _, offset = _shard_layout(param, self._tensor, world, rank)
        return local_group_amax(self._tensor, offset, param.shape, self._config.moe_recipe_name).reshape(-1)

    def store_global_amax(self, module, param: Tensor, amax: Tensor, generation: int) -> None:
        grid = group_grid(param.shape, self._config.moe_recipe_name)
        caches = module.__dict__.setdefault("_float8_expert_amax", {})
        caches[self._attr] = ScaleCache(amax.reshape(grid).clone(), generation)

    # ------------------------------------------------------------------------------------------ FSDP2
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        recipe = self._config.moe_recipe_name
        world, rank = mesh.size(), mesh.get_local_rank()
        param = getattr(module, self._attr)
        dim, offset = _shard_layout(param, self._tensor, world, rank)
        shape = tuple(outer_size)
        padded = list(self._tensor.shape)
        padded[dim] = math.ceil(shape[dim] / world)
        if scales_travel(shape, dim, world):
            batch = getattr(module, "_float8_cast_batch", None)
            got = (batch.take(module, self._tensor, _OPTIMIZER_GENERATION[0], attr=self._attr)
                   if batch is not None else None)
            # the block's one launch (weights.batch_weight_casts: mx128 Linear and expert weights together)
            data, scale = got if got is not None else quantize_whole(self._tensor, recipe)
            if world == 1:
                # FSDP2's one-rank path (torch 2.11-2.14, FSDPParamGroup.wait_for_unshard) copies only the FIRST
                # all-gather input into the unsharded parameter: the whole scale rides in the metadata instead.
                return (data.view(torch.uint8),), (shape, scale)
            if recipe == "fp8_rowwise":
                scale = scale.view(-1, 1).view(torch.uint8)  # [E/world, 4] bytes: one flat uint8 all-gather
            return (data.view(torch.uint8), scale), (shape, None)
        cache = getattr(module, "_float8_expert_amax", {}).get(self._attr)
        if cache is None or not cache.valid():
            # same decision on every rank (it depends only on the optimizer generation): the all-reduce
            # below cannot deadlock. It computes every float8 weight of the model at once.
            warn_stale_precompute(self._config)
            compute_scales(group_entries(module))
            cache = module._float8_expert_amax[self._attr]
        data = quantize_part(self._tensor, offset, shape, cache.scale, recipe)
        u8 = data.view(torch.uint8)
        if list(u8.shape) != padded:  # uneven Shard(0): FSDP2 wants every rank's input padded
            full = u8.new_zeros(padded)
            full[:u8.shape[0]] = u8
            u8 = full
        return (u8,), (shape, compact_scale(cache.scale, recipe))

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype: torch.dtype, *,
                             out: Optional[Tensor] = None):
        recipe, gran = self._config.moe_recipe_name, self._config.moe_granularity
        shape, scale = metadata
        data = all_gather_outputs[0]
        E, N, K = shape
        data = data.view(-1, N, K).view(E4M3)
        if scale is None:
            scale = all_gather_outputs[1]
            scale = scale.reshape(-1, 4).view(torch.float32).reshape(-1) if recipe == "fp8_rowwise" else scale
        if out is not None:
            if not isinstance(out, Float8GatheredWeight):
                raise RuntimeError(f"float8 expert all-gather: FSDP2 handed back {type(out).__name__}, expected the "
                                   f"Float8GatheredWeight built by the first all-gather")
            out._scale = scale[:E]  # data: FSDP2 re-filled the same storage
            return
        return (Float8GatheredWeight(data, scale, recipe, gran, param_dtype, WEIGHT_TILE),
                tuple(all_gather_outputs))


precompute_hook_signature(Float8ExpertWeight)
