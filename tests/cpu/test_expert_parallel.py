"""Expert parallelism ([parallelism] expert_parallel_degree) and float8 dispatch ([float8] dispatch_dtype), on CPU
over gloo (tests/cpu/expert_parallel_worker.py; the debug model in fp32, float8 emulated). The worker cases run in
two launches (every 2-process case, then every 4-process case: module fixtures); each test asserts on its cases.

- EP=2 matches EP=1 (FSDP only) step for step on 2 processes: losses, grad norms (clipping active: the norm sees
  every parameter once) and every updated parameter after 3 steps, rel. diff < 1e-5.
- Forced routing: every token to EP rank 0's experts (rank 1's experts get no rows) still matches EP=1 (bf16
  experts exactly; fp8_rowwise experts with float8 dispatch: losses and grad norms within 1e-3).
- 4 processes: EP=2 with FSDP over the remaining 2 shard ranks, and EP=2 under HSDP 2x2 (expert grads all-reduced
  across the replicas), both match EP=1 on the same 4 ranks.
- float8 dispatch: the bytes seen at all_to_all_single are <= 55% of the bf16 bytes of the same rows; the received
  float8 rows equal quantize-after-a-bf16-dispatch bit for bit (zeros, subnormals, huge values, empty splits).
- A DCP checkpoint saved at EP=2 loads into a 1-process EP=1 model: the global expert weights come back.
- Config errors name the key; launch/train.py trains with EP=2 and torch.compile (loss falls) and compiles nothing
  after the first step, though the routing of later steps empties a rank and makes splits of 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from _train_runs import HERE_TESTS, ROOT, TINY, DEBUG_TOML, explain, metrics, run_train

WORKER = os.path.join(HERE_TESTS, "expert_parallel_worker.py")
EP2 = ["--parallelism.expert_parallel_degree=2"]
F8_ROWWISE = ["--float8.enable", "--float8.emulate", "--float8.recipe_name=tensorwise",
              "--float8.moe_recipe_name=fp8_rowwise"]
# the debug model's experts (dim 64, hidden 64) are too small for mx32 / mx128's 128-row weight tiles
F8_MX32_PLAIN = ["--float8.enable", "--float8.emulate", "--float8.recipe_name=tensorwise",
                 "--float8.moe_recipe_name=mxfp8", "--float8.moe_granularity=mx32_plain"]


def run_worker(out_dir, world: int, cases: list[dict]) -> tuple:
    """One launch of `world` gloo workers that run every case in order (see expert_parallel_worker.py).
    Returns (process, out_dir); `case_result` reads one case's per-rank results."""
    os.makedirs(out_dir, exist_ok=True)
    names = [c["name"] for c in cases]
    assert len(set(names)) == len(names), names
    cases_json = os.path.join(out_dir, "cases.json")
    with open(cases_json, "w") as f:
        json.dump(cases, f)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", WORKER,
           str(out_dir), str(world), cases_json]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    return proc, str(out_dir), world


def case_result(launch, name: str) -> list[dict]:
    """Every rank's result of case `name`; fails with the case's traceback (or the launch's output) if the
    case did not finish."""
    proc, out_dir, world = launch
    files = [os.path.join(out_dir, name, f"rank{r}.pt") for r in range(world)]
    if not all(os.path.exists(f) for f in files):
        errors = [os.path.join(out_dir, name, f"rank{r}.error") for r in range(world)]
        tb = "".join(open(e).read() for e in errors if os.path.exists(e))
        raise AssertionError(f"case {name!r} did not finish\n{tb}\n{explain(proc)}")
    return [torch.load(f, weights_only=False) for f in files]


def train_case(name: str, *args: str, **extra) -> dict:
    return {"name": name, "scenario": "train", "args": list(args), **extra}


