"""TOML job file -> typed, validated, frozen dataclasses (one per section).

This is the only module that knows TOML. Every bad input (unknown section or key, wrong type, impossible
value) raises `ConfigError` whose message is ONE line naming the file, the key and what is allowed;
launch/train.py prints it and exits non-zero, without a traceback.

Command-line overrides use the same names: `--training.steps=20` or `--training.steps 20`; a bare boolean
key (`--checkpoint.enable`) means true.

[model] takes `name`, `flavor`, and optionally any field of the flavor's `ModelArgs` (for example
`n_layers = 2`) to override that flavor.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A bad job configuration; str(err) is one line naming the file, the key and what is allowed."""


# --------------------------------------------------------------------------------------------------
# Sections. Field defaults are the defaults of the job file; types are enforced when loading.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    dump_folder: str = "./outputs"
    description: str = ""


@dataclass(frozen=True)
class Model:
    name: str = "llama_moe"
    flavor: str = "debug"
    # Any ModelArgs field set in [model]; applied on top of the flavor (validated against ModelArgs).
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Training:
    local_batch_size: int = 8
    seq_len: int = 256
    steps: int = 100
    max_norm: float = 1.0  # grad-norm clipping; 0 disables clipping (the norm is still measured)
    seed: int = 42  # initialization, and the training batch order unless data_seed is set
    # Training batch order; None: `seed`. compare.py's extra baseline seeds keep it at the first seed, so the
    # seed-to-seed difference they measure is the noise of initialization, on the data every recipe sees.
    data_seed: Optional[int] = None
    skip_nonfinite_steps: bool = False
    # When the host reads the step's check ([non-finite flags, loss, aux loss, grad norm], one all-reduce):
    #   "deferred"          a step later: the GPU itself skips a failing step's update (fused AdamW's found_inf,
    #                       router biases likewise), so the host may issue step N+1 while the GPU still runs N
    #                       (a float8 step's host time is close to its GPU time: waiting mid-step idles the GPU);
    #                       errors and skips are reported one step late, never after a checkpoint of a bad step
    #   "before_optimizer"  mid-step, before the optimizer: the host waits for the whole backward every step
    nonfinite_check: str = "deferred"
    # Python's cyclic GC: automatic collection off, a generation-1 collection before every gc_freq-th step
    # (torchtitan's key; titan_fp8/train/garbage.py says why); 0 keeps Python's automatic collector
    gc_freq: int = 50
    dataset: str = "stdlib"  # "stdlib" or a path to a .bin token file with a <file>.json sidecar


@dataclass(frozen=True)
class Validation:
    """Loss on the held-out split of [training] dataset (torchtitan's names). The same validation batches are
    used every time and by every run, whatever its seed (data.VALIDATION_SEED), so the curve is comparable
    across steps and across runs; validating touches no training state."""

    enable: bool = False
    freq: int = 10  # validate every `freq` steps, and at the last step
    steps: int = -1  # validation batches per rank each time; -1: one pass over the whole validation split


@dataclass(frozen=True)
class Optimizer:
    name: str = "AdamW"
    lr: float = 3e-4
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    fused: bool = True  # the fused AdamW kernel (GPU and CPU); [training] nonfinite_check = "deferred" needs it


@dataclass(frozen=True)
class LRScheduler:
    warmup_steps: int = 10
    decay_type: str = "cosine"  # "cosine" | "linear" | "constant"
    min_lr_factor: float = 0.1  # final lr = lr * min_lr_factor


