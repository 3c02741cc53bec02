"""WeightCastBatch: the float8-all-gather weights of one FSDP unit (a block), cast or quantized for the
all-gather by ONE kernel launch instead of one per weight.

FSDP2 calls `fsdp_pre_all_gather` once per parameter, so a llama_moe block's 7 tensorwise Linear weights cost 7
Python Triton launches per all-gather, twice a step (forward, and backward's regather): the largest part of the
host time the float8 all-gather added (a cProfile of the trainer on an H100, session 10:
benchmarks/host_profile.py), and at 2 GPUs a float8 step is host-bound, so that time is step time. Here the FIRST
hook of the unit casts every member of its batch; the other members' hooks, a few microseconds later in the same
FSDP2 call, take their results. The results are kept: backward's regather of the same shards in the same
optimizer generation takes them too, so each block's weights are cast once per step, not twice (on 2 H200s the
mx128 expert quantization was 15 launches and 6.7 ms of a 147 ms step, half of it the regather's). The price is
one float8 copy of the batched shards kept between the casts (1 byte per shard element, plus scales). Two kinds of
batch (weights.batch_weight_casts builds them):
  tensorwise  the Linear weights' e4m3 casts, each with its own replicated scale
              (kernels.float8_cast.to_float8_tensorwise_many)
  mx128       MXFP8 weights with one E8M0 scale per 128x128 tile: mx128 Linear weights and mx128 expert weights
              (kernels.grouped_gemm.quant_triton.to_mxfp8_tiles_many)

A member's result is taken only if it was made from the same storage, at the same version, in the same optimizer
generation as the shard the hook is asked for; anything else casts all members again. Same bits as one cast per weight
(tests/cpu/test_float8_fsdp.py).

Imports only torch (weights.py builds and calls it).
"""
from __future__ import annotations

from typing import Callable, Optional

from torch import Tensor


def member_key(module, attr: str = "weight") -> tuple:
    """A member: (the module owning the parameter, the parameter's name)."""
    return id(module), attr


class WeightCastBatch:
    """`members`: (module, attr) of every weight in the batch. `shard_of(module, attr)` gives a member's plain
    local shard (None if it has none now); `cast_all(members, shards)` casts all of them with one launch and
    returns one result per member, or None when they cannot be cast together now."""

    def __init__(self, kind: str, members: list, shard_of: Callable, cast_all: Callable):
        self.kind = kind
        self.members = list(members)
        self._index = {member_key(m, a): i for i, (m, a) in enumerate(self.members)}
        self._shard_of, self._cast_all = shard_of, cast_all
        self._results: list = [None] * len(self.members)  # per member: (generation, data_ptr, version), result

    def __len__(self) -> int:
        return len(self.members)

    def take(self, module, shard: Tensor, generation: int, attr: str = "weight"):
        """The result for `module.<attr>`'s shard `shard`: left by an earlier member's call, or made now together
        with every member's. None: not a member, or the members cannot be cast together right now (the caller
        casts this one alone)."""
        i = self._index.get(member_key(module, attr))
        if i is None:
            return None
        key = (generation, shard.data_ptr(), shard._version)
        kept = self._results[i]
        if kept is not None and kept[0] == key:
            return kept[1]
        shards = [self._shard_of(m, a) for m, a in self.members]
        if (any(s is None or s.numel() == 0 for s in shards) or shards[i].data_ptr() != shard.data_ptr()
                or len({(s.dtype, s.device) for s in shards}) != 1):
            return None
        outs = self._cast_all(self.members, shards)
        if outs is None:
            return None
        self._results = [((generation, s.data_ptr(), s._version), out) for s, out in zip(shards, outs)]
        return outs[i]
