"""Kill-and-resume reproduces an uninterrupted run; a half-written checkpoint is never picked up.

The uninterrupted reference is the 2-rank run of test_fsdp_parity (checkpoints at steps 2, 4, 6). Here the
same job dies abruptly after step 5 (every rank calls os._exit, no cleanup: the checkpoint at 4 is the last
complete one). Before resuming we plant what a crash during a save, or a non-atomic writer, would leave:
a step-5 directory without the COMPLETE marker, and a .tmp-step-6 directory. The resumed run must ignore both,
load step-4 (model, optimizer, scheduler, data position, RNG) and reproduce steps 5 and 6 exactly (validation,
every 3 steps in TINY, ran at step 3 before the kill and runs at step 6 after it).
"""

import os

import pytest

from _train_runs import TINY, baseline_two_ranks, checkpoint_steps, explain, metrics, run_train

ARGS = [*TINY, "--training.local_batch_size=2", "--checkpoint.enable", "--checkpoint.interval=2"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    reference = metrics(baseline_two_ranks(str(tmp_path_factory.getbasetemp())))
    dump = str(tmp_path_factory.mktemp("killed"))
    killed = run_train(dump, 2, ARGS, env={"TITAN_FP8_FAULT_EXIT_AFTER_STEP": "5"})
    assert killed.returncode != 0, "the fault hook should have killed the run:\n" + explain(killed)
    before = metrics(dump)
    steps_after_kill = checkpoint_steps(dump)
    ckpt = os.path.join(dump, "checkpoint")
    os.makedirs(os.path.join(ckpt, "step-5"))
    with open(os.path.join(ckpt, "step-5", "__0_0.distcp"), "wb") as f:
        f.write(b"half written")
    os.makedirs(os.path.join(ckpt, ".tmp-step-6"))
    resumed = run_train(dump, 2, ARGS)
    assert resumed.returncode == 0, explain(resumed)
    return reference, before, steps_after_kill, metrics(dump), resumed, dump


def test_killed_run_left_only_complete_checkpoints(resumed):
    _, before, steps_after_kill, _, _, _ = resumed
    assert [r["step"] for r in before] == [1, 2, 3, 4, 5]
    assert steps_after_kill == ["step-2", "step-4"]


def test_resume_reproduces_uninterrupted_losses(resumed):
    reference, before, _, after, proc, _ = resumed
    assert "resumed from" in proc.stdout and "step-4" in proc.stdout, proc.stdout[-2000:]
    # metrics.jsonl keeps the killed run's records up to the checkpoint (step 4) and the resumed run appends;
    # the killed run's step 5, redone, is not kept twice
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6]
    assert after[:4] == before[:4]
    new = after[4:]
    ref = {r["step"]: r for r in reference}
    for rec in new:
        for key in ("loss", "grad_norm", "lr"):
            assert rec[key] == pytest.approx(ref[rec["step"]][key], rel=1e-6, abs=0), (rec["step"], key)
    # and the killed run's own step 5 agrees too (same data position after the restore)
    assert before[4]["loss"] == pytest.approx(ref[5]["loss"], rel=1e-6)


def test_planted_partial_checkpoints_are_ignored(resumed):
    _, _, _, _, proc, dump = resumed
    assert "ignoring incomplete" in proc.stdout and "step-5" in proc.stdout
    assert os.path.isfile(os.path.join(dump, "checkpoint", "step-6", "COMPLETE"))
    assert not os.path.isfile(os.path.join(dump, "checkpoint", "step-5", "COMPLETE"))


def test_save_that_fails_midway_leaves_no_checkpoint(tmp_path, monkeypatch):
    """In-process, one gloo rank: a save that dies inside DCP leaves only .tmp-step-N, never step-N."""
    import torch
    import torch.distributed as dist

    from titan_fp8.train import checkpoint as ck

    class Data:
        def state_dict(self):
            return {"batches_consumed": 3}

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(model.parameters())
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        mgr = ck.CheckpointManager(str(tmp_path), model, opt, sched, Data())
        mgr.save(1)
        real_save = ck.dcp.save

        def dying_save(state, checkpoint_id):
            real_save(state, checkpoint_id=checkpoint_id)  # shards written ...
            raise OSError("disk full")  # ... then the writer dies before the checkpoint is complete

        monkeypatch.setattr(ck.dcp, "save", dying_save)
        with pytest.raises(OSError):
            mgr.save(2)
        assert sorted(os.listdir(tmp_path)) == [".tmp-step-2", "step-1"]
        assert ck.latest_step(str(tmp_path)) == 1
        assert ck.incomplete_dirs(str(tmp_path)) == [".tmp-step-2"]
        monkeypatch.setattr(ck.dcp, "save", real_save)
        mgr.save(2)  # a later save of the same step replaces the leftover
        assert sorted(os.listdir(tmp_path)) == ["step-1", "step-2"] and ck.latest_step(str(tmp_path)) == 2
    finally:
        dist.destroy_process_group()