@dataclass(frozen=True)
class Parallelism:
    """torchtitan's names. replicate x shard == world size; -1 on one of them means "the rest". replicate > 1 is
    HSDP: a 2-D (dp_replicate, dp_shard) mesh, each replica group sharding its weights with FSDP2 (put the shard
    group inside a node, the replicas across nodes)."""

    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    # > 1: the routed experts are split over this many ranks (consecutive ranks inside one shard group) and
    # tokens travel to them by all-to-all; must divide data_parallel_shard_degree and num_experts
    expert_parallel_degree: int = 1
    # torchtitan's key. When a block's FSDP2 unit frees its gathered weights after forward: "default" = every block
    # but the last (backward gathers them again), "always" = every block, "never" = none (no gather in backward,
    # and for float8 no second cast / quantization of the weights: memory for the whole model's gathered weights)
    fsdp_reshard_after_forward: str = "default"
    # How many of the following blocks' all-gathers a block issues in its pre-forward (FSDP2
    # set_modules_to_forward_prefetch). 0: FSDP2's own order, where a block's all-gather is issued when the host
    # reaches that block, which is late when the host is barely ahead of the GPU (float8's subclass dispatch).
    # Costs one more block of gathered weights per step of depth. Backward keeps FSDP2's implicit one-block prefetch.
    fsdp_forward_prefetch: int = 0


@dataclass(frozen=True)
class Checkpoint:
    enable: bool = False
    interval: int = 500
    folder: str = "checkpoint"  # relative to [job] dump_folder unless absolute


@dataclass(frozen=True)
class Metrics:
    log_freq: int = 10
    enable_tensorboard: bool = False


@dataclass(frozen=True)
class Profiling:
    enable_profiling: bool = False
    save_traces_folder: str = "profile_traces"  # under [job] dump_folder
    profile_freq: int = 10  # profile one step every profile_freq steps (steps profile_freq, 2*profile_freq, ...)


@dataclass(frozen=True)
class ActivationCheckpoint:
    mode: str = "none"  # "none" | "full" | "selective"


@dataclass(frozen=True)
class Compile:
    enable: bool = False


@dataclass(frozen=True)
class Comm:
    nccl_max_ctas: Optional[int] = None  # exported as NCCL_MAX_CTAS unless the environment already sets it
    # "gpu_numa_node": each rank runs on the CPUs of its GPU's NUMA node (train/affinity.py); "none": the OS places it
    cpu_affinity: str = "none"
    # SMs every persistent GEMM leaves free (torch's SM carve-out: cuBLAS(Lt), torch's grouped / scaled CUTLASS
    # GEMMs, our CUTLASS mx128 grouped GEMM), so that NCCL's CTAs find an SM while a GEMM runs: an FSDP2
    # all-gather under persistent GEMMs can take ~10x its time alone. None: no carve-out.
    matmul_sm_carveout: Optional[int] = None


@dataclass(frozen=True)
class Float8:
    enable: bool = False
    recipe_name: str = "tensorwise"
    enable_fsdp_float8_all_gather: bool = False
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    filter_fqns: list = field(default_factory=lambda: ["output", "router"])
    emulate: bool = False
    moe_recipe_name: str = "none"  # routed experts: "none" | "fp8_rowwise" | "mxfp8"
    moe_granularity: Optional[str] = None  # mxfp8 experts: "mx128" (default) | "mx32" | "mx32_plain"
    # recipe_name = "mxfp8" Linears: "mx32_tile32" (default) | "mx32" | "mx128"
    linear_granularity: Optional[str] = None
    # expert parallelism: what the dispatch all-to-all carries. "float8" sends the experts' float8 input
    # (rows + scales, the first grouped GEMM's layout); needs moe_recipe_name != "none". Combine stays bf16.
    dispatch_dtype: str = "bf16"
    # float8 experts: keep their float8 token-major copy of the layer input from forward to backward (faster:
    # no remake in backward) instead of remaking it from the input the router keeps anyway (default: less memory)
    moe_keep_input_copy: bool = False


