"""Float8GatheredWeight: the unsharded weight that FSDP2's float8 all-gather builds, so that the GEMMs read the
gathered float8 bytes and never quantize a weight again after its all-gather.

One class for both weight kinds whose float8 bytes travel with compact scales:
  Linear weights [N, K], recipe "mxfp8" (weights.Float8TrainingWeight's hooks; linear.py's GEMMs read them)
  routed-expert weights [E, N, K] (expert_weights.Float8ExpertWeight's hooks; experts.py reads them through
    expert_weight_operands)
Operands:
  _data   float8_e4m3fn [..., N, K] contiguous: the bytes that travelled (the forward GEMM's layout)
  _scale  mxfp8: uint8 E8M0 [..., ceil(N/tile), ceil(K/tile)], one byte per tile x tile square
          (w ~ data * 2^(byte - 127), kernels.mxfp8's format; tile 128 for experts and "mx32" / "mx128" Linears, 32 for
          "mx32_tile32" Linears);
          fp8_rowwise (experts only): fp32 [E], one scale per expert (data = w * scale, scaling.py's convention)
On the outside it has the parameter's dtype and shape; any op other than the few FSDP2 makes on it sees the
decoded weight, and the weight gradient comes back as a plain tensor of that dtype (what FSDP2 reduces).

Imports only torch and kernels (never weights.py / linear.py / precompute.py), so every float8 module can
import it without an import cycle.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from kernels.mxfp8 import BLOCK, from_mxfp8


def tile_scales_along_k(scale: Tensor, tile: int, n: int, k: int) -> Tensor:
    """Compact E8M0 tile scales [..., ceil(n/tile), ceil(k/tile)] -> kernels.mxfp8's scale layout along K,
    [..., n, k/32]: each tile's byte written into every 1x32 block it covers (tile a multiple of 32)."""
    return (scale.repeat_interleave(tile, -2)[..., :n, :]
            .repeat_interleave(tile // BLOCK, -1)[..., :k // BLOCK].contiguous())


class Float8GatheredWeight(torch.Tensor):
    """Gathered float8 weight: `_data` + compact `_scale` (module docstring), the parameter's dtype outside.
    `recipe` ("mxfp8" / "fp8_rowwise") and `granularity` (e.g. "mx128", "mx32"; None for fp8_rowwise) say what
    the bytes were quantized for, `tile` the side of an mxfp8 scale's square."""

    @staticmethod
    def __new__(cls, data: Tensor, scale: Tensor, recipe: str, granularity, dtype: torch.dtype, tile: int):
        return torch.Tensor._make_wrapper_subclass(cls, data.size(), strides=data.stride(), dtype=dtype,
                                                   device=data.device, requires_grad=False)

    def __init__(self, data, scale, recipe, granularity, dtype, tile):
        self._data, self._scale = data, scale
        self._recipe, self._granularity, self._tile = recipe, granularity, tile

    def __repr__(self):
        return (f"Float8GatheredWeight({self._recipe}/{self._granularity}, tile={self._tile}, "
                f"shape={tuple(self.shape)}, dtype={self.dtype})")

    def scale_along_k(self) -> Tensor:
        """mxfp8: the tile scales in kernels.mxfp8's layout along K, [..., N, K/32]."""
        n, k = self._data.shape[-2:]
        return tile_scales_along_k(self._scale, self._tile, n, k)

    def dequantize(self) -> Tensor:
        """The decoded weight in the parameter dtype (kernels.mxfp8.from_mxfp8 for mxfp8)."""
        if self._recipe == "fp8_rowwise":
            return (self._data.to(torch.float32) / self._scale.view(-1, 1, 1)).to(self.dtype)
        return from_mxfp8(self._data, self.scale_along_k(), -1, self.dtype)

    def _same_kind(self, data: Tensor, scale: Tensor) -> "Float8GatheredWeight":
        return Float8GatheredWeight(data, scale, self._recipe, self._granularity, self.dtype, self._tile)

    def __tensor_flatten__(self):
        return ["_data", "_scale"], (self._recipe, self._granularity, self.dtype, self._tile)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        recipe, gran, dtype, tile = meta
        return Float8GatheredWeight(inner["_data"], inner["_scale"], recipe, gran, dtype, tile)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func in (aten.detach.default, aten.alias.default):
            t = args[0]
            return t._same_kind(t._data, t._scale)
        if func is aten.as_strided.default:
            # FSDP2 narrows the (padded) gathered tensor to the parameter's shape: whole experts off the end
            # (3-D), whole tiles of rows (2-D; FSDP2's even Linear shards make this the identity)
            t, size, stride = args[0], list(args[1]), list(args[2])
            offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
            rows_per_scale = 1 if t._data.dim() == 3 else t._tile
            if ((offset or 0) != 0 or size[1:] != list(t.shape[1:]) or size[0] % rows_per_scale
                    or stride != list(t._data[:size[0]].stride())):
                raise NotImplementedError(f"Float8GatheredWeight: as_strided{tuple(size), tuple(stride)} of "
                                          f"{tuple(t.shape)} is not a narrowing to whole experts / tiles")
            return t._same_kind(t._data[:size[0]], t._scale[:size[0] // rows_per_scale])
        args, kwargs = pytree.tree_map_only(cls, lambda t: t.dequantize(), (args, kwargs))
        return func(*args, **kwargs)