EP1 = ["--parallelism.expert_parallel_degree=1"]
FORCE = {"force_route": 2}  # experts 0 and 1 of 4: EP rank 0's
DISPATCH_RECIPES = {"fp8_rowwise": ["fp8_rowwise"], "mx32": ["mxfp8", "mx32"], "mx128": ["mxfp8", "mx128"],
                    "mx32_plain": ["mxfp8", "mx32_plain"]}
F8_TRAIN = {"fp8_rowwise": F8_ROWWISE, "mxfp8_mx32_plain": F8_MX32_PLAIN}
HSDP = {"fsdp4_ep2": [], "hsdp2x2_ep2": ["--parallelism.data_parallel_replicate_degree=2"]}


@pytest.fixture(scope="module")
def two_procs(tmp_path_factory):
    """Every 2-process case of this file, in one launch (each launch costs ~10-20 s of imports on the CI)."""
    cases = [{"name": f"dispatch_{k}", "scenario": "dispatch", "args": v} for k, v in DISPATCH_RECIPES.items()]
    cases += [train_case("ep1", *EP1), train_case("ep2", *EP2, save_dcp=True),
              train_case("forced_ep1", *EP1, **FORCE), train_case("forced_ep2", *EP2, **FORCE),
              train_case("forced_fp8_rowwise_ep1", *EP1, *F8_ROWWISE, **FORCE),
              train_case("forced_fp8_rowwise_ep2", *EP2, *F8_ROWWISE, "--float8.dispatch_dtype=float8", **FORCE)]
    for k, f8 in F8_TRAIN.items():
        cases += [train_case(f"{k}_bf16_dispatch", *EP2, *f8),
                  train_case(f"{k}_float8_dispatch", *EP2, *f8, "--float8.dispatch_dtype=float8")]
    return run_worker(tmp_path_factory.mktemp("ep_two"), 2, cases)


@pytest.fixture(scope="module")
def four_procs(tmp_path_factory):
    """Every 4-process case of this file, in one launch."""
    cases = []
    for k, extra in HSDP.items():
        cases += [train_case(f"{k}_ref_ep1", *EP1, *extra), train_case(k, *EP2, *extra)]
    return run_worker(tmp_path_factory.mktemp("ep_four"), 4, cases)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))


def assert_same_training(ref: dict, got: dict, tol: float = 1e-5) -> None:
    for key in ("losses", "norms"):
        for i, (a, b) in enumerate(zip(ref[key], got[key])):
            assert abs(a - b) / abs(a) < tol, f"step {i + 1} {key}: {a} vs {b}"
    assert ref["params"].keys() == got["params"].keys()
    for name, a in ref["params"].items():
        b = got["params"][name]
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert rel(a, b) < tol, f"{name}: rel {rel(a, b):.2e}"


def test_ep2_matches_ep1_step_for_step(two_procs):
    ep1_two = case_result(two_procs, "ep1")[0]
    got = case_result(two_procs, "ep2")
    assert got[0]["mesh"] == ((1, 2), ("dp_shard_mod_ep", "ep"))
    assert max(ep1_two["norms"]) > 0.5  # max_norm = 0.5: clipping acted on every step
    assert_same_training(ep1_two, got[0])
    # tokens went by all-to-all: per MoE layer (2) and step (3), counts (int64) + dispatch + combine (fp32 rows),
    # and in backward the two reverse all-to-alls of the gradients
    dtypes = [c["dtype"] for c in got[0]["a2a"]]
    assert dtypes.count("torch.int64") == 2 * 3 and dtypes.count("torch.float32") == 4 * 2 * 3, dtypes

    # the DCP checkpoint of the EP=2 run holds the GLOBAL expert weights: it loads into a plain 1-process model
    import torch.distributed.checkpoint as dcp

    from titan_fp8.config import load_config
    from titan_fp8.train.trainer import build_model

    cfg = load_config(DEBUG_TOML, [], world_size=1)
    model, _ = build_model(cfg, torch.device("cpu"), lambda *a, **k: None)
    state = model.state_dict()
    assert state["layers.1.moe.experts.w13"].shape[0] == 4  # all experts
    dcp.load(state, checkpoint_id=os.path.join(two_procs[1], "ep2", "dcp"))
    model.load_state_dict(state)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), got[0]["params"][name]), name