@dataclass(frozen=True)
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    validation: Validation = field(default_factory=Validation)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    parallelism: Parallelism = field(default_factory=Parallelism)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    metrics: Metrics = field(default_factory=Metrics)
    profiling: Profiling = field(default_factory=Profiling)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    compile: Compile = field(default_factory=Compile)
    comm: Comm = field(default_factory=Comm)
    float8: Float8 = field(default_factory=Float8)
    # Where it came from (for messages and the log); not a TOML key.
    source: str = "<defaults>"
    world_size: int = 1

    @property
    def dp_degrees(self) -> tuple[int, int]:
        """(replicate, shard) with -1 resolved against world_size (validated when the config loaded)."""
        r, s = self.parallelism.data_parallel_replicate_degree, self.parallelism.data_parallel_shard_degree
        if r == -1:
            return self.world_size // s, s
        if s == -1:
            return r, self.world_size // r
        return r, s

    @property
    def checkpoint_folder(self) -> str:
        return os.path.join(self.job.dump_folder, self.checkpoint.folder)

    def model_args(self):
        """The flavor's ModelArgs with the [model] overrides applied (validated when the config loaded)."""
        from titan_fp8.models.llama_moe import FLAVORS

        return build_model_args(FLAVORS[self.model.flavor], self.model.overrides)


SECTIONS: dict[str, type] = {
    "job": Job,
    "model": Model,
    "training": Training,
    "validation": Validation,
    "optimizer": Optimizer,
    "lr_scheduler": LRScheduler,
    "parallelism": Parallelism,
    "checkpoint": Checkpoint,
    "metrics": Metrics,
    "profiling": Profiling,
    "activation_checkpoint": ActivationCheckpoint,
    "compile": Compile,
    "comm": Comm,
    "float8": Float8,
}

# Keys that were renamed: a config still using one gets an error naming the replacement.
RENAMED_KEYS = {
    ("float8", "convert_experts"): "moe_recipe_name (\"none\" | \"fp8_rowwise\" | \"mxfp8\"; experts are no "
                                   "longer tied to recipe_name)",
    ("float8", "experts_granularity"): "moe_granularity (with moe_recipe_name = \"mxfp8\")",
    ("training", "val_batches"): "[validation] enable = true and steps = N (validation batches per rank; it now "
                                 "also runs every [validation] freq steps, not only at the end)",
}

# Declared element types of the container fields (the dataclass annotations stay simple).
_ELEMENT_TYPES = {("optimizer", "betas"): (float, 2), ("float8", "filter_fqns"): (str, None)}


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_config(path: str, overrides: list[str] = (), world_size: Optional[int] = None) -> JobConfig:
    """Read `path` (TOML), apply `--section.key=value` overrides, validate, return a JobConfig."""
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None

    values: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], str] = {}  # (section, key) -> where the value came from
    for section, table in raw.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"{path}: unknown section [{section}]; allowed: {', '.join('[' + s + ']' for s in SECTIONS)}"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: '{section}' must be a [{section}] table, got a {_tname(table)}")
        for key, value in table.items():
            if section == "model" and isinstance(value, dict):  # [model.moe] / moe.top_k = ...
                for sub, v in value.items():
                    values.setdefault(section, {})[f"{key}.{sub}"] = v
                    origin[(section, f"{key}.{sub}")] = path
                continue
            values.setdefault(section, {})[key] = value
            origin[(section, key)] = path

    for section, key, text in _parse_overrides(overrides, path):
        typ = _declared_type(section, key, path)
        if text is None and typ is not bool and not (typ is None and section == "model"):
            raise ConfigError(f"{path}: command line --{section}.{key}: needs a value (--{section}.{key}=VALUE)")
        values.setdefault(section, {})[key] = _parse_cli_value(text, typ)
        origin[(section, key)] = "cli"

    def where(section: str, key: str) -> str:
        if origin.get((section, key)) == "cli":
            return f"{path}: command line --{section}.{key}"
        return f"{path}: [{section}] {key}"

    sections = {}
    for name, cls in SECTIONS.items():
        given = values.get(name, {})
        kwargs = {}
        model_overrides = {}
        known = {f.name: f for f in dataclasses.fields(cls) if not (cls is Model and f.name == "overrides")}
        for key, value in given.items():
            if key not in known:
                if (name, key) in RENAMED_KEYS:
                    raise ConfigError(f"{where(name, key)}: this key was replaced by {RENAMED_KEYS[(name, key)]}")
                if cls is Model:
                    model_overrides[key] = value  # checked against ModelArgs below
                    continue
                raise ConfigError(f"{where(name, key)}: unknown key; allowed: {', '.join(known)}")
            kwargs[key] = _check_type(name, key, value, known[key], where(name, key))
        if cls is Model:
            kwargs["overrides"] = model_overrides
        sections[name] = cls(**kwargs)

    cfg = JobConfig(**sections, source=path, world_size=world_size)
    _validate(cfg, where)
    return cfg


