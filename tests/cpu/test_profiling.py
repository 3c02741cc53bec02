"""[profiling]: one step in every profile_freq is recorded (Chrome trace + a top-ops table per rank) and left
out of the throughput; the other steps and the loss are untouched; bad keys are start-up errors."""
import json
import os

from _train_runs import TINY, explain, metrics, run_train


def test_profiled_steps_write_traces_and_stay_out_of_throughput(tmp_path):
    dump = str(tmp_path / "prof")
    proc = run_train(dump, 1, [*TINY, "--validation.enable=false", "--profiling.enable_profiling",
                               "--profiling.profile_freq=3", "--profiling.save_traces_folder=traces"], timeout=300)
    assert proc.returncode == 0, explain(proc)
    for step in (3, 6):
        d = os.path.join(dump, "traces", f"iteration_{step}")
        with open(os.path.join(d, "rank0_trace.json")) as f:
            assert json.load(f)["traceEvents"]  # a real Chrome trace
        with open(os.path.join(d, "rank0_top.txt")) as f:
            assert "Self CPU" in f.read()
    assert not os.path.exists(os.path.join(dump, "traces", "iteration_1"))
    recs = metrics(dump)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert [bool(r.get("profiled")) for r in recs] == [False, False, True, False, False, True]
    assert all(r["tps_per_gpu"] is None for r in recs if r.get("profiled"))
    assert all(r["tps_per_gpu"] > 0 for r in recs if not r.get("profiled"))
    with open(os.path.join(dump, "summary.json")) as f:
        summary = json.load(f)
    assert summary["steps_averaged"] == [2, 5], summary["steps_averaged"]  # steps 2, 4, 5: not 3 and 6


def test_bad_profiling_key_is_one_line_error(tmp_path):
    proc = run_train(str(tmp_path / "bad"), 1, [*TINY, "--profiling.profile_freq=0"], timeout=120)
    assert proc.returncode != 0
    assert "profile_freq" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr, explain(proc)
