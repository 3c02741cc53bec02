"""GPU preflight of the training stack (skips without CUDA): one process, debug flavor, the GPU code path
(meta init -> fully_shard -> to_empty -> init_weights, bf16 params / fp32 reduce, fused AdamW, compiled
blocks). With TITAN_FP8_SYNC_DEBUG=1 every host sync after step 2 other than the per-step non-finite check
raises a "synchronizing CUDA operation" warning: there must be none."""

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
from _train_runs import DEBUG_TOML, TRAIN, explain, metrics  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("compile_", [False, True])
def test_gpu_steps_have_one_sync_and_report_mfu(tmp_path, compile_):
    dump = str(tmp_path / "gpu")
    env = dict(os.environ, TITAN_FP8_SYNC_DEBUG="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, TRAIN, "--config", DEBUG_TOML, f"--job.dump_folder={dump}", "--training.steps=8",
           "--metrics.log_freq=1", f"--compile.enable={str(compile_).lower()}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, explain(proc)
    assert "synchronizing CUDA operation" not in proc.stderr + proc.stdout, explain(proc)
    recs = metrics(dump)
    assert len(recs) == 8 and all(r["memory_gib"] and r["memory_gib"] > 0 for r in recs)
    name = torch.cuda.get_device_name()
    if "H100" in name or "H200" in name:
        assert all(r["mfu"] is not None and r["mfu"] > 0 for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]
    # host_paced_share from the ranks' gpu_lag files (here the one rank's), the same figure compare.py computes
    import json

    from titan_fp8.train.gpu_lag import backward_lags_over_ranks
    from titan_fp8.train.metrics import host_paced_share
    lags = backward_lags_over_ranks(dump, 1)
    with open(os.path.join(dump, "summary.json")) as f:
        summary = json.load(f)
    timed = [r for r in recs if r["step"] > max(1, min(10, 8 // 5))]
    assert lags and summary["host_paced_share"] == host_paced_share(timed, lags) is not None


def test_pinned_stager_batches_arrive_intact():
    """Batches staged through the pinned buffers reach the GPU with their values, also when the host reuses a slot
    while the GPU is still busy, and when the source changes right after staging."""
    from titan_fp8.train.data import PinnedStager
    stager = PinnedStager(slots=2)
    dev = torch.device("cuda")
    big = torch.randn(4096, 4096, device=dev)
    sources, staged = [], []
    for step in range(6):
        for _ in range(4):  # keep the GPU busy so the copies queue behind work
            big = big @ big / 64
        src = torch.randint(0, 50000, (2, 4097), dtype=torch.long)
        inputs, labels = src[:, :-1], src[:, 1:]
        staged.append(stager.to_device(dev, inputs, labels))
        sources.append((inputs.clone(), labels.clone()))
        src.fill_(-1)  # the host reuses its memory at once
    torch.cuda.synchronize()
    for (i, l), (gi, gl) in zip(sources, staged):
        assert gi.is_cuda and torch.equal(gi.cpu(), i) and torch.equal(gl.cpu(), l)
    assert stager.slots[0][0].is_pinned()