def test_all_tokens_to_one_rank_and_empty_experts(two_procs):
    ref = case_result(two_procs, "forced_ep1")[0]
    got = case_result(two_procs, "forced_ep2")
    assert_same_training(ref, got[0])
    # rank 1's experts got nothing: what it sends from its experts (forward combine, backward dispatch gradient)
    # is empty, half of its row all-to-alls
    rows = [c["shape"][0] for c in got[1]["a2a"] if c["dtype"] == "torch.float32"]
    assert len(rows) == 4 * 2 * 3 and rows.count(0) == len(rows) // 2, rows
    # the same with fp8_rowwise experts and float8 dispatch: rank 1's fused expert op runs on 0 rows (its combine
    # backward crashed there); the losses follow EP=1's (token-major wgrad scales see both ranks' rows under EP)
    ref = case_result(two_procs, "forced_fp8_rowwise_ep1")[0]
    got = case_result(two_procs, "forced_fp8_rowwise_ep2")[0]
    for key in ("losses", "norms"):
        assert all(abs(a - b) / abs(a) < 1e-3 for a, b in zip(ref[key], got[key])), (key, ref[key], got[key])


@pytest.mark.parametrize("layout", list(HSDP))
def test_four_processes_ep2_matches_ep1(four_procs, layout):
    ref = case_result(four_procs, f"{layout}_ref_ep1")[0]
    got = case_result(four_procs, layout)[0]
    assert got["mesh"][1][-2:] == ("dp_shard_mod_ep", "ep")
    assert_same_training(ref, got)


@pytest.mark.parametrize("recipe", list(DISPATCH_RECIPES))
def test_float8_dispatch_equals_quantize_after_bf16_dispatch(two_procs, recipe):
    for rank, r in enumerate(case_result(two_procs, f"dispatch_{recipe}")):
        for want, got in zip(r["want"], r["got"]):
            assert want.dtype == got.dtype and torch.equal(want, got), (rank, recipe)
        # one all_to_all_single of bytes, <= 55% of the bf16 bytes of the same rows
        (call,) = r["a2a_float8"]
        assert call["dtype"] == "torch.uint8"
        assert call["bytes"] <= 0.55 * (call["shape"][0] * 128 * 2), call  # DISPATCH_DIM = 128
        assert torch.equal(r["x_recv"].isfinite(), r["plain"].isfinite())


@pytest.mark.parametrize("f8", list(F8_TRAIN))
def test_float8_dispatch_trains_with_half_the_bytes(two_procs, f8):
    bf16 = case_result(two_procs, f"{f8}_bf16_dispatch")
    fp8 = case_result(two_procs, f"{f8}_float8_dispatch")
    for rank in range(2):
        # per layer and step: counts, dispatch (uint8 in the float8 run), combine, and in backward the two
        # reverse all-to-alls of the gradients (activation dtype)
        disp = [c for c in fp8[rank]["a2a"] if c["dtype"] == "torch.uint8"]
        assert len(disp) == 2 * 3
        for c in disp:  # against the bf16 bytes of the same rows (D = 64)
            assert c["bytes"] <= 0.55 * c["shape"][0] * 64 * 2, c
        others = [c for c in fp8[rank]["a2a"] if c["dtype"] == "torch.float32"]
        assert len(others) == 3 * 2 * 3  # combine and both gradients stay in the activation dtype
        assert len([c for c in bf16[rank]["a2a"] if c["dtype"] == "torch.float32"]) == 4 * 2 * 3
    losses = fp8[0]["losses"]
    assert all(abs(a - b) / a < 1e-3 for a, b in zip(bf16[0]["losses"], losses)), (bf16[0]["losses"], losses)


