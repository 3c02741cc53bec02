"""Train one config once per recipe and draw the evidence: loss curves on top of each other, tokens/s beside bf16.

    python launch/compare.py --config FILE --recipes bf16,tensorwise,mxfp8_mx128 [--steps N] [--seeds 2]
                             [--nproc N] [--section.key=value ...]

Every run gets the same config, seed and data order; only the recipe's keys differ (presets and the ad-hoc
`name:key=value,...` syntax: titan_fp8/recipes.py). `--seeds N` runs the baseline (bf16, else the first
recipe) N times with seeds s, s+1, ... and the data order of seed s (`[training] data_seed`), so they differ
only in initialization: their difference is the noise floor a float8 recipe is held to. Every run is validated
on the same held-out batches.
Runs use `--nproc` processes each (default: every GPU; 1 on CPU, where float8 recipes get emulate = true),
through torchrun when more than one; with --nproc 1 on a host with G GPUs, G runs go at once, one per GPU.
Checkpointing is off in every run, so each starts from step 0. `--reuse` keeps a run whose subfolder
already holds a complete run of the identical command (compare_run.json) instead of training it again: a
comparison can be assembled over several sessions (carry the dump folder) and re-drawn without training.

Into `[job] dump_folder` (after overrides): one subfolder per run (its metrics.jsonl, summary.json,
train.log), and loss.png, throughput.png, summary.md, summary.json. A run that fails shows the last lines of
its log and the others still run; the exit status is then 1. A bad --recipes or config: one line, status 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run from a checkout without installing

from titan_fp8.config import ConfigError, load_config  # noqa: E402
from titan_fp8.recipes import RecipeError, parse_recipes  # noqa: E402
from titan_fp8.train.gpu_lag import backward_lags_over_ranks  # noqa: E402
from titan_fp8.train.metrics import host_paced_share  # noqa: E402

TRAIN = os.path.join(ROOT, "launch", "train.py")
TOLERANCE_REL = 0.005  # issue 11: within 0.5% of bf16, or the bf16 seed-to-seed difference if larger
TAIL_LINES = 15
DEFINITIONS = {
    "last10_mean_train_loss": "mean train loss over the logged steps > final_step - max(1, final_step // 10)",
    "val_loss": "validation loss at the last validated step (the run's last step)",
    "rel_diff_*_vs_baseline": "(recipe - baseline) / baseline",
    "baseline_seed_diff": "max over the baseline's extra seeds of |seed_k - seed_0| / seed_0",
    "within_tolerance": f"|rel_diff| <= max({TOLERANCE_REL}, baseline_seed_diff), train and validation",
    "warmup_steps": "max(1, min(10, final_step // 5)); throughput medians use the logged steps after it",
    "tps_per_gpu_median": "median of tps_per_gpu over non-skipped, non-profiled logged steps after the warm-up",
    "tps_per_gpu_p10 / _p90": "10th / 90th percentile (nearest rank) of the same steps' tps_per_gpu: the "
                              "step-to-step spread, shown as 'steps p10-p90' in thousands",
    "sync_wait_share_median": "median over the same steps of the share of a step the host waited for the GPU at "
                              "the step's one sync; None for runs logged before it existed (near 0 does not prove "
                              "host-bound: the host can block in a launch once the queue is full)",
    "gpu_lag_ms_median / _p10 / _p90": "over the same steps: how much GPU work was still queued when the host "
                                       "began the step, in ms (it holds the previous step's optimizer update; rank "
                                       "0's)",
    "host_paced_share": "share of the same steps whose backward began on an idle GPU on ANY rank (the smallest lag "
                        "over the run's gpu_lag_rank*.json < 1 ms; rank 0's from metrics.jsonl without those "
                        "files): a host, not the GPU, paced them (the slowest host paces every rank)",
    "speedup_vs_baseline": "tps_per_gpu_median / baseline's tps_per_gpu_median",
    "tps_per_gpu_aggregate": "the same steps' tokens over their time (sum of tps_per_gpu * step_time_s * "
                             "window_steps over sum of step_time_s * window_steps): what the run delivered. Where it "
                             "sits a few % under the median, step times alternate (a slow step, then a fast one: "
                             "the host blocked at different points), and the median flatters the run",
    "speedup_aggregate_vs_baseline": "tps_per_gpu_aggregate / baseline's tps_per_gpu_aggregate",
    "mfu_median": "median MFU (active-parameter FLOPs vs the GPU's bf16 dense peak, also for float8)",
    "peak_memory_gib": "max over logged steps of torch.cuda.max_memory_allocated (GiB)",
}


@dataclass
class Run:
    name: str  # folder name and legend label: the recipe, or "<baseline>-seed<s>" for an extra seed
    recipe: str
    seed: int
    overrides: list[str]
    dump: str
    env: dict = field(default_factory=dict)  # the recipe's env.NAME=value keys: set in the run's processes
    steps: int = 0  # [training] steps of this run (0 when its config was rejected)
    config_error: Optional[str] = None
    status: str = "pending"  # pending | running | ok | failed
    reused: bool = False
    exit_code: Optional[int] = None
    wall_s: Optional[float] = None
    log_tail: Optional[str] = None
    records: list = field(default_factory=list)

    @property
    def log(self) -> str:
        return os.path.join(self.dump, "train.log")


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    return code


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--config", required=True)
    p.add_argument("--recipes", required=True, help="comma-separated presets or name:key=value,... (recipes.py)")
    p.add_argument("--steps", type=int, help="[training] steps for every run")
    p.add_argument("--seeds", type=int, default=1, help="runs of the baseline with seeds s, s+1, ... (default 1)")
    p.add_argument("--nproc", type=int, help="processes per run (default: every GPU; 1 on CPU)")
    p.add_argument("--runs-per-gpu", type=int, default=1,
                   help="runs sharing each GPU (slot) at once (default 1); >1 only for loss parity: the runs then "
                        "slow each other, so their tokens/s is no speed comparison (summary says so)")
    p.add_argument("--reuse", action="store_true",
                   help="keep runs already complete in the dump folder with the identical command")
    p.add_argument("--redraw", action="store_true",
                   help="train nothing: summarize and draw the complete runs already in the dump folder (e.g. "
                        "copied from the GPU host, or left by a comparison that was cut short); the others "
                        "are reported as not run")
    return p.parse_known_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = parse_args(argv)
    try:
        recipes = parse_recipes(args.recipes)
    except RecipeError as e:
        return _fail(str(e))
    if (args.seeds < 1 or args.runs_per_gpu < 1 or (args.nproc is not None and args.nproc < 1)
            or (args.steps is not None and args.steps < 1)):
        return _fail("--seeds, --runs-per-gpu, --nproc and --steps must be >= 1")
    if args.steps is not None:
        overrides = [*overrides, f"--training.steps={args.steps}"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return _fail("matplotlib is needed for loss.png / throughput.png: pip install matplotlib")

    import torch

    gpus = torch.cuda.device_count()
    nproc = args.nproc or max(gpus, 1)
    try:
        base = load_config(args.config, overrides, world_size=nproc)
    except ConfigError as e:
        return _fail(str(e))
    if gpus and nproc > gpus:
        return _fail(f"--nproc {nproc}: only {gpus} GPU(s) here")
    out = base.job.dump_folder
    os.makedirs(out, exist_ok=True)

    runs = plan_runs(args.config, overrides, recipes, args.seeds, base.training.seed, nproc, out, gpus)
    baseline = baseline_of(recipes)
    slots = [list(range(i * nproc, (i + 1) * nproc)) for i in range(max(1, gpus // nproc))] if gpus else [[]]
    slots = slots * args.runs_per_gpu if gpus else slots  # K runs share each slot's GPUs
    where = (f"{len(slots)} at a time, {nproc} GPU(s) each" + (f", {args.runs_per_gpu} per GPU" if
             args.runs_per_gpu > 1 else "") if gpus else f"on CPU, one at a time, {nproc} process(es)")
    print(f"compare: {len(runs)} run(s) of {args.config} ({where}); baseline {baseline}; into {out}", flush=True)

    if args.redraw:
        redraw(runs)
    else:
        execute(runs, args.config, nproc, slots, args.reuse)

    summary = summarize(runs, baseline, args, nproc, gpus, out)
    summary["command"] = shlex.join(["python", "launch/compare.py", *argv])
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary_markdown(summary, runs))
    plot_loss(runs, baseline, os.path.join(out, "loss.png"))
    plot_throughput(summary, os.path.join(out, "throughput.png"))
    written = ("loss.png", "throughput.png", "summary.md", "summary.json")
    print(f"compare: wrote {', '.join(os.path.join(out, n) for n in written)}")
    print(table_text(summary), flush=True)
    warning = host_paced_warning(summary)
    if warning:
        print(f"compare: {warning}", flush=True)
    failed = [r.name for r in runs if r.status != "ok"]
    if failed:
        print(f"compare: {len(failed)} run(s) failed: {', '.join(failed)}", flush=True)
        return 1
    return 0


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def baseline_of(recipes) -> str:
    return "bf16" if any(r.name == "bf16" for r in recipes) else recipes[0].name


def plan_runs(config: str, overrides: list[str], recipes, seeds: int, seed0: int, nproc: int, out: str,
              gpus: int) -> list[Run]:
    """One Run per recipe (+ extra seeds of the baseline), each checked with load_config before anything starts:
    a recipe whose keys the config rejects is a failed run with that one-line error, and is not started."""
    baseline = baseline_of(recipes)
    runs = []
    for recipe in recipes:
        for k in range(seeds if recipe.name == baseline else 1):
            name = recipe.name if k == 0 else f"{recipe.name}-seed{seed0 + k}"
            dump = os.path.join(out, name)
            ovr = [*overrides, *recipe.overrides(), f"--training.seed={seed0 + k}", f"--job.dump_folder={dump}",
                   "--checkpoint.enable=false"]
            if k:  # same batches as the other runs: the seed changes the initialization only
                ovr.append(f"--training.data_seed={seed0}")
            run = Run(name, recipe.name, seed0 + k, ovr, dump, env=recipe.env())
            try:
                cfg = load_config(config, ovr, world_size=nproc)
                run.steps = cfg.training.steps
                if cfg.float8.enable and not gpus and not cfg.float8.emulate:
                    run.overrides.append("--float8.emulate=true")  # no float8 hardware: emulate the numerics
            except ConfigError as e:
                run.config_error = str(e)
            runs.append(run)
    return runs


def command(config: str, run: Run, nproc: int) -> list[str]:
    args = [TRAIN, "--config", config, *run.overrides]
    if nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


RUN_FILE = "compare_run.json"  # what made the run in this folder; --reuse compares it


def _run_identity(run: Run, config: str, nproc: int) -> dict:
    ident = {"config": config, "overrides": run.overrides, "nproc": nproc}
    if run.env:
        ident["env"] = run.env
    return ident


def reusable(run: Run, config: str, nproc: int) -> bool:
    """The folder holds a finished run (the trainer writes summary.json last) of exactly this command."""
    try:
        with open(os.path.join(run.dump, RUN_FILE)) as f:
            same = json.load(f) == _run_identity(run, config, nproc)
    except (OSError, ValueError):
        return False
    return same and complete(run)


def complete(run: Run) -> bool:
    """The folder holds a finished run (the trainer writes summary.json last) of run.steps steps."""
    recs = read_metrics(run.dump)
    return bool(recs) and recs[-1]["step"] == run.steps and os.path.isfile(os.path.join(run.dump, "summary.json"))


def redraw(runs: list[Run]) -> None:
    """--redraw: every complete run folder is taken as it is (its compare_run.json says what made it)."""
    for i, run in enumerate(runs, 1):
        if complete(run):
            run.status, run.reused, run.exit_code, run.records = "ok", True, 0, read_metrics(run.dump)
        else:
            run.status, run.log_tail = "failed", f"--redraw: no complete run in {run.dump}"
        print(f"[{i}/{len(runs)}] {progress_line(run)}", flush=True)


def execute(runs: list[Run], config: str, nproc: int, slots: list[list[int]], reuse: bool = False) -> None:
    """Run everything, `len(slots)` at a time (each slot its own GPUs); print a line as each starts and ends."""
    n = len(runs)
    pending = list(enumerate(runs, 1))
    active: dict[int, tuple] = {}  # slot -> (index, run, Popen, log file, start time)
    free = list(range(len(slots)))
    try:
        while pending or active:
            while pending and free:
                i, run = pending.pop(0)
                if run.config_error:
                    run.status, run.log_tail = "failed", run.config_error
                    print(f"[{i}/{n}] {run.name}: FAILED before starting (config): {run.config_error}", flush=True)
                    continue
                if reuse and reusable(run, config, nproc):
                    run.status, run.reused, run.exit_code, run.records = "ok", True, 0, read_metrics(run.dump)
                    print(f"[{i}/{n}] {progress_line(run)}", flush=True)
                    continue
                slot = free.pop(0)
                active[slot] = (i, run, *start(run, config, nproc, slots[slot]))
                gpus = f", GPU {','.join(map(str, slots[slot]))}" if slots[slot] else ""
                print(f"[{i}/{n}] {run.name}: started (seed {run.seed}{gpus}), log {run.log}", flush=True)
            for slot, (i, run, proc, logf, t0) in list(active.items()):
                if proc.poll() is None:
                    continue
                logf.close()
                finish(run, proc.returncode, time.perf_counter() - t0)
                print(f"[{i}/{n}] {progress_line(run)}", flush=True)
                del active[slot]
                free.append(slot)
            if active:
                time.sleep(0.5)
    finally:
        for _, run, proc, logf, _ in active.values():  # interrupted: stop the runs this script started
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
            logf.close()


def start(run: Run, config: str, nproc: int, gpu_ids: list[int]):
    if os.path.isdir(run.dump):  # a previous comparison's files: never mix them into this one
        for name in ("metrics.jsonl", "summary.json", "train.log", RUN_FILE):
            if os.path.exists(os.path.join(run.dump, name)):
                os.remove(os.path.join(run.dump, name))
    os.makedirs(run.dump, exist_ok=True)
    with open(os.path.join(run.dump, RUN_FILE), "w") as f:
        json.dump(_run_identity(run, config, nproc), f, indent=1)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **run.env)
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    logf = open(run.log, "w")
    logf.write("$ " + " ".join(f"{k}={shlex.quote(v)}" for k, v in run.env.items()) + (" " if run.env else "")
               + shlex.join(command(config, run, nproc)) + "\n")
    logf.flush()
    proc = subprocess.Popen(command(config, run, nproc), cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT,
                            start_new_session=True)
    run.status = "running"
    return proc, logf, time.perf_counter()


def finish(run: Run, code: int, wall_s: float) -> None:
    run.exit_code, run.wall_s = code, wall_s
    run.records = read_metrics(run.dump)
    run.status = "ok" if code == 0 and run.records else "failed"
    if run.status == "failed":
        with open(run.log, errors="replace") as f:
            run.log_tail = "".join(f.readlines()[-TAIL_LINES:]).rstrip()
        if code == 0:
            run.log_tail += "\n(exit 0 but no metrics.jsonl records)"


def read_metrics(dump: str) -> list[dict]:
    path = os.path.join(dump, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def progress_line(run: Run) -> str:
    if run.status == "ok":
        s = run_stats(run.records)
        val = f", val {s['val_loss']:.4f}" if s["val_loss"] is not None else ""
        how = "reused (complete run of the same command)" if run.reused else f"ok in {run.wall_s:.0f} s"
        return (f"{run.name}: {how}, loss {s['final_train_loss']:.4f}{val}, "
                f"{s['tps_per_gpu_median']:.0f} tokens/s/GPU")
    tail = "\n".join("    " + line for line in (run.log_tail or "").splitlines())
    after = f" after {run.wall_s:.0f} s" if run.wall_s is not None else ""
    return f"{run.name}: FAILED (exit {run.exit_code}){after}; last lines of {run.log}:\n{tail}"


# --------------------------------------------------------------------------------------------------
# Numbers (definitions in DEFINITIONS; the CPU test recomputes them from metrics.jsonl)
# --------------------------------------------------------------------------------------------------


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _median(values: list) -> Optional[float]:
    return statistics.median(values) if values and all(_finite(v) for v in values) else None


def _percentile(values: list, q: float) -> Optional[float]:
    """Nearest-rank percentile q in [0, 1]; None if any value is missing or not finite."""
    if not values or not all(_finite(v) for v in values):
        return None
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def _aggregate_tps(records: list[dict]) -> Optional[float]:
    """Tokens per second per GPU over `records` taken together (each record covers window_steps steps)."""
    tokens = seconds = 0.0
    for r in records:
        tps, dt, n = r.get("tps_per_gpu"), r.get("step_time_s"), r.get("window_steps", 1)
        if not (_finite(tps) and _finite(dt) and _finite(n)) or dt <= 0:
            return None
        tokens += tps * dt * n
        seconds += dt * n
    return tokens / seconds if seconds else None


def run_stats(records: list[dict], backward_lags: Optional[dict] = None) -> dict:
    """The numbers of one run from its metrics records; backward_lags: {step: smallest backward lag over the
    ranks} (gpu_lag.backward_lags_over_ranks of its folder) for host_paced_share."""
    final_step = records[-1]["step"]
    tail_from = final_step - max(1, final_step // 10)
    tail = [r["loss"] for r in records if r["step"] > tail_from]
    vals = [r for r in records if "val_loss" in r]
    warmup = max(1, min(10, final_step // 5))
    timed = [r for r in records if r["step"] > warmup and not r.get("skipped") and not r.get("profiled")] or records[-1:]
    mems = [r["memory_gib"] for r in records if r.get("memory_gib") is not None]
    reserved = [r["memory_reserved_gib"] for r in records if r.get("memory_reserved_gib") is not None]
    return {
        "final_step": final_step,
        "final_train_loss": records[-1]["loss"],
        "last10_mean_train_loss": sum(tail) / len(tail) if all(_finite(x) for x in tail) else None,
        "last10_steps": [tail_from + 1, final_step],
        "val_loss": vals[-1]["val_loss"] if vals else None,
        "val_step": vals[-1]["step"] if vals else None,
        "warmup_steps": warmup,
        "tps_per_gpu_median": _median([r["tps_per_gpu"] for r in timed]),
        "tps_per_gpu_p10": _percentile([r["tps_per_gpu"] for r in timed], 0.1),
        "tps_per_gpu_p90": _percentile([r["tps_per_gpu"] for r in timed], 0.9),
        "tps_per_gpu_aggregate": _aggregate_tps(timed),
        "sync_wait_share_median": _median([r.get("sync_wait_share") for r in timed]),
        "gpu_lag_ms_median": _median([r.get("gpu_lag_ms") for r in timed]),
        "gpu_lag_ms_p10": _percentile([r.get("gpu_lag_ms") for r in timed], 0.1),
        "gpu_lag_ms_p90": _percentile([r.get("gpu_lag_ms") for r in timed], 0.9),
        "host_paced_share": host_paced_share(timed, backward_lags),
        "tflops_per_gpu_median": _median([r["tflops_per_gpu"] for r in timed]),
        "mfu_median": _median([r["mfu"] for r in timed]),
        "peak_memory_gib": max(mems) if mems else None,
        "peak_memory_reserved_gib": max(reserved) if reserved else None,
    }


NUMBERS = [  # every run's entry has these keys (None for a failed run: its partial numbers mean nothing)
    "final_step", "final_train_loss", "last10_mean_train_loss", "last10_steps", "val_loss", "val_step",
    "warmup_steps", "tps_per_gpu_median", "tps_per_gpu_p10", "tps_per_gpu_p90", "tps_per_gpu_aggregate",
    "sync_wait_share_median",
    "gpu_lag_ms_median", "gpu_lag_ms_p10", "gpu_lag_ms_p90", "host_paced_share",
    "tflops_per_gpu_median", "mfu_median", "peak_memory_gib",
    "peak_memory_reserved_gib", "rel_diff_train_vs_baseline", "rel_diff_val_vs_baseline", "tolerance_train",
    "tolerance_val", "within_tolerance", "speedup_vs_baseline", "speedup_aggregate_vs_baseline",
]


def _rel(x, ref) -> Optional[float]:
    return (x - ref) / ref if _finite(x) and _finite(ref) and ref != 0 else None


def summarize(runs: list[Run], baseline: str, args, nproc: int, gpus: int, out: str) -> dict:
    stats = {r.name: run_stats(r.records, backward_lags_over_ranks(r.dump, nproc)) if r.status == "ok" else None
             for r in runs}
    base = stats.get(baseline)
    seed_runs = [stats[r.name] for r in runs if r.recipe == baseline and r.name != baseline and stats[r.name]]
    seed_diff = None
    if base and seed_runs:
        seed_diff = {}
        for key in ("last10_mean_train_loss", "val_loss"):
            diffs = [_rel(s[key], base[key]) for s in seed_runs]
            seed_diff[key] = max(abs(d) for d in diffs) if all(d is not None for d in diffs) else None
    device = None
    out_runs = {}
    for run in runs:
        s = stats[run.name]
        entry = {"recipe": run.recipe, "seed": run.seed, "status": run.status, "exit_code": run.exit_code,
                 "reused": run.reused, "wall_s": run.wall_s, "dump_folder": run.dump, "overrides": run.overrides,
                 "env": run.env,
                 "log_tail": run.log_tail if run.status != "ok" else None, **dict.fromkeys(NUMBERS)}
        if s:
            entry.update(s)
            rel_train = _rel(s["last10_mean_train_loss"], base["last10_mean_train_loss"]) if base else None
            rel_val = _rel(s["val_loss"], base["val_loss"]) if base else None
            tol_train = max(TOLERANCE_REL, (seed_diff or {}).get("last10_mean_train_loss") or 0.0)
            tol_val = max(TOLERANCE_REL, (seed_diff or {}).get("val_loss") or 0.0)
            entry.update({
                "rel_diff_train_vs_baseline": rel_train,
                "rel_diff_val_vs_baseline": rel_val,
                "tolerance_train": tol_train,
                "tolerance_val": tol_val,
                # a verdict for the other recipes; the baseline's own seeds only measure the noise
                "within_tolerance": (None if rel_train is None or run.recipe == baseline else
                                     abs(rel_train) <= tol_train and (rel_val is None or abs(rel_val) <= tol_val)),
                "speedup_vs_baseline": (s["tps_per_gpu_median"] / base["tps_per_gpu_median"]
                                        if base and s["tps_per_gpu_median"] and base["tps_per_gpu_median"] else None),
                "speedup_aggregate_vs_baseline": (s["tps_per_gpu_aggregate"] / base["tps_per_gpu_aggregate"]
                                                  if base and s["tps_per_gpu_aggregate"]
                                                  and base["tps_per_gpu_aggregate"] else None),
            })
            device = device or _run_device(run.dump)
        out_runs[run.name] = entry
    import torch

    return {
        "command": None,  # set by main
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": args.config,
        "device": device,
        "gpus": gpus,
        "nproc_per_run": nproc,
        "runs_per_gpu": args.runs_per_gpu if gpus else 1,
        "torch": torch.__version__,
        "git_commit": _git_commit(),
        "dump_folder": out,
        "baseline": baseline,
        "tolerance_rel": TOLERANCE_REL,
        "baseline_seed_diff": seed_diff,
        "definitions": DEFINITIONS,
        "runs": out_runs,
    }


def _run_device(dump: str) -> Optional[str]:
    try:
        with open(os.path.join(dump, "summary.json")) as f:
            return json.load(f).get("device")
    except (OSError, ValueError):
        return None


def _git_commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# --------------------------------------------------------------------------------------------------
# Writing: table, markdown, pictures
# --------------------------------------------------------------------------------------------------


def _fmt(x, spec: str = ".4f", pct: bool = False) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    return f"{100 * x:+.2f}%" if pct else format(x, spec)


COLUMNS = [  # header, key, format
    ("run", None, None), ("status", "status", None), ("final loss", "final_train_loss", ".4f"),
    ("last-10% mean", "last10_mean_train_loss", ".4f"), ("vs base", "rel_diff_train_vs_baseline", "pct"),
    ("val loss", "val_loss", ".4f"), ("val vs base", "rel_diff_val_vs_baseline", "pct"),
    ("within tol", "within_tolerance", None), ("tokens/s/GPU", "tps_per_gpu_median", ".0f"),
    ("steps p10-p90", "tps_per_gpu_p10", "krange"), ("host-paced", "host_paced_share", ".2f"),
    ("speedup", "speedup_vs_baseline", ".3f"), ("aggregate", "tps_per_gpu_aggregate", ".0f"),
    ("speedup agg.", "speedup_aggregate_vs_baseline", ".3f"), ("peak GiB", "peak_memory_gib", ".2f"),
    ("MFU", "mfu_median", ".3f"),
]


def table_rows(summary: dict) -> list[list[str]]:
    rows = []
    for name, e in summary["runs"].items():
        row = [name]
        for _, key, spec in COLUMNS[1:]:
            v = e.get(key)
            if spec == "krange":  # tps_per_gpu_p10 - tps_per_gpu_p90, in thousands
                hi = e.get("tps_per_gpu_p90")
                row.append("n/a" if v is None or hi is None else f"{v / 1e3:.1f}-{hi / 1e3:.1f}k")
                continue
            row.append(_fmt(v, pct=True) if spec == "pct" else _fmt(v, spec) if spec else
                       ("n/a" if v is None else str(v)))
        rows.append(row)
    return rows


def table_text(summary: dict) -> str:
    rows = [[h for h, _, _ in COLUMNS], *table_rows(summary)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


HOST_PACED_WARN = 0.5  # a run whose host paced at least this share of its timed steps gets named under the table


def host_paced_warning(summary: dict) -> Optional[str]:
    """One line naming the runs that the host paced in >= HOST_PACED_WARN of their timed steps, or None: their
    tokens/s measure this machine's host as much as the recipe (session 39: the same code ran 1.064x bf16 on one
    H200 pair whose hosts paced every float8 step and 1.198x on another)."""
    paced = [(name, r["host_paced_share"]) for name, r in summary["runs"].items()
             if r.get("host_paced_share") is not None and r["host_paced_share"] >= HOST_PACED_WARN]
    if not paced:
        return None
    return ("host-paced in at least half of their timed steps: " + ", ".join(f"{n} ({v:.2f})" for n, v in paced)
            + ". Their tokens/s measure this machine's host as much as the recipe; a larger "
            "--training.local_batch_size moves the pace to the GPU (README: host-paced steps)")


def summary_markdown(summary: dict, runs: list[Run]) -> str:
    lines = [
        f"# Recipe comparison: {summary['config']}",
        "",
        f"- date: {summary['date']}; device: {summary['device'] or 'n/a'} ({summary['gpus']} GPU(s) visible, "
        f"{summary['nproc_per_run']} process(es) per run); torch {summary['torch']}; commit {summary['git_commit']}",
        f"- command: `{summary['command']}`",
        f"- baseline: {summary['baseline']}; tolerance: {100 * summary['tolerance_rel']:.1f}% relative or the "
        "baseline's seed-to-seed difference, whichever is larger",
    ]
    if summary.get("runs_per_gpu", 1) > 1:
        lines.append(f"- {summary['runs_per_gpu']} runs shared each GPU at once (loss parity only): their tokens/s, "
                     "speedup and MFU are NOT a speed comparison")
    sd = summary["baseline_seed_diff"]
    if sd:
        lines.append(f"- baseline seed-to-seed difference: last-10% mean train loss "
                     f"{_fmt(sd['last10_mean_train_loss'], '.3%')}, validation loss {_fmt(sd['val_loss'], '.3%')}")
    lines += ["", "![loss](loss.png)", "", "![throughput](throughput.png)", "",
              "| " + " | ".join(h for h, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(summary)]
    warning = host_paced_warning(summary)
    if warning:
        lines += ["", f"**Note:** {warning}."]
    failed = [r for r in runs if r.status != "ok"]
    if failed:
        lines += ["", "## Failed runs", ""]
        for r in failed:
            lines += [f"### {r.name} (exit {r.exit_code})", "", "```", r.log_tail or "", "```", ""]
    lines += ["", "## Definitions", ""] + [f"- `{k}`: {v}" for k, v in summary["definitions"].items()]
    return "\n".join(lines) + "\n"


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _recipe_colors(recipes: list[str]) -> dict[str, str]:
    """One color per recipe (its extra seeds share it), the same in both pictures."""
    return {r: f"C{i % 10}" for i, r in enumerate(dict.fromkeys(recipes))}


def plot_loss(runs: list[Run], baseline: str, path: str) -> None:
    """Left: train (lines) and validation (dots) loss over all steps. Right: the last 30% of the steps, train
    loss as a running mean so that differences of a fraction of a percent are visible over step noise. The
    baseline is drawn wide and underneath, so a recipe on top of it shows as a thin line inside a wide one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (full, zoom) = plt.subplots(1, 2, figsize=(14, 5.5))
    colors = _recipe_colors([r.recipe for r in runs])
    last_step = max((r.records[-1]["step"] for r in runs if r.records), default=1)
    x0 = 0.7 * last_step
    window = max(1, round(0.05 * max((len(r.records) for r in runs), default=1)))  # in logged steps
    zoom_y = []
    for run in runs:
        recs = [r for r in run.records if _finite(r.get("loss"))]
        if not recs:
            continue
        color = colors[run.recipe]
        style = ":" if run.name != run.recipe else "-"
        wide = run.name == baseline
        line = dict(color=color, zorder=1 if wide else 2, marker="x" if run.status != "ok" else None, markevery=[-1])
        label = run.name + ("" if run.status == "ok" else " (failed)")
        steps, losses = [r["step"] for r in recs], [r["loss"] for r in recs]
        vals = [(r["step"], r["val_loss"]) for r in recs if _finite(r.get("val_loss"))]
        full.plot(steps, losses, style, lw=3 if wide else 0.8, alpha=0.45 if wide else 0.9, label=f"{label} train",
                  **line)
        # the zoom draws whole series (lines enter from the left edge) but fits its y range to the window
        smooth = _smooth(losses, window)
        in_window = [v for s, v in zip(steps, smooth) if s >= x0]
        if len(in_window) < 20 and run.status == "ok":  # sparse logging: show the points themselves
            line.update(marker="o", markevery=None, ms=6 if wide else 3)
        zoom.plot(steps, smooth, style, lw=4 if wide else 1.5, alpha=0.45 if wide else 1, label=f"{label} train",
                  **line)
        zoom_y += in_window
        if vals:
            dots = dict(color=color, zorder=line["zorder"], ms=9 if wide else 4, alpha=0.45 if wide else 1, lw=1)
            full.plot(*zip(*vals), "o--", label=f"{label} validation", **dots)
            zoom.plot(*zip(*vals), "o--", label=f"{label} validation", **dots)
            zoom_y += [v for s, v in vals if s >= x0]
    full.set(title="loss vs step", xlabel="step", ylabel="loss")
    zoom.set(title=f"last 30% of steps (train: running mean over {window} logged step(s))", xlabel="step",
             ylabel="loss")
    if zoom_y:
        lo, hi = min(zoom_y), max(zoom_y)
        pad = 0.05 * (hi - lo) or 0.01 * abs(hi) or 0.01
        zoom.set_ylim(lo - pad, hi + pad)
    zoom.set_xlim(x0, last_step + 0.5)
    for ax in (full, zoom):
        ax.grid(alpha=0.3)
    full.legend(fontsize=8)
    fig.suptitle(f"baseline {baseline}: same config, seed and data order per recipe")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(summary: dict, path: str) -> None:
    """Left: median tokens/s/GPU per run with its ratio to the baseline. Right: peak memory per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["runs"])
    entries = [summary["runs"][n] for n in names]
    colors = _recipe_colors([e["recipe"] for e in entries])
    color = [colors[e["recipe"]] for e in entries]
    fig, (tps_ax, mem_ax) = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(names) + 4), 5))
    tps = [e.get("tps_per_gpu_median") or 0 for e in entries]
    bars = tps_ax.bar(names, tps, color=color)
    for bar, e in zip(bars, entries):
        if e["status"] != "ok":
            text = "failed"
        else:
            ratio = f"{e['speedup_vs_baseline']:.3f}x\n" if e.get("speedup_vs_baseline") else ""
            text = f"{ratio}{e['tps_per_gpu_median']:,.0f}"
        tps_ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    tps_ax.margins(y=0.15)
    tps_ax.set(title=f"median tokens/s/GPU after warm-up (ratio to {summary['baseline']})", ylabel="tokens/s/GPU")
    mem = [e.get("peak_memory_gib") for e in entries]
    if any(m is not None for m in mem):
        bars = mem_ax.bar(names, [m or 0 for m in mem], color=color)
        for bar, m in zip(bars, mem):
            mem_ax.annotate("n/a" if m is None else f"{m:.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom")
    else:
        mem_ax.text(0.5, 0.5, "no GPU memory measured (CPU)", ha="center", va="center", transform=mem_ax.transAxes)
        mem_ax.set_xticks([])
        mem_ax.set_yticks([])
    mem_ax.set(title="peak memory allocated (GiB)", ylabel="GiB")
    for ax in (tps_ax, mem_ax):
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    shared = summary.get("runs_per_gpu", 1)
    fig.suptitle(f"{summary['device'] or 'device n/a'}, {summary['nproc_per_run']} process(es) per run"
                 + (f"; {shared} runs shared each GPU: NOT a speed comparison" if shared > 1 else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
