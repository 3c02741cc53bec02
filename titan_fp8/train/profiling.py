"""[profiling]: torch.profiler over one training step every `profile_freq` steps (torchtitan's keys).

Each profiled step writes, under <dump_folder>/<save_traces_folder>/iteration_<step>/:
  rank<r>_trace.json   the Chrome trace (chrome://tracing, Perfetto)
  rank<r>_top.txt      the step's kernels by GPU time and host ops by self CPU time (a first look, no viewer)
Profiling slows the step it records; the metrics logger leaves that step out of the throughput medians.
"""
from __future__ import annotations

import os

import torch

TOP_ROWS = 40


def _top_table(prof, device_type: str) -> str:
    rows = []
    if device_type == "cuda":
        rows.append(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=TOP_ROWS, max_name_column_width=90))
    rows.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=TOP_ROWS, max_name_column_width=90))
    return "\n\n".join(rows)


class StepProfiler:
    """begin(n) / end(n) around step n: records it when profiling is on and n is a multiple of profile_freq."""

    def __init__(self, cfg, dump_folder: str, rank: int, device_type: str, log=print):
        self.enabled = cfg.enable_profiling
        self.freq = cfg.profile_freq
        self.folder = os.path.join(dump_folder, cfg.save_traces_folder)
        self.rank, self.device_type, self.log = rank, device_type, log
        self._prof = None

    def wants(self, step: int) -> bool:
        return self.enabled and step % self.freq == 0

    def begin(self, step: int) -> None:
        if not self.wants(step):
            return
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device_type == "cuda" else [])
        self._prof = profile(activities=acts)
        self._prof.start()

    def end(self, step: int) -> None:
        if self._prof is None:
            return
        if self.device_type == "cuda":
            torch.cuda.synchronize()
        prof, self._prof = self._prof, None
        prof.stop()
        out = os.path.join(self.folder, f"iteration_{step}")
        os.makedirs(out, exist_ok=True)
        prof.export_chrome_trace(os.path.join(out, f"rank{self.rank}_trace.json"))
        with open(os.path.join(out, f"rank{self.rank}_top.txt"), "w") as f:
            f.write(_top_table(prof, self.device_type) + "\n")
        self.log(f"profiling: step {step} -> {out}")