@pytest.mark.parametrize("args, key", [
    (["--parallelism.expert_parallel_degree=3"], "expert_parallel_degree"),  # does not divide shard 2
    (["--parallelism.expert_parallel_degree=0"], "expert_parallel_degree"),
    (["--model.moe.num_experts=6", "--parallelism.expert_parallel_degree=4"], "expert_parallel_degree"),
    (["--float8.dispatch_dtype=float8", *EP2], "dispatch_dtype"),  # float8 off
    ([*F8_ROWWISE, "--float8.dispatch_dtype=float8"], "dispatch_dtype"),  # no EP
    (["--float8.enable", "--float8.moe_recipe_name=none", "--float8.dispatch_dtype=float8", *EP2], "dispatch_dtype"),
    ([*F8_ROWWISE, "--float8.dispatch_dtype=fp8", *EP2], "dispatch_dtype"),
])
def test_config_errors_name_the_key(args, key):
    from titan_fp8.config import ConfigError, load_config

    world = 4 if "--parallelism.expert_parallel_degree=4" in args else 2
    with pytest.raises(ConfigError, match=key) as err:
        load_config(DEBUG_TOML, args, world_size=world)
    assert "\n" not in str(err.value)


def test_train_py_ep2_trains_compiled(tmp_path):
    """launch/train.py with EP=2 and torch.compile of the blocks: everything whose size depends on the routing (the
    counts exchange and its host read, the all-to-alls, the experts) runs outside the compiled graphs, so no rank
    compiles anything after the first step, whatever the routing: steps 3-6 force it (ep_routing_train.py: rank 1
    receives no rows, then rank 0; splits of 1; no row crossing). Traced, those sizes made each rank guard on its
    own values: a rank receiving no rows recompiled alone mid-run (before: rank 0 went from 16 to 20 graphs at
    step 4; suspected in the 2xH200 EP run that stalled at step 12). The loss falls."""
    dump = str(tmp_path / "run")
    proc = run_train(dump, 2, [*TINY, "--training.local_batch_size=2", *EP2, "--training.steps=8",
                               "--validation.enable=false", "--compile.enable"], timeout=480,
                     script=os.path.join(HERE_TESTS, "ep_routing_train.py"))
    assert proc.returncode == 0, explain(proc)
    assert "mesh (1, 2) ('dp_shard_mod_ep', 'ep')" in proc.stdout
    losses = [m["loss"] for m in metrics(dump)]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.3, losses
    for rank in range(2):
        with open(os.path.join(dump, f"compiles-rank{rank}.json")) as f:
            graphs = json.load(f)  # compiled graphs after steps 1..8
        assert len(graphs) == 8 and graphs[1:] == [graphs[0]] * 7, f"rank {rank} compiled after step 1: {graphs}"


def test_train_py_ep2_float8_everything(tmp_path):
    """EP=2 with tensorwise Linears gathered in float8 + precompute, fp8_rowwise experts (gathered in their
    parameter dtype under EP: warned) and float8 dispatch: launch/train.py runs and the loss stays finite."""
    dump = str(tmp_path / "run")
    proc = run_train(dump, 2, [*TINY, "--training.local_batch_size=2", *EP2, "--training.steps=3",
                               "--validation.enable=false", *F8_ROWWISE, "--float8.dispatch_dtype=float8",
                               "--float8.enable_fsdp_float8_all_gather",
                               "--float8.precompute_float8_dynamic_scale_for_fsdp"])
    assert proc.returncode == 0, explain(proc)
    assert "enable_fsdp_float8_all_gather applies to the Linear weights only" in proc.stderr
    assert "no valid precomputed scale" not in proc.stderr
    losses = [m["loss"] for m in metrics(dump)]
    assert len(losses) == 3 and all(l == l and l < 10 for l in losses), losses
