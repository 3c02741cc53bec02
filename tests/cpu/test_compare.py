"""launch/compare.py at debug size on CPU: one run per recipe, pictures and summaries, failures reported.

One comparison runs (1 process per run, emulated float8): bf16 with 2 seeds, a run that crashes (lr 1e38:
AdamW's update overflows in step 1), tensorwise AFTER it (so a failure does not stop later runs), and a
recipe with a misspelt key (rejected before starting). The numbers in summary.json are recomputed here from
each run's metrics.jsonl with the definitions written out independently of compare.py.
"""

import json
import os
import statistics
import subprocess
import sys

import pytest

from _train_runs import DEBUG_TOML, ROOT, explain
from titan_fp8.recipes import PRESETS

COMPARE = os.path.join(ROOT, "launch", "compare.py")
STEPS = 5
TINY = ["--training.seq_len=32", f"--training.steps={STEPS}", "--training.local_batch_size=2",
        "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1", "--validation.freq=2", "--validation.steps=1"]
RECIPES = "bf16,diverge:optimizer.lr=1e38,tensorwise,typo:recipe_nam=tensorwise"


def run_compare(*args, timeout=400):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, COMPARE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out = str(tmp_path_factory.mktemp("compare"))
    proc = run_compare("--config", DEBUG_TOML, "--recipes", RECIPES, "--seeds", "2", "--nproc", "1",
                       f"--job.dump_folder={out}", *TINY)
    assert os.path.isfile(os.path.join(out, "summary.json")), explain(proc)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return out, proc, summary


