"""Helpers that run launch/train.py in subprocesses (1 process, N over gloo via torchrun, or two torchrun agents
as two "nodes" on 127.0.0.1) and read what they wrote. Runs are cached per pytest session so test files can
share them (the 2-core CI is slow to start distributed processes)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE_TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE_TESTS))
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
               "data_wait_share", "sync_wait_share"}


def _env(env: dict | None) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))


def run_train(dump: str, nproc: int, extra: list[str] = (), env: dict | None = None, timeout: int = 240,
              config: str = DEBUG_TOML, script: str = TRAIN) -> subprocess.CompletedProcess:
    """`script` (launch/train.py, or a test wrapper taking the same arguments) on 1 process or `nproc` torchrun
    workers on this machine."""
    args = ["--config", config, f"--job.dump_folder={dump}", *extra]
    if nproc == 1:
        cmd = [sys.executable, script, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               script, *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train_nodes(dump: str, nnodes: int, nproc_per_node: int, extra: list[str] = (), timeout: int = 240,
                    config: str = DEBUG_TOML) -> list[subprocess.CompletedProcess]:
    """`nnodes` torchrun agents on 127.0.0.1, each one "node" of `nproc_per_node` workers, meeting through the
    c10d rendezvous as a multi-node job does (the agent of node 0 hosts the store). Loopback only. On a timeout
    every agent's process group is killed, and the timeout re-raised."""
    port = free_port()
    args = ["--config", config, f"--job.dump_folder={dump}", *extra]
    env = _env({"GLOO_SOCKET_IFNAME": "lo"})  # gloo's sockets on loopback, whatever the hostname resolves to
    procs = []
    for node in range(nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
               f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-id=titan-fp8-test-{port}", f"--rdzv-conf=is_host={'true' if node == 0 else 'false'},"
               f"join_timeout={timeout}", "--local-addr=127.0.0.1", "--max-restarts=0", TRAIN, *args]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    done = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return done


def metrics(dump: str) -> list[dict]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_same_steps(ref: list[dict], got: list[dict], rel: float = 1e-5, keys=("loss", "grad_norm")) -> None:
    """Step for step, every key of `got` matches `ref` to a relative difference below `rel`."""
    assert [r["step"] for r in ref] == [r["step"] for r in got], ([r["step"] for r in ref], [r["step"] for r in got])
    for a, b in zip(ref, got):
        for key in keys:
            diff = abs(a[key] - b[key]) / abs(a[key])
            assert diff < rel, f"step {a['step']} {key}: reference {a[key]} vs {b[key]} (rel {diff:.2e})"


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


@contextlib.contextmanager
def parallelized_debug_model(overrides: list[str]):
    """The debug_moe model (on the meta device, float8-converted per the overrides) after parallelize on a
    one-rank gloo group, in this process: what parallelize does to the modules, with no training. Yields
    the model."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from titan_fp8.config import load_config
    from titan_fp8.float8 import Float8Config, convert_to_float8_training
    from titan_fp8.models.llama_moe import Transformer
    from titan_fp8.parallel import build_mesh, parallelize
    cfg = load_config(DEBUG_TOML, list(overrides), world_size=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with torch.device("meta"):
            model = Transformer(cfg.model_args())
        if cfg.float8.enable:
            convert_to_float8_training(model, Float8Config(**{f.name: getattr(cfg.float8, f.name)
                                                              for f in dataclasses.fields(cfg.float8)
                                                              if f.name != "enable"}))
        yield parallelize(model, cfg, build_mesh(cfg, "cpu", 1))
    finally:
        dist.destroy_process_group()
