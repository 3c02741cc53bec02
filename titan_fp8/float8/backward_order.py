"""Ordering backward work under torch.compile without data movement.

Inductor schedules a node as soon as its inputs exist. Work in backward that reads only tensors saved in forward
(a recast of a saved activation, a re-made float8 copy) then lands at backward's start, and its output stays alive
until the GEMM that reads it: on top of backward's peak (benchmarks/results/issue9_s17/). Adding a zero computed
from a tensor that backward makes ties such work to that tensor: a real data dependency, so the partitioner and
the scheduler keep it after it, and it costs a one-element read fused into a kernel that runs anyway."""
from __future__ import annotations

import torch


def zero_from(t: torch.Tensor) -> torch.Tensor:
    """A uint8 0 [1, 1] computed from t [R, C]: NaN != NaN is the only way to 1, and & 0 clears it (no dtype view of
    t, whose layout inductor may leave open). float8 t is compared in fp32 (float8 has no `!=` on every device)."""
    t00 = t[:1, :1]
    if t00.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t00 = t00.float()
    return (t00 != t00).to(torch.uint8) & 0