def _tname(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


def _declared_type(section: str, key: str, path: str):
    if section not in SECTIONS:
        raise ConfigError(
            f"{path}: command line --{section}.{key}: unknown section [{section}]; allowed: {', '.join(SECTIONS)}"
        )
    cls = SECTIONS[section]
    for f in dataclasses.fields(cls):
        if f.name == key and not (cls is Model and key == "overrides"):
            return _base_type(f)
    if cls is Model:
        return None  # a ModelArgs field; typed against ModelArgs later
    if (section, key) in RENAMED_KEYS:
        raise ConfigError(f"{path}: command line --{section}.{key}: this key was replaced by "
                          f"{RENAMED_KEYS[(section, key)]}")
    allowed = ", ".join(f.name for f in dataclasses.fields(cls))
    raise ConfigError(f"{path}: command line --{section}.{key}: unknown key in [{section}]; allowed: {allowed}")


def _base_type(f: dataclasses.Field):
    hints = typing.get_type_hints(_owner_of(f))
    t = hints[f.name]
    if typing.get_origin(t) is typing.Union:  # Optional[X]
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return t


def _owner_of(f: dataclasses.Field) -> type:
    for cls in SECTIONS.values():
        if any(g is f for g in dataclasses.fields(cls)):
            return cls
    raise KeyError(f.name)


def _parse_overrides(argv: list[str], path: str) -> list[tuple[str, str, Optional[str]]]:
    """`--a.b=v`, `--a.b v`, bare `--a.b` (boolean true) -> [(section, key, text-or-None)]."""
    out = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError(f"{path}: command line: cannot read '{arg}'; overrides look like --section.key=value")
        name, eq, text = arg[2:].partition("=")
        section, _, key = name.partition(".")
        if not section or not key or ("." in key and section != "model"):
            raise ConfigError(f"{path}: command line: cannot read '{arg}'; overrides look like --section.key=value")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            typ = _declared_type(section, key, path)
            takes_next = nxt is not None and not nxt.startswith("--")
            if typ is bool and takes_next and nxt.lower() not in ("true", "false", "1", "0"):
                takes_next = False
            if takes_next:
                text = nxt
                i += 1
            else:
                text = None  # bare flag
        out.append((section, key, text))
        i += 1
    return out


def _parse_cli_value(text: Optional[str], typ) -> Any:
    if text is None:
        return True  # bare --section.flag; a non-boolean key fails the type check with a clear message
    low = text.strip().lower()
    if typ is bool or low in ("true", "false"):
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        return text
    if typ is str:
        return text
    try:  # numbers and arrays read as TOML values
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if typ in (list, tuple):
            return [s.strip() for s in text.split(",") if s.strip()]
        return text


def _check_type(section: str, key: str, value: Any, f: dataclasses.Field, where: str) -> Any:
    typ = _base_type(f)
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_tname(value)} {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_tname(value)} {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {_tname(value)} {value!r}")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_tname(value)} {value!r}")
        return value
    if typ in (list, tuple):
        elem, length = _ELEMENT_TYPES[(section, key)]
        what = f"an array of {length} numbers" if elem is float else "an array of strings"
        if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length):
            raise ConfigError(f"{where}: expected {what}, got {_tname(value)} {value!r}")
        for v in value:
            ok = isinstance(v, str) if elem is str else (isinstance(v, (int, float)) and not isinstance(v, bool))
            if not ok:
                raise ConfigError(f"{where}: expected {what}, got element {v!r}")
        return tuple(float(v) for v in value) if typ is tuple else list(value)
    raise AssertionError(f"unhandled config type {typ} for {section}.{key}")


# --------------------------------------------------------------------------------------------------
# Validation of values (ranges and cross-section rules)
# --------------------------------------------------------------------------------------------------


