"""[validation]: val_loss goes into metrics.jsonl every `freq` steps and at the last step, computed on the same
held-out batches every time, and validating changes nothing of the training (losses equal bit for bit with
validation at other steps). metrics.jsonl belongs to one run: a new run does not append to an old file."""

import json
import os

from _train_runs import TINY, explain, metrics, one_rank, run_train


def test_validation_steps_batches_and_no_effect_on_training(tmp_path_factory):
    ref_dump = one_rank(str(tmp_path_factory.getbasetemp()))  # TINY: 6 steps, validation every 3 steps
    ref = metrics(ref_dump)
    dump = str(tmp_path_factory.mktemp("val_freq4"))
    with open(os.path.join(dump, "metrics.jsonl"), "w") as f:  # what an earlier run in this folder left
        f.writelines(json.dumps({"step": s, "loss": 99.0}) + "\n" for s in range(1, 10))
    proc = run_train(dump, 1, [*TINY, "--training.local_batch_size=4", "--activation_checkpoint.mode=none",
                               "--validation.freq=4"])
    assert proc.returncode == 0, explain(proc)
    recs = metrics(dump)
    assert [r["step"] for r in recs] == list(range(1, 7))  # fresh file: none of the old records
    assert [r["step"] for r in ref if "val_loss" in r] == [3, 6]
    assert [r["step"] for r in recs if "val_loss" in r] == [4, 6]  # every 4 steps, and the last step
    for a, b in zip(ref, recs):  # validating at step 3 (ref) or not (here) leaves training untouched
        assert (a["loss"], a["grad_norm"], a["lr"]) == (b["loss"], b["grad_norm"], b["lr"]), a["step"]
    assert recs[-1]["val_loss"] == ref[-1]["val_loss"]  # same weights, same held-out batches
    assert abs(recs[-1]["val_loss"] - recs[3]["val_loss"]) > 1e-4  # ... and the value follows training
    with open(os.path.join(dump, "summary.json")) as f:
        assert json.load(f)["val_loss"] == recs[-1]["val_loss"]
    assert "val_loss" in proc.stdout and "validation: every 4 steps and at step 6, 2 batch(es)" in proc.stdout
