"""Config: TOML -> typed sections; CLI overrides; every bad input is ONE line naming file, key and what is
allowed, with a non-zero exit and no traceback when it comes through launch/train.py."""

import os
import subprocess
import sys

import pytest

from titan_fp8.config import ConfigError, JobConfig, load_config
from titan_fp8.parallel import apply_comm_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "train_configs")


def write(tmp_path, text, name="job.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(path, overrides=(), world_size=1) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides), world_size=world_size)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_defaults_and_types(tmp_path):
    cfg = load_config(write(tmp_path, '[model]\nflavor = "debug"\n'), [], world_size=1)
    assert isinstance(cfg, JobConfig)
    assert cfg.training.max_norm == 1.0 and isinstance(cfg.optimizer.betas, tuple)
    assert cfg.float8.enable is False and cfg.comm.nccl_max_ctas is None
    with pytest.raises(Exception):
        cfg.training.steps = 3  # frozen


@pytest.mark.parametrize("name", ["debug_moe.toml", "llama_moe.toml", "llama_moe_parity.toml"])
def test_shipped_configs_load(name):
    cfg = load_config(os.path.join(CONFIGS, name), [], world_size=2)
    assert cfg.training.seq_len <= cfg.model_args().max_seq_len


def test_overrides_both_spellings_and_bare_flags(tmp_path):
    path = write(tmp_path, '[training]\nsteps = 5\n')
    cfg = load_config(path, ["--training.steps=7", "--optimizer.lr", "0.01", "--checkpoint.enable",
                             "--optimizer.betas=[0.8, 0.9]", "--model.moe.top_k=1", "--model.n_layers", "2",
                             "--job.dump_folder=/tmp/x y", "--float8.filter_fqns=output,router"], world_size=1)
    assert cfg.training.steps == 7 and cfg.optimizer.lr == 0.01 and cfg.checkpoint.enable is True
    assert cfg.optimizer.betas == (0.8, 0.9) and cfg.job.dump_folder == "/tmp/x y"
    assert cfg.float8.filter_fqns == ["output", "router"]
    args = cfg.model_args()
    assert args.moe.top_k == 1 and args.n_layers == 2


def test_nested_model_table(tmp_path):
    cfg = load_config(write(tmp_path, '[model]\nflavor = "debug"\n[model.moe]\nnum_experts = 8\n'), [], 1)
    assert cfg.model_args().moe.num_experts == 8


@pytest.mark.parametrize("text, overrides, expect", [
    ("[trainig]\nsteps = 1\n", [], ["unknown section [trainig]", "[training]"]),
    ("[training]\nstep = 1\n", [], ["[training] step: unknown key", "steps"]),
    ("", ["--training.stepz=3"], ["--training.stepz", "unknown key", "steps"]),
    ("[training]\nsteps = \"ten\"\n", [], ["[training] steps", "expected an integer", "'ten'"]),
    ("[training]\nsteps = 2.5\n", [], ["[training] steps", "expected an integer"]),
    ("[checkpoint]\nenable = 1\n", [], ["[checkpoint] enable", "expected true or false"]),
    ("", ["--training.seq_len=abc"], ["--training.seq_len", "expected an integer"]),
    ("[optimizer]\nbetas = [0.9]\n", [], ["[optimizer] betas", "array of 2 numbers"]),
    ("[training]\nseq_len = 100000\n", [], ["[training] seq_len = 100000", "max_seq_len = 256"]),
    ("[model]\nflavor = \"huge\"\n", [], ["[model] flavor = 'huge'", "'debug'", "'llama_moe'"]),
    ("[model]\nmoe.top_k = 9\n", [], ["[model] moe.top_k", "top_k=9", "num_experts (4)"]),
    ("[model]\nn_heads = 3\n", [], ["[model] n_heads", "divisor of dim=64"]),
    ("[model]\nmoe.color = 1\n", [], ["[model] moe.color: unknown key", "top_k"]),
    ("[model]\nwidth = 1\n", [], ["[model] width: unknown key", "n_layers"]),
    ("[optimizer]\nlr = -1.0\n", [], ["[optimizer] lr = -1.0", "must be > 0"]),
    ("[parallelism]\nfsdp_forward_prefetch = -1\n", [], ["[parallelism] fsdp_forward_prefetch", "integer >= 0"]),
    ("[comm]\nmatmul_sm_carveout = 200\n", [], ["[comm] matmul_sm_carveout", "[0, 64]"]),
    ("[optimizer]\nname = \"SGD\"\n", [], ["[optimizer] name", "'AdamW'"]),
    ("[activation_checkpoint]\nmode = \"half\"\n", [], ["[activation_checkpoint] mode", "'selective'"]),
    ("[lr_scheduler]\ndecay_type = \"step\"\n", [], ["[lr_scheduler] decay_type", "'cosine'"]),
    ("[comm]\nnccl_max_ctas = 0\n", [], ["[comm] nccl_max_ctas = 0", "[1, 64]"]),
    ("[parallelism]\ndata_parallel_shard_degree = 3\n", [], ["data_parallel_shard_degree = 3",
                                                             "divisor of the world size 4"]),
    ("[parallelism]\ndata_parallel_replicate_degree = 3\n", [], ["data_parallel_replicate_degree = 3",
                                                                 "divisor of the world size 4"]),
    ("[parallelism]\ndata_parallel_shard_degree = 2\n", [], ["data_parallel_shard_degree = 2 with "
                                                             "data_parallel_replicate_degree = 1 gives 2 ranks",
                                                             "world size is 4", "-1"]),
    ("", ["--parallelism.data_parallel_replicate_degree=-1"], ["data_parallel_replicate_degree = -1",
                                                                "at most one of", "may be -1"]),
    ("[training]\ndataset = \"/nonexistent/x.bin\"\n", [], ["[training] dataset", "file not found"]),
    ("[training]\ndataset = \"corpus.txt\"\n", [], ["[training] dataset", "'stdlib' or a path to a .bin"]),
    ("[training\nsteps = 1\n", [], ["not valid TOML"]),
    ("[validation]\nfreq = 0\n", [], ["[validation] freq = 0", "must be >= 1"]),
    ("[training]\nnonfinite_check = \"later\"\n", [], ["[training] nonfinite_check = 'later'", "'deferred'",
                                                       "'before_optimizer'"]),
    ("[optimizer]\nfused = false\n", [], ["[training] nonfinite_check = 'deferred'", "[optimizer] fused = true"]),
    ("[validation]\nsteps = 0\n", [], ["[validation] steps = 0", "or -1 (the whole validation split)"]),
    ("[validation]\nenable = \"yes\"\n", [], ["[validation] enable", "expected true or false"]),
    ("[validation]\nevery = 5\n", [], ["[validation] every: unknown key", "enable, freq, steps"]),
    ("[training]\nval_batches = 4\n", [], ["[training] val_batches: this key was replaced by [validation] "
                                            "enable = true and steps = N"]),
    ("", ["--training.val_batches=2"], ["command line --training.val_batches: this key was replaced by "
                                        "[validation]"]),
])
def test_bad_inputs_give_one_line(tmp_path, text, overrides, expect):
    path = write(tmp_path, text)
    msg = error_of(path, overrides, world_size=4)
    for part in expect:
        assert part in msg, (part, msg)
    assert path in msg


def test_tensorboard_enabled_but_missing(tmp_path):
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed here")
    except ImportError:
        pass
    msg = error_of(write(tmp_path, "[metrics]\nenable_tensorboard = true\n"))
    assert "[metrics] enable_tensorboard" in msg and "not installed" in msg


def test_float8_errors_become_one_line(tmp_path):
    pytest.importorskip("titan_fp8.float8", reason="float8 layer not built yet")
    from titan_fp8 import float8

    if not hasattr(float8, "Float8Config"):
        pytest.skip("Float8Config not available yet")
    msg = error_of(write(tmp_path, '[float8]\nenable = true\nrecipe_name = "int4"\n'))
    assert "[float8] recipe_name" in msg
    load_config(write(tmp_path, '[float8]\nenable = true\nrecipe_name = "rowwise"\nemulate = true\n', "ok.toml"),
                [], 1)


def test_renamed_float8_expert_keys_name_their_replacement(tmp_path):
    msg = error_of(write(tmp_path, '[float8]\nconvert_experts = true\n'))
    assert "[float8] convert_experts: this key was replaced by moe_recipe_name" in msg and "\n" not in msg
    msg = error_of(write(tmp_path, '[float8]\nexperts_granularity = "mx32"\n', "b.toml"))
    assert "[float8] experts_granularity: this key was replaced by moe_granularity" in msg
    with pytest.raises(ConfigError, match="command line --float8.experts_granularity: this key was replaced by"):
        load_config(write(tmp_path, "", "c.toml"), ["--float8.experts_granularity=mx32"], 1)
    msg = error_of(write(tmp_path, '[float8]\nenable = true\nmoe_recipe_name = "mxfp8"\nmoe_granularity = "mx64"\n'
                         'emulate = true\n', "d.toml"))
    assert "[float8] moe_granularity: " in msg and "\n" not in msg
    cfg = load_config(write(tmp_path, '[float8]\nenable = true\nrecipe_name = "tensorwise"\n'
                                      'moe_recipe_name = "mxfp8"\nmoe_granularity = "mx32"\nemulate = true\n', "e.toml"),
                      [], 1)
    assert cfg.float8.moe_recipe_name == "mxfp8" and cfg.float8.moe_granularity == "mx32"
    assert cfg.float8.moe_keep_input_copy is False
    cfg = load_config(write(tmp_path, '[float8]\nenable = true\nmoe_recipe_name = "mxfp8"\nmoe_keep_input_copy = true\n'
                                      'emulate = true\n', "f.toml"), [], 1)
    assert cfg.float8.moe_keep_input_copy is True
    msg = error_of(write(tmp_path, '[float8]\nenable = true\nmoe_recipe_name = "mxfp8"\nmoe_keep_input_copy = 1\n'
                                   'emulate = true\n', "g.toml"))
    assert "[float8] moe_keep_input_copy" in msg


def test_nccl_max_ctas_from_config_or_environment(tmp_path, monkeypatch):
    path = write(tmp_path, "[comm]\nnccl_max_ctas = 16\n")
    cfg = load_config(path, [], world_size=1)
    monkeypatch.delenv("NCCL_MAX_CTAS", raising=False)
    line = apply_comm_env(cfg)
    assert os.environ["NCCL_MAX_CTAS"] == "16" and "16" in line and "[comm] nccl_max_ctas" in line and path in line
    monkeypatch.setenv("NCCL_MAX_CTAS", "4")
    line = apply_comm_env(cfg)
    assert os.environ["NCCL_MAX_CTAS"] == "4" and "from the environment" in line and "overrides" in line
    monkeypatch.delenv("NCCL_MAX_CTAS")
    assert "unset" in apply_comm_env(load_config(write(tmp_path, "", "e.toml"), [], 1))
    assert "NCCL_MAX_CTAS" not in os.environ


def run_launcher(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "train.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, expect", [
    (["--training.bogus=1"], "debug_moe.toml: command line --training.bogus: unknown key in [training]"),
    (["--training.steps=many"], "debug_moe.toml: command line --training.steps: expected an integer"),
    (["--model.moe.top_k=5"], "top_k=5"),
    (["--training.dataset=/nonexistent/tokens.bin"], "file not found"),
])
def test_launcher_prints_one_line_and_exits_nonzero(args, expect):
    proc = run_launcher("--config", os.path.join(CONFIGS, "debug_moe.toml"), *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_launcher_check_config_and_missing_file():
    ok = run_launcher("--config", os.path.join(CONFIGS, "debug_moe.toml"), "--check-config")
    assert ok.returncode == 0 and "config OK" in ok.stdout
    missing = run_launcher("--config", "nope.toml")
    assert missing.returncode == 2 and missing.stderr.strip() == "error: nope.toml: config file not found"


def test_float8_all_gather_that_cannot_be_honoured_is_a_start_up_config_error():
    """mxfp8 float8 all-gather needs whole weight tiles per FSDP shard ("mx32_tile32": 32 rows): the debug model's
    32-row wk/wv over 2 shards cannot, and that is a one-line ConfigError naming the file and [float8] key before
    any step runs ("mx32" would refuse the debug model's 64-wide Linears earlier: 128x128 tiles)."""
    import torch

    from titan_fp8.config import ConfigError, load_config
    from titan_fp8.train.trainer import build_model

    overrides = ["--float8.enable", "--float8.recipe_name=mxfp8", "--float8.linear_granularity=mx32_tile32",
                 "--float8.enable_fsdp_float8_all_gather", "--float8.emulate"]
    cfg = load_config("train_configs/debug_moe.toml", overrides, world_size=2)
    with pytest.raises(ConfigError, match=r"debug_moe.toml: \[float8\] enable_fsdp_float8_all_gather: .*attention.wk"):
        build_model(cfg, torch.device("cpu"), lambda *a: None)
    ok = load_config("train_configs/debug_moe.toml", overrides, world_size=1)  # 32 rows in one shard: fine
    build_model(ok, torch.device("cpu"), lambda *a: None)


def test_expert_dims_that_do_not_fit_the_moe_granularity_are_a_start_up_config_error():
    import torch

    from titan_fp8.config import ConfigError, load_config
    from titan_fp8.train.trainer import build_model

    over = ["--float8.enable", "--float8.moe_recipe_name=mxfp8", "--float8.emulate"]
    cfg = load_config("train_configs/debug_moe.toml", over, world_size=1)  # debug experts: dims 64, tiles 128
    with pytest.raises(ConfigError, match=r"debug_moe.toml: \[float8\] moe_granularity: layers.1.moe.experts .*128"):
        build_model(cfg, torch.device("cpu"), lambda *a: None)
    with pytest.raises(ConfigError, match=r"moe_granularity='mx32': .*multiples of 128"):  # 128-row tiles too
        build_model(load_config("train_configs/debug_moe.toml", over + ["--float8.moe_granularity=mx32"],
                                world_size=1), torch.device("cpu"), lambda *a: None)
    ok = load_config("train_configs/debug_moe.toml", over + ["--float8.moe_granularity=mx32_plain"], world_size=1)
    build_model(ok, torch.device("cpu"), lambda *a: None)


@pytest.mark.parametrize("replicate, shard, want", [(1, -1, (1, 4)), (2, -1, (2, 2)), (-1, 2, (2, 2)),
                                                    (4, 1, (4, 1)), (-1, 4, (1, 4)), (2, 2, (2, 2))])
def test_hsdp_degrees_resolve_to_the_world(tmp_path, replicate, shard, want):
    path = write(tmp_path, f"[parallelism]\ndata_parallel_replicate_degree = {replicate}\n"
                           f"data_parallel_shard_degree = {shard}\n")
    assert load_config(path, world_size=4).dp_degrees == want


def test_matmul_sm_carveout_on_cpu_is_logged_not_applied():
    from titan_fp8.config import load_config
    from titan_fp8.parallel import apply_matmul_sm_carveout
    cfg = load_config(os.path.join(CONFIGS, "debug_moe.toml"), ["--comm.matmul_sm_carveout=8"])
    assert apply_matmul_sm_carveout(cfg) == f"[comm] matmul_sm_carveout = 8 from {cfg.source}: not applied (no GPU)"
    assert apply_matmul_sm_carveout(load_config(os.path.join(CONFIGS, "debug_moe.toml"), [])) is None
