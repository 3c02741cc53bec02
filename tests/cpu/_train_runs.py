"""Helpers that run launch/train.py in subprocesses (1 process, or 2 over gloo via torchrun) and read what
they wrote. Runs are cached per pytest session so test files can share them (the 2-core CI is slow to
start distributed processes)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "launch", "train.py")
DEBUG_TOML = os.path.join(ROOT, "train_configs", "debug_moe.toml")

# A tiny, fast version of the debug model. aux_free load balancing: its token counts are all-reduced,
# so 1 and 2 ranks route identically (a per-rank aux loss would differ by design, as in torchtitan).
TINY = [
    "--training.seq_len=32", "--training.steps=6", "--training.seed=7", "--metrics.log_freq=1",
    "--optimizer.lr=3e-3", "--lr_scheduler.warmup_steps=2", "--model.moe.load_balance=aux_free",
    "--model.moe.bias_update_rate=0.01", "--validation.enable",
    "--validation.freq=3", "--validation.steps=2",
]

METRIC_KEYS = {"step", "loss", "grad_norm", "lr", "tps_per_gpu", "tflops_per_gpu", "mfu", "memory_gib",
               "data_wait_share"}


def run_train(dump: str, nproc: int, extra: list[str] = (), env: dict | None = None, timeout: int = 240,
              config: str = DEBUG_TOML) -> subprocess.CompletedProcess:
    args = ["--config", config, f"--job.dump_folder={dump}", *extra]
    if nproc == 1:
        cmd = [sys.executable, TRAIN, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               TRAIN, *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def metrics(dump: str) -> list[dict]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def checkpoint_steps(dump: str) -> list[str]:
    folder = os.path.join(dump, "checkpoint")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


@functools.lru_cache(maxsize=None)
def baseline_two_ranks(tmp_root: str) -> str:
    """2 ranks x local batch 2, checkpoints every 2 steps: the reference of the parity and resume tests."""
    dump = os.path.join(tmp_root, "baseline2")
    proc = run_train(dump, 2, [*TINY, "--training.local_batch_size=2", "--checkpoint.enable",
                               "--checkpoint.interval=2"])
    assert proc.returncode == 0, explain(proc)
    return dump


@functools.lru_cache(maxsize=None)
def one_rank(tmp_root: str, ac_mode: str = "none") -> str:
    """1 rank x local batch 4: the same global batches as baseline_two_ranks."""
    dump = os.path.join(tmp_root, f"one_rank_{ac_mode}")
    proc = run_train(dump, 1, [*TINY, "--training.local_batch_size=4", f"--activation_checkpoint.mode={ac_mode}"])
    assert proc.returncode == 0, explain(proc)
    with open(os.path.join(dump, "stdout.txt"), "w") as f:
        f.write(proc.stdout)
    return dump
