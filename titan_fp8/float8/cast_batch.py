"""TensorwiseCastBatch: the tensorwise float8 weights of one FSDP unit (a block), cast for the all-gather by ONE
kernel launch instead of one per weight.

FSDP2 calls `fsdp_pre_all_gather` once per parameter, so a llama_moe block's 7 tensorwise weights cost 7 Python
Triton launches per all-gather, twice a step (forward, and backward's regather): the largest part of the host time
the float8 all-gather adds (a cProfile of the trainer on an H100, session 10: benchmarks/host_profile.py). At 2
GPUs a float8 step is host-bound, so that time is step time. Here the FIRST hook of the unit casts every member
(kernels.float8_cast.to_float8_tensorwise_many) and leaves the others their bytes; their hooks, a few
microseconds later in the same FSDP2 call, take them.

A member's bytes are taken only if they were cast from the same storage, at the same version, in the same
optimizer generation as the shard the hook is asked for (the weight and its scale are then those bytes'); anything
else casts again. Same bits as one cast per weight (tests/cpu/test_float8_fsdp.py).

Imports only torch and kernels (weights.py builds and calls it).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from kernels.float8_cast import to_float8_tensorwise_many


class TensorwiseCastBatch:
    """Members: the modules owning the unit's tensorwise weights (`module.weight`, scale cache on the module).
    `shard_of(module)` gives a member's plain local shard; `scale_of(module)` its valid ScaleCache or None."""

    def __init__(self, modules: list, shard_of: Callable[[object], Optional[Tensor]],
                 scale_of: Callable[[object], object]):
        self.modules = list(modules)
        self._index = {id(m): i for i, m in enumerate(self.modules)}
        self._shard_of, self._scale_of = shard_of, scale_of
        self._pending: list = [None] * len(self.modules)
        self._caches: tuple = ()
        self._scales: Optional[Tensor] = None

    def __len__(self) -> int:
        return len(self.modules)

    def take(self, module, shard: Tensor, generation: int, float8_dtype: torch.dtype) -> Optional[Tensor]:
        """The float8 bytes of `module`'s shard (`shard`), cast with its current scale: left by an earlier
        member's call, or cast now together with every member. None: not a member, or the members cannot be
        cast together right now (the caller casts this one alone)."""
        i = self._index.get(id(module))
        if i is None:
            return None
        key = (generation, shard.data_ptr(), shard._version, float8_dtype)
        left = self._pending[i]
        self._pending[i] = None
        if left is not None and left[0] == key:
            return left[1]
        shards = [self._shard_of(m) for m in self.modules]
        caches = tuple(self._scale_of(m) for m in self.modules)
        if (any(s is None or s.numel() == 0 for s in shards) or any(c is None for c in caches)
                or shards[i].data_ptr() != shard.data_ptr() or len({(s.dtype, s.device) for s in shards}) != 1):
            return None
        if len(caches) != len(self._caches) or any(a is not b for a, b in zip(caches, self._caches)):
            # a new set of scales (once per optimizer step): one small stack, kept until the next
            self._caches, self._scales = caches, torch.stack([c.scale.reshape(()) for c in caches])
        outs = to_float8_tensorwise_many(shards, self._scales, float8_dtype)
        for j, (s, out) in enumerate(zip(shards, outs)):
            if j != i:
                self._pending[j] = ((generation, s.data_ptr(), s._version, float8_dtype), out)
        return outs[i]