def _validate(cfg: JobConfig, where) -> None:
    def need(ok: bool, section: str, key: str, allowed: str, value: Any = None) -> None:
        if not ok:
            if value is None:
                value = getattr(getattr(cfg, section), key)
            raise ConfigError(f"{where(section, key)} = {value!r} is not allowed; {allowed}")

    need(cfg.job.dump_folder.strip() != "", "job", "dump_folder", "give a folder path")
    need(cfg.model.name == "llama_moe", "model", "name", "allowed: 'llama_moe'")
    t = cfg.training
    need(t.local_batch_size >= 1, "training", "local_batch_size", "must be >= 1")
    need(t.nonfinite_check in ("deferred", "before_optimizer"), "training", "nonfinite_check",
         "allowed: 'deferred', 'before_optimizer'")
    need(t.nonfinite_check != "deferred" or cfg.optimizer.fused, "training", "nonfinite_check",
         "'deferred' needs [optimizer] fused = true (the fused AdamW skips a failing step's update on the device); "
         "set fused = true or nonfinite_check = 'before_optimizer'")
    need(t.seq_len >= 2, "training", "seq_len", "must be >= 2")
    need(t.steps >= 1, "training", "steps", "must be >= 1")
    need(t.max_norm >= 0, "training", "max_norm", "must be >= 0 (0 disables clipping)")
    need(t.gc_freq >= 0, "training", "gc_freq", "must be >= 0 (0: Python's automatic garbage collection)")
    need(0 <= t.seed < 2**63, "training", "seed", "must be in [0, 2**63)")
    need(t.data_seed is None or 0 <= t.data_seed < 2**63, "training", "data_seed", "must be in [0, 2**63)")
    if t.dataset != "stdlib":
        need(t.dataset.endswith(".bin"), "training", "dataset", "allowed: 'stdlib' or a path to a .bin token file")
        need(os.path.isfile(t.dataset), "training", "dataset", "file not found (expected a .bin token file)")
    v = cfg.validation
    need(v.freq >= 1, "validation", "freq", "must be >= 1 (validate every freq steps and at the last step)")
    need(v.steps == -1 or v.steps >= 1, "validation", "steps",
         "must be >= 1 (batches per rank) or -1 (the whole validation split)")
    o = cfg.optimizer
    need(o.name == "AdamW", "optimizer", "name", "allowed: 'AdamW'")
    need(o.lr > 0, "optimizer", "lr", "must be > 0")
    need(o.weight_decay >= 0, "optimizer", "weight_decay", "must be >= 0")
    need(all(0 <= b < 1 for b in o.betas), "optimizer", "betas", "each beta must be in [0, 1)", list(o.betas))
    need(o.eps > 0, "optimizer", "eps", "must be > 0")
    s = cfg.lr_scheduler
    need(s.warmup_steps >= 0, "lr_scheduler", "warmup_steps", "must be >= 0")
    need(s.decay_type in ("cosine", "linear", "constant"), "lr_scheduler", "decay_type",
         "allowed: 'cosine', 'linear', 'constant'")
    need(0 <= s.min_lr_factor <= 1, "lr_scheduler", "min_lr_factor", "must be in [0, 1]")
    _validate_parallelism(cfg, where, need)
    c = cfg.checkpoint
    need(c.interval >= 1, "checkpoint", "interval", "must be >= 1")
    need(c.folder.strip() != "", "checkpoint", "folder", "give a folder path")
    need(cfg.metrics.log_freq >= 1, "metrics", "log_freq", "must be >= 1")
    if cfg.metrics.enable_tensorboard:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            need(False, "metrics", "enable_tensorboard", "the tensorboard package is not installed "
                 "(pip install tensorboard, or set it to false)")
    need(cfg.profiling.profile_freq >= 1, "profiling", "profile_freq", "must be >= 1")
    need(cfg.profiling.save_traces_folder.strip() != "", "profiling", "save_traces_folder", "give a folder path")
    need(cfg.activation_checkpoint.mode in ("none", "full", "selective"), "activation_checkpoint", "mode",
         "allowed: 'none', 'full', 'selective'")
    n = cfg.comm.nccl_max_ctas
    need(n is None or 1 <= n <= 64, "comm", "nccl_max_ctas", "must be in [1, 64] (NCCL's range)")
    c = cfg.comm.matmul_sm_carveout
    need(c is None or 0 <= c <= 64, "comm", "matmul_sm_carveout", "must be in [0, 64] (SMs left to NCCL) or unset")
    need(cfg.comm.cpu_affinity in ("none", "gpu_numa_node"), "comm", "cpu_affinity",
         "allowed: 'none', 'gpu_numa_node'")
    _validate_float8(cfg, where)
    _validate_model(cfg, where)


