"""Per-log-step metrics: console progress line, <dump_folder>/metrics.jsonl, TensorBoard when enabled.

Throughput is measured on the host between log steps; the trainer's single per-step sync (the non-finite
check) keeps host time in step with the device, so no extra synchronisation is needed here.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Optional

import torch

from titan_fp8.train.gpu_lag import HOST_PACED_MS

# bf16 dense peak (no sparsity), TFLOP/s. MFU is always measured against this, also when float8 is on.
PEAK_BF16_TFLOPS = {
    "H200": 989.5,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.5,  # SXM
    "GH200": 989.5,
    "A100": 312.0,
}


def detect_peak_tflops(device: torch.device) -> tuple[str, Optional[float]]:
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_TFLOPS.items():  # ordered: specific names before their prefixes
        if key in name:
            return name, peak
    return name, None


class MetricsLogger:
    def __init__(self, dump_folder: str, rank: int, device: torch.device, flops_per_token: float,
                 tokens_per_step_per_gpu: int, enable_tensorboard: bool, log=print,
                 resumed_at_step: Optional[int] = None):
        """metrics.jsonl starts empty for a new run. A run resumed from the checkpoint of step N keeps the
        records of steps <= N and appends: the steps a killed run logged after N are redone, so one file holds
        one history, one record per step."""
        self.rank = rank
        self.device = device
        self.flops_per_token = flops_per_token
        self.tokens_per_step = tokens_per_step_per_gpu
        self.log = log
        self.device_name, self.peak_tflops = detect_peak_tflops(device)
        self.path = os.path.join(dump_folder, "metrics.jsonl")
        self.records: list[dict] = []
        self._tb = None
        if rank == 0:
            os.makedirs(dump_folder, exist_ok=True)
            _start_file(self.path, resumed_at_step)
            if enable_tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as e:
                    raise RuntimeError(f"[metrics] enable_tensorboard = true but tensorboard is missing ({e})")
                self._tb = SummaryWriter(os.path.join(dump_folder, "tb"))
        self.restart_window()

    def header(self) -> str:
        peak = (f"MFU vs bf16 dense peak {self.peak_tflops} TFLOP/s of {self.device_name}"
                if self.peak_tflops else f"MFU not reported (no bf16 peak known for {self.device_name})")
        return f"metrics: {peak}; FLOPs/token = {self.flops_per_token:.4g} (active parameters)"

    def step_done(self, data_wait_s: float, sync_wait_s: float = 0.0, seconds: Optional[float] = None) -> None:
        """sync_wait_s: how long the host waited for the GPU at the step's one sync. Near 0 the host was the
        bottleneck (it issued work no faster than the GPU ran it); large, the GPU was. `seconds`: the step's time
        as the trainer measured it; when the steps of a window give theirs, the window's time is their sum (the
        host may read a step's check a step later, so the wall time between two records is not one step's)."""
        self._window_steps += 1
        if seconds is not None:
            self._window_seconds += seconds
        self._window_data_wait += data_wait_s
        self._window_sync_wait += sync_wait_s

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` of host time (a checkpoint save) out of the current window."""
        self._window_start += seconds

    def restart_window(self) -> None:
        self._window_start = time.perf_counter()
        self._window_steps = 0
        self._window_seconds = 0.0
        self._window_data_wait = 0.0
        self._window_sync_wait = 0.0

    def emit(self, step: int, total_steps: int, loss: float, grad_norm: float, lr: float,
             extra: Optional[dict] = None) -> dict:
        elapsed = self._window_seconds or max(time.perf_counter() - self._window_start, 1e-9)
        steps = max(self._window_steps, 1)
        tps = self.tokens_per_step * steps / elapsed
        tflops = tps * self.flops_per_token / 1e12
        mfu = tflops / self.peak_tflops if self.peak_tflops else None
        if self._window_steps == 0:  # only a profiled step since the last record: no throughput to report
            extra = {**(extra or {}), "profiled": True}
            tps = tflops = mfu = None
        mem = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None
        mem_reserved = torch.cuda.max_memory_reserved(self.device) / 2**30 if self.device.type == "cuda" else None
        rec = {
            "step": step,
            "loss": _num(loss),
            "grad_norm": _num(grad_norm),
            "lr": lr,
            "tps_per_gpu": tps,
            "tflops_per_gpu": tflops,
            "mfu": mfu,
            "memory_gib": mem,
            "memory_reserved_gib": mem_reserved,
            "data_wait_share": self._window_data_wait / elapsed,
            "sync_wait_share": self._window_sync_wait / elapsed,
            "step_time_s": elapsed / steps,
            "window_steps": steps,
        }
        if extra:
            rec.update({k: _num(v) if isinstance(v, float) else v for k, v in extra.items()})
        self.records.append(rec)
        if self.rank == 0:
            mfu_s = f"{100 * mfu:5.1f}%" if mfu is not None else "n/a"
            tps_s = (f"tps/gpu {tps:9.0f}  tflops/gpu {tflops:7.2f}" if tps is not None
                     else "tps/gpu  (profiled step, not timed)")
            mem_s = f"{mem:.2f}GiB" if mem is not None else "n/a"
            lag = rec.get("gpu_lag_ms")
            lag_s = f"  gpu_lag {lag:.1f}ms" if isinstance(lag, float) else ""
            val_s = f"  val_loss {extra['val_loss']:.4f}" if extra and "val_loss" in extra else ""
            self.log(f"step {step:>5}/{total_steps}  loss {loss:8.4f}  grad_norm {grad_norm:8.4f}  lr {lr:.3e}  "
                     f"{tps_s}  mfu {mfu_s}  mem {mem_s}  "
                     f"data_wait {100 * rec['data_wait_share']:.1f}%  sync_wait {100 * rec['sync_wait_share']:.0f}%"
                     f"{lag_s}{val_s}")
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if self._tb is not None:
                for k, v in rec.items():
                    if k != "step" and isinstance(v, (int, float)):
                        self._tb.add_scalar(k, v, step)
        self.restart_window()
        return rec

    def summary(self, skip_first: int, backward_lags: Optional[dict] = None) -> dict:
        """Averages over the steps after `skip_first`; backward_lags: {step: smallest backward lag over the ranks}
        for host_paced_share (else rank 0's own lags)."""
        """Averages over logged steps after `skip_first` (warm-up and compilation excluded)."""
        recs = [r for r in self.records if r["step"] > skip_first and "skipped" not in r and not r.get("profiled")
                ] or self.records[-1:]
        out = {"steps_averaged": [recs[0]["step"] - recs[0]["window_steps"] + 1, recs[-1]["step"]] if recs else None}
        steps = sum(r["window_steps"] for r in recs)
        seconds = sum(r["step_time_s"] * r["window_steps"] for r in recs)
        out["step_time_s"] = seconds / steps if steps else None
        out["tps_per_gpu"] = self.tokens_per_step * steps / seconds if seconds else None
        out["tflops_per_gpu"] = out["tps_per_gpu"] * self.flops_per_token / 1e12 if seconds else None
        out["mfu"] = out["tflops_per_gpu"] / self.peak_tflops if (seconds and self.peak_tflops) else None
        wait = sum(r["data_wait_share"] * r["step_time_s"] * r["window_steps"] for r in recs)
        out["data_wait_share"] = wait / seconds if seconds else None
        mems = [r["memory_gib"] for r in self.records if r.get("memory_gib") is not None]
        out["memory_gib"] = max(mems) if mems else None
        out["host_paced_share"] = host_paced_share(recs, backward_lags)
        out["first_loss"] = self.records[0]["loss"] if self.records else None
        out["final_loss"] = self.records[-1]["loss"] if self.records else None
        out["device"] = self.device_name
        out["peak_bf16_tflops"] = self.peak_tflops
        return out

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def host_paced_share(records: list, backward_lags: Optional[dict] = None) -> Optional[float]:
    """Share of `records` (steps) whose backward began on an idle GPU (lag < HOST_PACED_MS): the host, not the GPU,
    paced them. backward_lags: {step: lag} over all ranks (gpu_lag.backward_lags_over_ranks), used when it holds
    every record's step; else each record's own gpu_lag_backward_ms (rank 0's). None when a step has no lag (CPU
    runs, runs from before GpuLag)."""
    if backward_lags and records and all(r.get("step") in backward_lags for r in records):
        lags = [backward_lags[r["step"]] for r in records]
    else:
        lags = [r.get("gpu_lag_backward_ms") for r in records]
    if not lags or any(not isinstance(v, (int, float)) for v in lags):
        return None
    return sum(v < HOST_PACED_MS for v in lags) / len(lags)


def _start_file(path: str, resumed_at_step: Optional[int]) -> None:
    """Empty `path` for a new run; for a resumed one keep only the records of steps <= resumed_at_step."""
    kept = []
    if resumed_at_step is not None and os.path.isfile(path):
        with open(path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= resumed_at_step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)  # a crash here leaves the old file, never a half-written one


def _num(x: float):
    return x if math.isfinite(x) else str(x)  # JSON has no NaN/inf; keep them visible as strings
