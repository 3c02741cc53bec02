"""GpuLag: how far the GPU trails the host at the start of each step (and of its backward and optimizer step).

At each mark the host records a timing event and notes its own clock. Once the GPU has passed that event, the
event's time on the GPU's clock against the host's note gives the lag: the GPU work still queued ahead of it.

- lag near 0 (tens of microseconds, the launch latency): the GPU was idle when the host got there. The host
  paced that part of the step (host-bound).
- lag of milliseconds, up to about one step: the GPU had work queued. The GPU paced it.

Why this and not the step's sync wait: with the deferred check the host may block inside a kernel launch once the
launch queue is full, so a GPU-bound step can show no sync wait at all (session 34: bf16 read 0% sync wait with
~140 ms of lag at every step).

The two clocks are tied once, at the first mark: the host synchronizes, so the GPU reaches the reference event
when the host records it. Reading never waits: marks the GPU has not passed yet stay pending for a later read.
"""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Optional

import torch

PHASES = ("step", "backward", "optimizer")  # where the trainer marks: the step's start, loss.backward(), the update
# A step is host-paced when the GPU had nothing queued as the host began its backward: the GPU ran the forward as
# fast as the host issued it. (The step-start lag is no such test: it holds the previous step's optimizer update,
# ~14 ms of GPU work at llama_moe on 2 H100s that the host issues in well under a millisecond.)
HOST_PACED_MS = 1.0


class GpuLag:
    def __init__(self, device: torch.device, clock=time.perf_counter, event_factory=None):
        # clock / event_factory: injectable for tests (the default events are CUDA timing events)
        self.enabled = device.type == "cuda" or event_factory is not None
        self._clock = clock
        self._event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._ref = None
        self._t_ref = 0.0
        self._marks: dict[tuple[int, str], tuple[float, object]] = {}
        self.lags_ms: dict[int, dict[str, float]] = {}  # step -> phase -> lag
        self.host_s: dict[int, dict[str, float]] = {}  # step -> phase -> host seconds since the reference
        self.wall_s: dict[int, float] = {}  # epoch time of each step's start: lines steps up with GPU clock logs

    def mark(self, step: int, phase: str = "step") -> None:
        """Call as the host reaches `phase` of `step` (before that phase's first launch)."""
        if not self.enabled:
            return
        if phase not in PHASES:
            raise ValueError(f"GpuLag.mark: phase {phase!r} is not one of {PHASES}")
        if self._ref is None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # once: the GPU is idle, so it reaches the reference at the host's time
            self._t_ref = self._clock()
            self._ref = self._event()
            self._ref.record()
        t = self._clock() - self._t_ref  # before the record: the GPU cannot pass the event earlier than this
        event = self._event()
        event.record()
        self._marks[(step, phase)] = (t, event)
        if phase == "step":
            self.wall_s[step] = time.time()

    def read(self, step: int, phase: str = "step") -> Optional[float]:
        """Collect the lag of every mark the GPU has passed; return `step`'s lag at `phase` in ms, or None when
        it was not marked or the GPU has not passed it yet."""
        for key, (host_s, event) in list(self._marks.items()):
            if event.query():
                del self._marks[key]
                self.lags_ms.setdefault(key[0], {})[key[1]] = self._ref.elapsed_time(event) - 1e3 * host_s
                self.host_s.setdefault(key[0], {})[key[1]] = host_s
        return self.lags_ms.get(step, {}).get(phase)

    def save(self, folder: str, rank: int) -> Optional[str]:
        """Every lag this rank collected, as gpu_lag_rank<r>.json in `folder` (each rank has its own: the slower
        rank's host paces both through the collectives). host_ms: the host's time from the step's start to each
        phase (its issue time for the phases before)."""
        if not self.enabled or not self.lags_ms:
            return None
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"gpu_lag_rank{rank}.json")
        steps = sorted(s for s in self.lags_ms if "step" in self.lags_ms[s])

        def col(table, phase, scale=1.0):
            return [round(scale * (table[s][phase] - (self.host_s[s]["step"] if table is self.host_s else 0.0)), 3)
                    if phase in table.get(s, {}) else None for s in steps]

        with open(path, "w") as f:
            json.dump({"rank": rank, "steps": steps,
                       "lag_ms": col(self.lags_ms, "step"),
                       "phase_lag_ms": {p: col(self.lags_ms, p) for p in PHASES},
                       "host_ms": {p: col(self.host_s, p, 1e3) for p in PHASES},
                       "wall_s": [round(self.wall_s.get(s, 0.0), 3) for s in steps]}, f)
        return path


def backward_lags_over_ranks(folder: str, ranks: Optional[int] = None) -> dict[int, float]:
    """{step: the smallest backward lag over the ranks} from the gpu_lag_rank*.json files GpuLag.save wrote into
    `folder`: the rank whose host is slowest paces every rank through the collectives, so a step is host-paced when
    ANY rank's GPU sat idle as its host began the backward (session 39, two H200s: rank 1's host paced every step of a
    run whose rank 0 read 100+ ms of lag). A step counts only when every rank's file has its lag; {} without files.
    ranks: read exactly gpu_lag_rank0..ranks-1.json ({} if one is missing), not whatever an earlier run with more
    ranks left in the folder."""
    if ranks is None:
        paths = sorted(glob.glob(os.path.join(folder, "gpu_lag_rank*.json")))
    else:
        paths = [os.path.join(folder, f"gpu_lag_rank{r}.json") for r in range(ranks)]
        if not all(os.path.isfile(p) for p in paths):
            return {}
    per_rank = []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        lags = d.get("phase_lag_ms", {}).get("backward") or []
        per_rank.append({s: v for s, v in zip(d.get("steps", []), lags) if isinstance(v, (int, float))})
    if not per_rank:
        return {}
    steps = set.intersection(*(set(r) for r in per_rank))
    return {s: min(r[s] for r in per_rank) for s in sorted(steps)}