def _validate_parallelism(cfg: JobConfig, where, need) -> None:
    """data_parallel_replicate_degree x data_parallel_shard_degree == world size, at most one of them -1."""
    p, world = cfg.parallelism, cfg.world_size
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree"):
        d = getattr(p, key)
        need(d == -1 or (d >= 1 and world % d == 0), "parallelism", key,
             f"allowed: -1 (the rest of the ranks) or a divisor of the world size {world}")
    need(p.fsdp_reshard_after_forward in ("default", "always", "never"), "parallelism", "fsdp_reshard_after_forward",
         "allowed: 'default', 'always', 'never'")
    need(isinstance(p.fsdp_forward_prefetch, int) and p.fsdp_forward_prefetch >= 0, "parallelism",
         "fsdp_forward_prefetch", "allowed: an integer >= 0 (blocks whose all-gather a block issues ahead)")
    r, s = p.data_parallel_replicate_degree, p.data_parallel_shard_degree
    need(not (r == -1 and s == -1), "parallelism", "data_parallel_replicate_degree",
         "at most one of data_parallel_replicate_degree and data_parallel_shard_degree may be -1 (the rest)")
    if r != -1 and s != -1 and r * s != world:
        raise ConfigError(f"{where('parallelism', 'data_parallel_shard_degree')} = {s} with "
                          f"data_parallel_replicate_degree = {r} gives {r * s} ranks, but the world size is {world}; "
                          f"replicate x shard must equal it (set one of them to -1: the rest)")
    # expert parallelism: the EP group is ep consecutive ranks inside one shard group (rank = r*S + m*ep + e);
    # experts are then FSDP-sharded over the remaining replicate x shard/ep ranks (num_experts is checked
    # against ep in _validate_model)
    ep = p.expert_parallel_degree
    need(ep >= 1, "parallelism", "expert_parallel_degree", "must be >= 1 (1 = no expert parallelism)")
    if ep > 1:
        shard = cfg.dp_degrees[1]
        need(shard % ep == 0, "parallelism", "expert_parallel_degree",
             f"must divide the data-parallel shard degree ({shard}): the EP group lies inside one shard group")
    f8 = cfg.float8
    need(f8.dispatch_dtype in ("bf16", "float8"), "float8", "dispatch_dtype", "allowed: 'bf16', 'float8'")
    if f8.dispatch_dtype == "float8":
        need(f8.enable and f8.moe_recipe_name != "none", "float8", "dispatch_dtype",
             "'float8' sends the float8 experts' input: needs [float8] enable = true and moe_recipe_name "
             "'fp8_rowwise' or 'mxfp8'")
        need(ep > 1, "float8", "dispatch_dtype",
             "'float8' sets what the expert-parallel all-to-all carries: needs [parallelism] "
             "expert_parallel_degree > 1")


