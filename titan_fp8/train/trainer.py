"""The training loop, top to bottom.

One step: take this rank's batch, forward, loss (+ the MoE auxiliary loss), backward, global grad norm and
clip, then ONE all-reduce of the step's check, [non-finite flag per rank, loss, aux loss, grad norm], which
every rank reads the same. Then the optimizer step, the scheduler, the router-bias update, the float8 scale
precompute, validation every [validation] freq steps, metrics on log steps, checkpoints.

When the host reads the check ([training] nonfinite_check) is the step's only host sync:
  "deferred" (default)  one step later. The GPU skips a failing step's update itself (the fused AdamW's
                        found_inf; the router biases likewise), so the host issues step N+1 while the GPU still
                        runs step N and stays at most one step ahead. A float8 step's host time is close to its
                        GPU time, and a mid-step wait left the GPU idle while the host issued the next forward.
                        Steps that are saved, validated, profiled, the first and the last are read at once, so
                        no checkpoint ever holds a failing step.
  "before_optimizer"    mid-step: the host waits for the whole backward and runs the optimizer only for a good
                        step."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from titan_fp8.config import JobConfig, describe
from titan_fp8.config import ConfigError
from titan_fp8.parallel import build_mesh, parallelize
from titan_fp8.train.checkpoint import CheckpointManager, incomplete_dirs, latest_step
from titan_fp8.train.data import PinnedStager, build_loader
from titan_fp8.train.garbage import GarbageCollection
from titan_fp8.train.gpu_lag import GpuLag, backward_lags_over_ranks
from titan_fp8.train.metrics import MetricsLogger
from titan_fp8.train.optim import build_lr_scheduler, build_optimizer, grad_norm_and_clip, take_grad_scale
from titan_fp8.train.profiling import StepProfiler
from titan_fp8.train.step_check import StepCheck


class NonFiniteStepError(RuntimeError):
    """A step's loss or gradient norm was not finite on some rank (and skipping is off)."""


@dataclasses.dataclass(frozen=True)
class FaultInjection:
    """Test hooks, read from the environment, that make failures reproducible:
    TITAN_FP8_FAULT_NAN_STEP / TITAN_FP8_FAULT_NAN_RANK: make that rank's loss NaN at that step;
    TITAN_FP8_FAULT_EXIT_AFTER_STEP: every rank dies abruptly (os._exit) after that step, like a kill."""

    nan_step: int = -1
    nan_rank: int = 0
    exit_after_step: int = -1

    @classmethod
    def from_env(cls) -> "FaultInjection":
        get = lambda k, d: int(os.environ.get(k, d))  # noqa: E731
        return cls(get("TITAN_FP8_FAULT_NAN_STEP", -1), get("TITAN_FP8_FAULT_NAN_RANK", 0),
                   get("TITAN_FP8_FAULT_EXIT_AFTER_STEP", -1))


@contextlib.contextmanager
def allow_sync(sync_debug: bool):
    """Host syncs we mean to make (the per-step check, checkpoint saves) are not reported by SYNC_DEBUG."""
    if not sync_debug:
        yield
        return
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def build_model(cfg: JobConfig, device: torch.device, log):
    """Model on the meta device (GPU) or CPU -> float8 conversion -> parallelize -> weights initialised."""
    from titan_fp8.models.llama_moe import Transformer

    args = cfg.model_args()
    torch.manual_seed(cfg.training.seed)
    if device.type == "cuda":
        with torch.device("meta"):
            model = Transformer(args)
    else:
        # On CPU every rank builds (and so initialises) the full model from the same seed before sharding,
        # so the weights do not depend on the number of ranks (the FSDP parity tests rely on it).
        model = Transformer(args)
    info = {
        "params_total": model.num_params(active_only=False),
        "params_active": model.num_params(active_only=True),
        "flops_per_token": model.flops_per_token(cfg.training.seq_len),
    }
    if cfg.float8.enable:
        from titan_fp8.float8 import Float8Config, check_float8_all_gather, convert_to_float8_training

        f8 = {f.name: getattr(cfg.float8, f.name) for f in dataclasses.fields(cfg.float8) if f.name != "enable"}
        try:  # a model the [float8] keys cannot convert (e.g. expert dims vs moe_granularity): start-up error
            convert_to_float8_training(model, Float8Config(**f8))
        except ValueError as e:
            raise ConfigError(f"{cfg.source}: [float8] {e}") from None
        if f8["enable_fsdp_float8_all_gather"]:
            # a flag that cannot be honoured is a start-up error, not a failure inside the first all-gather
            try:  # weights are gathered over the shard group only (HSDP: not across replicas)
                check_float8_all_gather(model, cfg.dp_degrees[1])
            except ValueError as e:
                raise ConfigError(f"{cfg.source}: [float8] {e}") from None
        log(f"float8: converted with {f8}")
    return model, info