def records(out, name):
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_pictures_and_summaries_are_written(compared):
    from PIL import Image

    out, proc, _ = compared
    for name, min_size in (("loss.png", (800, 300)), ("throughput.png", (600, 300))):
        path = os.path.join(out, name)
        assert os.path.getsize(path) > 0, name
        with Image.open(path) as img:
            img.load()
            assert img.format == "PNG" and img.size[0] >= min_size[0] and img.size[1] >= min_size[1], img.size
            assert len(img.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 8  # not blank
    with open(os.path.join(out, "summary.md")) as f:
        md = f.read()
    for name in ("bf16", "bf16-seed43", "tensorwise", "diverge", "typo", "loss.png", "throughput.png",
                 "Failed runs"):
        assert name in md, name
    assert "compare: wrote" in proc.stdout


def test_summary_numbers_equal_those_from_metrics_jsonl(compared):
    out, _, summary = compared
    assert summary["baseline"] == "bf16" and summary["tolerance_rel"] == 0.005
    runs = summary["runs"]
    assert [n for n in runs] == ["bf16", "bf16-seed43", "diverge", "tensorwise", "typo"]
    # the extra seed changes the initialization only: same training batches as every other run
    assert "--training.seed=43" in runs["bf16-seed43"]["overrides"]
    assert "--training.data_seed=42" in runs["bf16-seed43"]["overrides"]
    assert not any(o.startswith("--training.data_seed") for o in runs["bf16"]["overrides"])
    mine = {}
    for name in ("bf16", "bf16-seed43", "tensorwise"):
        recs = records(out, name)
        assert [r["step"] for r in recs] == list(range(1, STEPS + 1)), name  # one record per step, fresh file
        tail = [r["loss"] for r in recs if r["step"] > STEPS - max(1, STEPS // 10)]
        warm = max(1, min(10, STEPS // 5))
        timed = [r for r in recs if r["step"] > warm]
        val = [r for r in recs if "val_loss" in r]
        assert [r["step"] for r in val] == [2, 4, 5]  # every freq steps and at the last step
        mine[name] = {"final_train_loss": recs[-1]["loss"], "last10_mean_train_loss": statistics.fmean(tail),
                      "val_loss": val[-1]["val_loss"], "val_step": STEPS, "warmup_steps": warm,
                      "tps_per_gpu_median": statistics.median(r["tps_per_gpu"] for r in timed),
                      # 4 timed steps: the nearest-rank 10th / 90th percentiles are the slowest / fastest
                      "tps_per_gpu_p10": min(r["tps_per_gpu"] for r in timed),
                      "tps_per_gpu_p90": max(r["tps_per_gpu"] for r in timed),
                      # tokens a step a GPU (seq_len 32 x 2 sequences, one process) over the steps' time
                      "tps_per_gpu_aggregate": 64 * len(timed) / sum(r["step_time_s"] for r in timed),
                      "sync_wait_share_median": statistics.median(r["sync_wait_share"] for r in timed),
                      "gpu_lag_ms_median": None, "host_paced_share": None,  # CPU runs have no GPU lag
                      "peak_memory_gib": None, "mfu_median": None}
    base = mine["bf16"]
    seed_diff = {k: abs(mine["bf16-seed43"][k] - base[k]) / base[k] for k in ("last10_mean_train_loss", "val_loss")}
    for key, value in seed_diff.items():
        assert summary["baseline_seed_diff"][key] == pytest.approx(value, rel=1e-12), key
    for name, m in mine.items():
        got = runs[name]
        assert got["status"] == "ok" and got["exit_code"] == 0
        for key, value in m.items():
            assert got[key] == (pytest.approx(value, rel=1e-12) if value is not None else None), (name, key)
        rel_train = (m["last10_mean_train_loss"] - base["last10_mean_train_loss"]) / base["last10_mean_train_loss"]
        rel_val = (m["val_loss"] - base["val_loss"]) / base["val_loss"]
        assert got["rel_diff_train_vs_baseline"] == pytest.approx(rel_train, rel=1e-12, abs=1e-15)
        assert got["rel_diff_val_vs_baseline"] == pytest.approx(rel_val, rel=1e-12, abs=1e-15)
        assert got["speedup_vs_baseline"] == pytest.approx(m["tps_per_gpu_median"] / base["tps_per_gpu_median"],
                                                           rel=1e-12)
        assert got["speedup_aggregate_vs_baseline"] == pytest.approx(
            m["tps_per_gpu_aggregate"] / base["tps_per_gpu_aggregate"], rel=1e-9)
    tol_train = max(0.005, seed_diff["last10_mean_train_loss"])
    tol_val = max(0.005, seed_diff["val_loss"])
    tw = runs["tensorwise"]
    assert tw["within_tolerance"] == (abs(tw["rel_diff_train_vs_baseline"]) <= tol_train
                                      and abs(tw["rel_diff_val_vs_baseline"]) <= tol_val)
    assert runs["bf16"]["within_tolerance"] is None and runs["bf16-seed43"]["within_tolerance"] is None
    # the same data order and initial weights: at step 1 emulated tensorwise is within float8 error of bf16,
    # while another seed is not
    first = {n: records(out, n)[0]["loss"] for n in mine}
    assert abs(first["tensorwise"] - first["bf16"]) < 0.01 * first["bf16"]
    assert abs(first["bf16-seed43"] - first["bf16"]) > abs(first["tensorwise"] - first["bf16"])


def test_aggregate_throughput_is_tokens_over_time_not_the_median():
    """Steps that alternate slow / fast (the host blocked at different points) deliver less than their median
    says: 4 steps of 64 tokens in 1.0, 0.5, 1.0, 0.5 s are 256 tokens in 3 s, while the median tps is 96."""
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    try:
        import compare
    finally:
        sys.path.pop(0)
    recs = [{"step": s, "loss": 1.0, "tps_per_gpu": 64 / dt, "step_time_s": dt, "window_steps": 1,
             "tflops_per_gpu": None, "mfu": None}
            for s, dt in zip(range(1, 6), (9.0, 1.0, 0.5, 1.0, 0.5))]  # step 1: the warm-up (5 // 5 = 1 step)
    stats = compare.run_stats(recs)
    assert stats["warmup_steps"] == 1 and stats["tps_per_gpu_median"] == pytest.approx(96.0)
    assert stats["tps_per_gpu_aggregate"] == pytest.approx(256 / 3.0)
    # a record over 2 steps (2 s each) counts both; a step without its time makes the figure unknown, not wrong
    window = [recs[0], dict(recs[1], window_steps=2, step_time_s=2.0, tps_per_gpu=32.0), dict(recs[2], step=3)]
    assert compare.run_stats(window)["tps_per_gpu_aggregate"] == pytest.approx((128 + 64) / (4.0 + 0.5))
    assert compare.run_stats([*recs[:3], dict(recs[3], step_time_s=None)])["tps_per_gpu_aggregate"] is None


def test_runs_the_host_paced_are_named_under_the_table():
    """A run paced by its host in at least half of its timed steps is named (its speedup is the machine's as much
    as the recipe's); GPU-paced runs and runs without a lag figure (CPU) are not."""
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    try:
        import compare
    finally:
        sys.path.pop(0)
    runs = {"bf16": {"host_paced_share": 0.0}, "tw": {"host_paced_share": 0.45}, "mx": {"host_paced_share": 0.5},
            "cpu": {"host_paced_share": None}, "ep": {"host_paced_share": 1.0}}
    line = compare.host_paced_warning({"runs": runs})
    assert line.startswith("host-paced in at least half of their timed steps: mx (0.50), ep (1.00).")
    assert "bf16" not in line and "tw " not in line and "cpu" not in line
    assert compare.host_paced_warning({"runs": {k: runs[k] for k in ("bf16", "tw", "cpu")}}) is None


def test_summary_takes_host_paced_share_over_every_rank(tmp_path):
    """summarize() reads each run's gpu_lag_rank*.json: rank 0 logged 100 ms of lag at every backward, rank 1's
    GPU sat idle, so rank 1's host paced every step (1.0, not rank 0's 0.0). A run without those files keeps
    rank 0's figure from metrics.jsonl."""
    import types
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    try:
        import compare
    finally:
        sys.path.pop(0)
    recs = [{"step": s, "loss": 2.0, "tps_per_gpu": 100.0, "step_time_s": 1.0, "window_steps": 1,
             "tflops_per_gpu": None, "mfu": None, "gpu_lag_backward_ms": 100.0} for s in range(1, 6)]
    runs = []
    for name in ("a", "b"):
        dump = tmp_path / name
        dump.mkdir()
        runs.append(compare.Run(name=name, recipe=name, seed=42, overrides=[], dump=str(dump), status="ok",
                                records=recs))
    for rank, lag in ((0, 100.0), (1, 0.2)):
        with open(tmp_path / "b" / f"gpu_lag_rank{rank}.json", "w") as f:
            json.dump({"rank": rank, "steps": [1, 2, 3, 4, 5], "lag_ms": [50.0] * 5,
                       "phase_lag_ms": {"step": [50.0] * 5, "backward": [lag] * 5, "optimizer": [9.0] * 5}}, f)
    args = types.SimpleNamespace(config="x.toml", runs_per_gpu=1)
    summary = compare.summarize(runs, "a", args, nproc=2, gpus=2, out=str(tmp_path))
    assert summary["runs"]["a"]["host_paced_share"] == 0.0
    assert summary["runs"]["b"]["host_paced_share"] == 1.0
    assert compare.host_paced_warning(summary).startswith("host-paced in at least half of their timed steps: b (1.00)")


def test_failed_runs_show_their_log_tail_and_the_others_finish(compared):
    out, proc, summary = compared
    assert proc.returncode == 1, explain(proc)
    with open(os.path.join(out, "diverge", "train.log")) as f:
        last_line = f.read().strip().splitlines()[-1].strip()  # lr 1e38: the non-finite step stops the run
    runs = summary["runs"]
    assert runs["diverge"]["status"] == "failed" and runs["diverge"]["exit_code"] not in (0, None)
    assert f"diverge: FAILED (exit {runs['diverge']['exit_code']})" in proc.stdout
    assert last_line in proc.stdout.split("diverge: FAILED")[1] and "error" in last_line.lower(), last_line
    assert runs["diverge"]["log_tail"].endswith(last_line) and runs["diverge"]["final_train_loss"] is None
    assert "typo: FAILED before starting" in proc.stdout and "float8.recipe_nam: unknown key" in proc.stdout
    assert "tensorwise: ok" in proc.stdout.split("diverge: FAILED")[1]  # ran after the failure
    assert runs["typo"]["status"] == "failed" and "recipe_nam" in runs["typo"]["log_tail"]
    assert "compare: 2 run(s) failed: diverge, typo" in proc.stdout
    # CPU runs of a float8 recipe emulate it; the command of every run is at the top of its log
    with open(os.path.join(out, "tensorwise", "train.log")) as f:
        head = f.readline()
    assert "--float8.emulate=true" in head and "--float8.recipe_name=tensorwise" in head


def test_reuse_redraws_from_complete_runs_without_training(compared):
    out, _, first = compared
    proc = run_compare("--config", DEBUG_TOML, "--recipes", "bf16,tensorwise", "--seeds", "2", "--nproc", "1",
                       f"--job.dump_folder={out}", *TINY, "--reuse", timeout=200)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.count("reused (complete run of the same command)") == 3 and "started" not in proc.stdout
    with open(os.path.join(out, "summary.json")) as f:
        again = json.load(f)["runs"]
    for name in ("bf16", "bf16-seed43", "tensorwise"):
        assert again[name]["reused"] is True
        for key in ("last10_mean_train_loss", "val_loss", "tps_per_gpu_median", "rel_diff_val_vs_baseline"):
            assert again[name][key] == first["runs"][name][key], (name, key)
    # --redraw trains nothing: complete folders are summarized as they are, a recipe without one is "not run"
    proc = run_compare("--config", DEBUG_TOML, "--recipes", "bf16,tensorwise,mxfp8_mx128", "--seeds", "2",
                       "--nproc", "1", f"--job.dump_folder={out}", *TINY, "--redraw", timeout=200)
    assert proc.returncode == 1 and "started" not in proc.stdout, explain(proc)
    assert "mxfp8_mx128: FAILED (exit None); last lines" in proc.stdout and "--redraw: no complete run" in proc.stdout
    with open(os.path.join(out, "summary.json")) as f:
        redrawn = json.load(f)["runs"]
    assert redrawn["mxfp8_mx128"]["status"] == "failed"
    for name in ("bf16", "bf16-seed43", "tensorwise"):
        assert redrawn[name]["val_loss"] == first["runs"][name]["val_loss"], name
    # a run is reused only for the identical command and when complete
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_cli", COMPARE)
    cli = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cli  # dataclasses look their module up there
    spec.loader.exec_module(cli)
    with open(os.path.join(out, "bf16", cli.RUN_FILE)) as f:
        made = json.load(f)
    run = cli.Run("bf16", "bf16", 42, made["overrides"], os.path.join(out, "bf16"), steps=STEPS)
    assert cli.reusable(run, made["config"], 1)
    assert not cli.reusable(run, made["config"], 2)
    assert not cli.reusable(cli.Run("bf16", "bf16", 42, [*made["overrides"], "--optimizer.lr=1e-3"], run.dump,
                                    steps=STEPS), made["config"], 1)
    assert not cli.reusable(cli.Run("bf16", "bf16", 42, made["overrides"], run.dump, steps=STEPS + 1),
                            made["config"], 1)


def test_unknown_recipe_is_one_line_listing_the_presets(tmp_path):
    from titan_fp8.recipes import PRESETS

    proc = run_compare("--config", DEBUG_TOML, "--recipes", "bf16,fp4", f"--job.dump_folder={tmp_path}/x",
                       timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and "unknown recipe 'fp4'" in err and all(name in err for name in PRESETS), err
    assert not os.path.exists(tmp_path / "x")  # nothing ran


def test_parse_recipes():
    from titan_fp8.recipes import RecipeError, parse_recipes

    got = parse_recipes('bf16,noag:enable=true,recipe_name=tensorwise,comm.nccl_max_ctas=8,'
                        'ctas:tensorwise,enable_fsdp_float8_all_gather=false,f:filter_fqns=["output","router"]')
    assert [r.name for r in got] == ["bf16", "noag", "ctas", "f"]
    assert got[0].overrides() == ["--float8.enable=false"]
    assert got[1].overrides() == ["--float8.enable=true", "--float8.recipe_name=tensorwise",
                                  "--comm.nccl_max_ctas=8"]
    assert got[2].keys["float8.enable_fsdp_float8_all_gather"] == "false"  # overrides the base preset's key
    assert got[2].keys["float8.precompute_float8_dynamic_scale_for_fsdp"] is True
    assert got[3].overrides() == ['--float8.filter_fqns=["output","router"]']
    for spec, part in [("bf16,bf16", "given twice"), ("x:", "sets no key"), ("enable=true", "belongs to no recipe"),
                       ("bf16,,tensorwise", "empty item"), ("a b:enable=true", "recipe name"),
                       ("x:tensorwize", "unknown recipe 'tensorwize'"), ("x:1bad=2", "not a key")]:
        with pytest.raises(RecipeError) as e:
            parse_recipes(spec)
        assert part in str(e.value) and "\n" not in str(e.value), (spec, str(e.value))


def test_env_keys_set_the_runs_environment(tmp_path, monkeypatch):
    """env.NAME=value keys of a recipe: not train.py arguments, but variables of that run's processes (and part
    of its identity for --reuse); a name that is no environment variable name is one RecipeError line."""
    import launch.compare as compare
    from titan_fp8.recipes import RecipeError, parse_recipes

    got = parse_recipes("bf16,py:mxfp8_mx128_linears,env.TITAN_FP8_BLOCKWISE_MM=python,comm.nccl_max_ctas=8")
    assert got[1].env() == {"TITAN_FP8_BLOCKWISE_MM": "python"} and got[0].env() == {}
    assert "--comm.nccl_max_ctas=8" in got[1].overrides()
    assert not any("env." in o or "TITAN_FP8_BLOCKWISE_MM" in o for o in got[1].overrides())
    with pytest.raises(RecipeError, match="env.titan_x.*upper-case") as e:
        parse_recipes("x:env.titan_x=1")
    assert "\n" not in str(e.value)
    runs = compare.plan_runs(DEBUG_TOML, [], got, 1, 0, 1, str(tmp_path), 0)
    assert [r.env for r in runs] == [{}, {"TITAN_FP8_BLOCKWISE_MM": "python"}] and runs[1].config_error is None
    assert compare._run_identity(runs[1], DEBUG_TOML, 1)["env"] == {"TITAN_FP8_BLOCKWISE_MM": "python"}
    assert "env" not in compare._run_identity(runs[0], DEBUG_TOML, 1)
    seen = {}

    class FakePopen:
        def __init__(self, cmd, env=None, **kw):
            seen["env"], self.pid = env, 0
    monkeypatch.setattr(compare.subprocess, "Popen", FakePopen)
    monkeypatch.delenv("TITAN_FP8_BLOCKWISE_MM", raising=False)
    _, logf, _ = compare.start(runs[1], DEBUG_TOML, 1, [])
    logf.close()
    assert seen["env"]["TITAN_FP8_BLOCKWISE_MM"] == "python"
    with open(runs[1].log) as f:
        assert f.readline().startswith("$ TITAN_FP8_BLOCKWISE_MM=python ")
    compare.start(runs[0], DEBUG_TOML, 1, [])[1].close()
    assert "TITAN_FP8_BLOCKWISE_MM" not in seen["env"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_float8_section(name):
    """Each preset's keys are [float8] keys and the config accepts their values (2 ranks, emulated)."""
    import dataclasses

    from titan_fp8.config import Float8, load_config
    from titan_fp8.recipes import PRESETS, parse_recipes

    known = {f.name for f in dataclasses.fields(Float8)}
    missing = set(PRESETS[name]) - known
    assert not missing, missing
    (recipe,) = parse_recipes(name)
    cfg = load_config(DEBUG_TOML, [*recipe.overrides(), "--float8.emulate=true"], world_size=2)
    for key, value in PRESETS[name].items():
        assert getattr(cfg.float8, key) == value, key


def test_step_spread_percentiles_and_column():
    """The step-to-step spread beside the median: nearest-rank 10th / 90th percentiles of the timed steps,
    shown in thousands; missing or non-finite values give none."""
    import launch.compare as compare
    vals = [float(v) for v in range(100, 121)]  # 21 steps: 10% and 90% fall on ranks 2 and 18
    assert compare._percentile(vals[::-1], 0.1) == 102.0 and compare._percentile(vals, 0.9) == 118.0
    assert compare._percentile([], 0.1) is None and compare._percentile([1.0, float("nan")], 0.9) is None
    row = compare.table_rows({"runs": {"r": {"tps_per_gpu_p10": 44210.0, "tps_per_gpu_p90": 55640.0}}})[0]
    headers = [h for h, _, _ in compare.COLUMNS]
    assert row[headers.index("steps p10-p90")] == "44.2-55.6k"
