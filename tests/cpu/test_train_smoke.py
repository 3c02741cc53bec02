"""The shipped CPU config, run exactly as `make train` runs it without a GPU (2 processes, gloo), learns:
the final logged loss is below 70% of the first, and the run leaves metrics.jsonl and summary.json."""

import json
import os

from _train_runs import DEBUG_TOML, explain, metrics, run_train


def test_debug_config_learns(tmp_path):
    dump = str(tmp_path / "debug_moe")
    proc = run_train(dump, 2, [], timeout=300, config=DEBUG_TOML)
    assert proc.returncode == 0, explain(proc)
    recs = metrics(dump)
    assert recs[0]["step"] == 1 and recs[-1]["step"] == 200
    assert recs[-1]["loss"] < 0.7 * recs[0]["loss"], (recs[0]["loss"], recs[-1]["loss"])
    with open(os.path.join(dump, "summary.json")) as f:
        summary = json.load(f)
    assert summary["final_loss"] == recs[-1]["loss"] and summary["world_size"] == 2