def _validate_float8(cfg: JobConfig, where) -> None:
    f8 = cfg.float8
    if not f8.enable:
        return
    try:
        from titan_fp8.float8 import Float8Config
    except ImportError as e:
        raise ConfigError(f"{where('float8', 'enable')}: float8 training is not available ({e})") from None
    kwargs = {f.name: getattr(f8, f.name) for f in dataclasses.fields(Float8) if f.name != "enable"}
    try:
        Float8Config(**kwargs)
    except (ValueError, TypeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        key = next((k for k in kwargs if msg.startswith(k)), None) or next((k for k in kwargs if k in msg),
                                                                          "recipe_name")
        raise ConfigError(f"{where('float8', key)}: {msg}") from None


def build_model_args(flavor_args, overrides: dict):
    """Apply [model] overrides to a flavor's ModelArgs; "moe.top_k" sets a field of a nested dataclass."""
    top, nested = {}, {}
    for key, value in overrides.items():
        head, _, tail = key.partition(".")
        if tail:
            nested.setdefault(head, {})[tail] = value
        else:
            top[key] = value
    for head, fields_ in nested.items():
        top[head] = dataclasses.replace(getattr(flavor_args, head), **fields_)
    return dataclasses.replace(flavor_args, **top)


def _validate_model(cfg: JobConfig, where) -> None:
    try:
        from titan_fp8.models.llama_moe import FLAVORS, ModelArgs
    except ImportError as e:
        raise ConfigError(f"{where('model', 'name')}: cannot import the model ({e})") from None
    m = cfg.model
    if m.flavor not in FLAVORS:
        raise ConfigError(f"{where('model', 'flavor')} = {m.flavor!r} is not allowed; allowed: "
                          f"{', '.join(repr(k) for k in FLAVORS)}")
    base = FLAVORS[m.flavor]
    for key, value in m.overrides.items():
        head, _, tail = key.partition(".")
        top_fields = {f.name for f in dataclasses.fields(ModelArgs)}
        allowed = f"allowed: name, flavor, or a ModelArgs field ({', '.join(sorted(top_fields))})"
        if head not in top_fields:
            raise ConfigError(f"{where('model', key)}: unknown key; {allowed}")
        sub = getattr(base, head)
        if dataclasses.is_dataclass(sub):
            sub_fields = [f.name for f in dataclasses.fields(sub)]
            if not tail:
                raise ConfigError(f"{where('model', key)}: set the fields of {head} one by one as {head}.<field> "
                                  f"({', '.join(sub_fields)})")
            if tail not in sub_fields or "." in tail:
                raise ConfigError(f"{where('model', key)}: unknown key; allowed {head}.<field> with field one of "
                                  f"{', '.join(sub_fields)}")
            _check_model_value(typing.get_type_hints(type(sub)).get(tail), value, where("model", key))
        else:
            if tail:
                raise ConfigError(f"{where('model', key)}: unknown key; {head} has no fields; {allowed}")
            _check_model_value(typing.get_type_hints(ModelArgs).get(head), value, where("model", key))
    try:
        args = build_model_args(base, m.overrides)
    except (ValueError, TypeError, AssertionError) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        key = next((k for k in m.overrides if k.split(".")[-1] in msg), "flavor")
        raise ConfigError(f"{where('model', key)}: {msg}") from None
    ep = cfg.parallelism.expert_parallel_degree
    if ep > 1 and args.moe.num_experts % ep:
        raise ConfigError(f"{where('parallelism', 'expert_parallel_degree')} = {ep} is not allowed; it must divide "
                          f"the number of routed experts ({args.moe.num_experts}, [model] moe.num_experts)")
    max_seq = getattr(args, "max_seq_len", None)
    if max_seq is not None and cfg.training.seq_len > max_seq:
        raise ConfigError(f"{where('training', 'seq_len')} = {cfg.training.seq_len} is not allowed; must be "
                          f"<= max_seq_len = {max_seq} of flavor '{m.flavor}' (or raise [model] max_seq_len)")


def _check_model_value(hint, value: Any, where: str) -> None:
    if hint is None:
        return
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else None
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {_tname(value)} {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: expected an integer, got {_tname(value)} {value!r}")
    if hint is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{where}: expected a number, got {_tname(value)} {value!r}")
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {_tname(value)} {value!r}")


def describe(cfg: JobConfig) -> str:
    """A compact multi-line dump of the effective configuration for the log header."""
    lines = []
    for name in SECTIONS:
        sec = getattr(cfg, name)
        items = ", ".join(f"{f.name}={getattr(sec, f.name)!r}" for f in dataclasses.fields(sec))
        lines.append(f"  [{name}] {items}")
    return "\n".join(lines)