def evaluate(model: torch.nn.Module, loader, batches: int, device: torch.device) -> float:
    """Mean cross-entropy over the first `batches` validation batches on every rank (eval mode, no grad).

    Every call sees the same batches (the loader is rewound), so successive values form a curve. Nothing of
    the training state moves: eval mode stops the router's load counting, no RNG is drawn, the training
    loader is a different object."""
    loader.batches_consumed = 0
    model.eval()
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for _ in range(batches):
            inputs, labels = (t.to(device) for t in loader.next_batch())
            total += F.cross_entropy(model(inputs).flatten(0, 1).float(), labels.flatten(0, 1))
    dist.all_reduce(total)
    model.train()
    return total.item() / (batches * dist.get_world_size())


def run(cfg: JobConfig, log=print) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    say = log if rank == 0 else (lambda *a, **k: None)
    faults = FaultInjection.from_env()
    t = cfg.training

    # ---- model, sharding, weights -------------------------------------------------------------------------
    mesh = build_mesh(cfg, device.type, world)
    model, info = build_model(cfg, device, say)
    model = parallelize(model, cfg, mesh)
    if device.type == "cuda":
        model.to_empty(device=device)
        torch.manual_seed(t.seed)
        with torch.no_grad():
            model.init_weights()
    model.train()

    # ---- optimizer, schedule, data ------------------------------------------------------------------------
    optimizer = build_optimizer(model, cfg.optimizer, device)
    scheduler = build_lr_scheduler(optimizer, cfg.lr_scheduler, t.steps)
    vocab_size = cfg.model_args().vocab_size
    # Every rank is a data-parallel rank (HSDP too: replicas and shards all see different rows), so the loader
    # shards by global rank; the 1-D / 2-D mesh only decides where weights and gradients travel.
    data_seed = t.seed if t.data_seed is None else t.data_seed
    data = build_loader(t.dataset, t.seq_len, t.local_batch_size, rank, world, data_seed, vocab_size)
    val_data, val_batches = None, 0
    if cfg.validation.enable:
        val_data = build_loader(t.dataset, t.seq_len, t.local_batch_size, rank, world, t.seed, vocab_size,
                                split="validation")
        whole_split = max(1, val_data.split.num_windows // val_data.global_batch)
        val_batches = cfg.validation.steps if cfg.validation.steps > 0 else whole_split
    params = [p for p in model.parameters() if p.requires_grad]

    # ---- resume -------------------------------------------------------------------------------------------
    ckpt = CheckpointManager(cfg.checkpoint_folder, model, optimizer, scheduler, data, log=say)
    start_step = 0
    if cfg.checkpoint.enable:
        for name in incomplete_dirs(cfg.checkpoint_folder):
            say(f"checkpoint: ignoring incomplete {os.path.join(cfg.checkpoint_folder, name)}")
        found = latest_step(cfg.checkpoint_folder)
        if found is not None:
            start_step = ckpt.load(found)["step"]
            say(f"checkpoint: resumed from {os.path.join(cfg.checkpoint_folder, f'step-{found}')} at step {start_step}")

    precompute_scales = cfg.float8.enable and cfg.float8.precompute_float8_dynamic_scale_for_fsdp
    if precompute_scales:
        from titan_fp8.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)  # scales for step 1's all-gathers (FACTS.md)

    # ---- header -------------------------------------------------------------------------------------------
    tokens_per_step = t.local_batch_size * t.seq_len
    metrics = MetricsLogger(cfg.job.dump_folder, rank, device, info["flops_per_token"], tokens_per_step,
                            cfg.metrics.enable_tensorboard, log=say, resumed_at_step=start_step or None)
    say(f"titan_fp8: {world} rank(s) on {metrics.device_name}, mesh {tuple(mesh.shape)} {mesh.mesh_dim_names}, "
        f"torch {torch.__version__}, config {cfg.source}")
    say(f"model: {cfg.model.name}/{cfg.model.flavor} {info['params_total'] / 1e6:.1f}M parameters, "
        f"{info['params_active'] / 1e6:.1f}M active per token; precision "
        f"{'bf16 params / fp32 reduce' if device.type == 'cuda' else 'fp32'}"
        f"{' + float8 ' + cfg.float8.recipe_name if cfg.float8.enable else ''}")
    say(metrics.header())
    if val_data is not None:
        say(f"validation: every {cfg.validation.freq} steps and at step {t.steps}, {val_batches} batch(es) of "
            f"{t.local_batch_size}x{t.seq_len} per rank from the held-out split ({val_data.split.num_windows} "
            "windows)")
    say("config:\n" + describe(cfg))

    # ---- the loop -----------------------------------------------------------------------------------------
    step = start_step
    last_saved = start_step if start_step else None
    last_skipped = False
    val_loss = None
    # TITAN_FP8_SYNC_DEBUG=1 (GPU): from the 3rd step on, warn at every host sync other than the check above,
    # with the line that caused it; a clean run prints no "called a synchronizing CUDA operation" warning.
    sync_debug = os.environ.get("TITAN_FP8_SYNC_DEBUG") == "1" and device.type == "cuda"
    profiler = StepProfiler(cfg.profiling, cfg.job.dump_folder, rank, device.type, log=say)
    collector = GarbageCollection(t.gc_freq)  # [training] gc_freq: collect at fixed steps, not mid-step
    lag = GpuLag(device)  # per step: the GPU work still queued when the host began it (0: host-bound)
    deferred = t.nonfinite_check == "deferred"
    waiting = None  # deferred: the step whose check the host has not read yet (at most one)

    def apply_update(found_inf):
        """The optimizer step and what follows it. found_inf (0-dim, on the device) = 1.0: the fused AdamW
        leaves parameters and moments as they are, and the router biases stay, as for a skipped step."""
        if found_inf is not None:
            optimizer.found_inf = found_inf  # read by the fused AdamW (what torch's GradScaler hands it)
        try:
            optimizer.step()  # with the clipping as its grad_scale when fused (grad_norm_and_clip)
        finally:
            take_grad_scale(optimizer)
            if found_inf is not None:
                del optimizer.found_inf
        scheduler.step()  # the schedule follows the step count, skipped or not
        optimizer.zero_grad(set_to_none=True)
        model.update_router_biases(skip=found_inf)
        if precompute_scales:
            precompute_float8_dynamic_scale_for_fsdp(model)  # ONE all-reduce for every float8 weight

    def read_check(check: StepCheck) -> None:
        """Wait for the check's values; a failing step stops the run here unless skip_nonfinite_steps."""
        with allow_sync(sync_debug):
            check.read()
        if check.nonfinite and not t.skip_nonfinite_steps:
            done = ("stopping before the optimizer step" if not deferred
                    else "stopping (the GPU skipped that step's update)")
            metrics.close()  # TensorBoard's events so far reach disk: a gloo run leaves by os._exit (launch/train.py)
            raise NonFiniteStepError(f"{check.describe()}; {done}, no checkpoint written. "
                                     "Set [training] skip_nonfinite_steps = true to skip such steps.")

    def settle(check: StepCheck, extra: dict | None = None) -> None:
        """Read a step's check and log its record (metrics on log steps)."""
        nonlocal last_skipped
        read_check(check)
        record = dict(extra or {})
        # the check has been read: the GPU is past the step's start and its backward's
        for key, phase in (("gpu_lag_ms", "step"), ("gpu_lag_backward_ms", "backward")):
            value = lag.read(check.step, phase)
            if value is not None:
                record[key] = value
        if check.nonfinite:
            say(f"{check.describe()}; step skipped ([training] skip_nonfinite_steps)")
            record["skipped"] = True
        else:
            if check.profiled:  # the profiler slows this step: its time stays out of the throughput
                record["profiled"] = True
            else:
                metrics.step_done(check.data_wait, check.sync_wait, check.seconds)
            if check.step == start_step + 1 and cfg.compile.enable:
                from torch._dynamo.utils import counters

                breaks = sum(counters["graph_break"].values())
                say(f"compile: {breaks} graph break(s) in the compiled blocks after the first step"
                    + ("" if not breaks else f": {str(dict(counters['graph_break']))[:400]}"))
            record["aux_loss"] = check.aux_loss
        last_skipped = check.nonfinite
        if (check.nonfinite or "val_loss" in record or check.step == start_step + 1
                or check.step % cfg.metrics.log_freq == 0 or check.step == t.steps):
            metrics.emit(check.step, t.steps, check.loss, check.grad_norm, check.lr, extra=record)

    # A step's time runs from the moment the previous step's work was all issued to the moment its own was: the
    # step period whichever step the host waits for. Host time that is not training (validation, checkpoint
    # saves, the profiler's export) is left out of the step after it.
    t_issued = time.perf_counter()
    not_training = 0.0
    stager = PinnedStager() if device.type == "cuda" else None
    for step in range(start_step + 1, t.steps + 1):
        collector.step(step)
        lag.mark(step)
        if sync_debug and step == start_step + 3:
            torch.cuda.set_sync_debug_mode("warn")
        profiler.begin(step)  # [profiling]: one step in every profile_freq
        t_data = time.perf_counter()
        inputs, labels = data.next_batch()
        if stager is not None:
            inputs, labels = stager.to_device(device, inputs, labels)
        data_wait = time.perf_counter() - t_data

        logits = model(inputs)
        ce_loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        if step == faults.nan_step and rank == faults.nan_rank:
            ce_loss = ce_loss * float("nan")
        aux_loss = torch.as_tensor(model.aux_loss(), device=device)
        loss = ce_loss + aux_loss
        lag.mark(step, "backward")
        loss.backward()
        grad_norm = grad_norm_and_clip(params, t.max_norm, optimizer).to(device)

        # The step's check: [loss non-finite on rank r for every r, loss, aux loss, grad norm], summed over
        # ranks in ONE all-reduce, so every rank reaches the same verdict. Its copy to the host starts now.
        bad = torch.zeros(world, device=device)
        bad[rank] = (~torch.isfinite(loss.detach())).float()
        stats = torch.cat([bad, torch.stack([ce_loss.detach(), aux_loss.detach().float(), grad_norm.float()])])
        dist.all_reduce(stats)
        profiled = profiler.wants(step)
        check = StepCheck.start(step, stats, world, scheduler.get_last_lr()[0], data_wait, profiled)
        validate = val_data is not None and (step % cfg.validation.freq == 0 or step == t.steps)
        save = cfg.checkpoint.enable and step % cfg.checkpoint.interval == 0
        if deferred:
            # The GPU skips a failing step's update itself (found_inf), so the host goes on without waiting;
            # it reads the PREVIOUS step's check, which keeps it at most one step ahead of the GPU.
            lag.mark(step, "optimizer")
            apply_update(check.found_inf)
            if waiting is not None:
                settle(waiting)
            waiting = check
            # a step whose outcome must be known now: saved, validated, profiled, the first, the last
            settle_now = (save or validate or profiled or step in (start_step + 1, t.steps)
                          or step == faults.exit_after_step)
        else:
            # The host waits for the whole backward, then runs the optimizer only for a good step.
            waiting, settle_now = check, True
            read_check(check)
            if not check.nonfinite:
                apply_update(None)
            elif t.skip_nonfinite_steps:
                take_grad_scale(optimizer)
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()  # the schedule follows the step count, skipped or not
        now = time.perf_counter()
        check.seconds, t_issued, not_training = now - t_issued - not_training, now, 0.0
        if profiled:
            profiler.end(step)
            not_training += time.perf_counter() - now
        if settle_now:
            read_check(check)
            val_extra = {}
            if validate:
                t_val = time.perf_counter()
                with allow_sync(sync_debug):
                    val_loss = evaluate(model, val_data, val_batches, device)
                not_training += time.perf_counter() - t_val  # validation is not training throughput
                val_extra["val_loss"] = val_loss
            settle(check, val_extra)
            waiting = None
            if save and not check.nonfinite:
                t_save = time.perf_counter()
                with allow_sync(sync_debug):
                    say(f"checkpoint: saved {ckpt.save(step)}")
                not_training += time.perf_counter() - t_save  # saving is not training throughput
                last_saved = step
        if step == faults.exit_after_step:
            # abrupt death of every rank, as if killed (tests of resume), once every rank is through the step: a
            # rank that died first could have torchrun kill rank 0 before it wrote the step's metrics record
            dist.barrier()
            os._exit(17)

    collector.close()
    lag.save(cfg.job.dump_folder, rank)
    if sync_debug:
        torch.cuda.set_sync_debug_mode(0)
    if dist.is_initialized() and lag.enabled:
        dist.barrier()  # every rank's gpu_lag file is written before rank 0 reads them for host_paced_share
    if cfg.checkpoint.enable and step != last_saved and not last_skipped and step > start_step:
        say(f"checkpoint: saved {ckpt.save(step)}")

    # the slowest host paces every rank: a step is host-paced when any rank's GPU sat idle at its backward
    summary = metrics.summary(skip_first=max(1, min(10, t.steps // 5)),
                              backward_lags=backward_lags_over_ranks(cfg.job.dump_folder, world) if rank == 0 else None)
    if val_data is not None:
        summary["val_loss"] = val_loss  # at the last step
    summary.update({"world_size": world, "config": cfg.source, "steps": t.steps, **info,
                    "float8": cfg.float8.recipe_name if cfg.float8.enable else None})
    if rank == 0:
        say("summary: " + json.dumps(summary))
        paced = summary.get("host_paced_share")
        if paced is not None and paced >= 0.25:
            say(f"host-paced: the GPU sat idle as the backward began in {100 * paced:.0f}% of the timed steps (on "
                "some rank): the host, not the GPU, set their pace. A larger [training] local_batch_size spreads the host's "
                "per-step work over more tokens (README: host-paced steps)")
        with open(os.path.join(cfg.job.dump_folder, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    metrics.close()
    return summary
