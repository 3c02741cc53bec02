"""StepCheck: one step's check on its way from the GPU to the host.

The check is ONE all-reduced vector, [loss non-finite on rank r for every r, loss, aux loss, grad norm], summed
over ranks. `found_inf` (0-dim, on the device) is its verdict for the GPU: 1.0 when some rank's loss or the
global gradient norm is not finite. The host copy starts at once (pinned memory, no wait) and `read()` waits
for it: right away ([training] nonfinite_check = "before_optimizer") or a step later ("deferred"), while the
GPU, told by found_inf, has already skipped the failing step's update itself.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import torch


@dataclasses.dataclass
class StepCheck:
    step: int
    world: int
    lr: float
    data_wait: float  # seconds this step's host waited for its batch
    profiled: bool
    found_inf: torch.Tensor
    _host: torch.Tensor
    _ready: Optional[torch.cuda.Event]
    values: Optional[list] = None
    sync_wait: float = 0.0  # seconds the host waited for these values (the GPU was behind)
    seconds: Optional[float] = None  # the step's time (the trainer sets it: issue-complete to issue-complete)

    @classmethod
    def start(cls, step: int, stats: torch.Tensor, world: int, lr: float, data_wait: float,
              profiled: bool = False) -> "StepCheck":
        """`stats`: the all-reduced check vector. Starts its copy to the host; waits for nothing."""
        found_inf = ((stats[:world].sum() > 0) | ~torch.isfinite(stats[world + 2])).float()
        ready = None
        if stats.is_cuda:
            host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
            host.copy_(stats, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host = stats
        return cls(step, world, lr, data_wait, profiled, found_inf, host, ready)

    def read(self) -> None:
        """Wait until the values are on the host (once); sync_wait: how long that took."""
        if self.values is None:
            t0 = time.perf_counter()
            if self._ready is not None:
                self._ready.synchronize()
            self.values = self._host.tolist()
            self.sync_wait = time.perf_counter() - t0

    @property
    def bad_ranks(self) -> list[int]:
        return [r for r in range(self.world) if self.values[r] != 0]

    @property
    def loss(self) -> float:
        return self.values[self.world] / self.world

    @property
    def aux_loss(self) -> float:
        return self.values[self.world + 1] / self.world

    @property
    def grad_norm(self) -> float:
        return self.values[self.world + 2] / self.world

    @property
    def nonfinite(self) -> bool:
        return bool(self.bad_ranks) or not math.isfinite(self.grad_norm)

    def describe(self) -> str:
        return (f"step {self.step}: non-finite " + (f"loss on rank(s) {self.bad_ranks}, " if self.bad_ranks else "")
                + f"grad_norm {self.grad_norm}, mean loss {self.loss}")
