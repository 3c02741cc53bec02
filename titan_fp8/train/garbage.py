"""[training] gc_freq: Python's cyclic garbage collector at fixed steps (torchtitan's key and behaviour).

Left automatic, the collector runs whenever enough container objects were allocated since its last pass, so a
pass over the older generations (the modules, compiled graphs, optimizer state, tensor subclass wrappers of the
whole process) lands inside some training step at random and stalls the host while the GPU waits. With
gc_freq > 0 automatic collection is off and a generation-1 collection runs before every gc_freq-th step, at a
known place; gc_freq = 0 leaves Python's automatic collector on.
"""
from __future__ import annotations

import gc


class GarbageCollection:
    def __init__(self, gc_freq: int):
        self.freq = gc_freq
        if gc_freq > 0:
            gc.disable()
            gc.collect(1)

    def step(self, step: int) -> bool:
        """Before step `step`; True when it collected."""
        if self.freq > 0 and step > 1 and step % self.freq == 0:
            gc.collect(1)
            return True
        return False

    def close(self) -> None:
        if self.freq > 0:
            gc.enable()
