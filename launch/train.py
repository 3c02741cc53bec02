"""Train a Llama-MoE model with FSDP2.

    torchrun --standalone --nproc_per_node=2 launch/train.py --config train_configs/llama_moe.toml [--section.key=value ...]
    python launch/train.py --config train_configs/debug_moe.toml          # one process, no torchrun needed
    python launch/train.py --config FILE --check-config                   # validate and exit

Configuration, data and checkpoint errors print one line (file, key, what is allowed) and exit with status 2;
a non-finite step exits with status 3; any other error prints its traceback and exits with status 1 at once, without
waiting for the other ranks (they may be waiting in a collective for this one).
"""

from __future__ import annotations

import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run from a checkout without installing

from titan_fp8.config import ConfigError, load_config  # noqa: E402

USAGE = "usage: launch/train.py --config FILE [--check-config] [--section.key=value ...]"


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _fail(msg: str, code: int) -> int:
    if _is_rank0():
        print(f"error: {msg}", file=sys.stderr, flush=True)
    return code


def _log(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    config_path, check_only, overrides = None, False, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            config_path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        elif arg == "--check-config":
            check_only = True
        elif arg in ("-h", "--help"):
            print(__doc__ + "\n" + USAGE)
            return 0
        else:
            overrides.append(arg)
        i += 1
    if config_path is None:
        return _fail(f"no --config FILE given; {USAGE}", 2)

    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        return _fail(str(e), 2)

    from titan_fp8.train.data import DataError, check_dataset

    try:
        check_dataset(cfg.training.dataset, cfg.model_args().vocab_size)
    except DataError as e:
        return _fail(f"{config_path}: [training] dataset: {e}", 2)
    if check_only:
        if _is_rank0():
            print(f"config OK: {config_path}", flush=True)
        return 0

    import torch
    import torch.distributed as dist

    from titan_fp8.parallel import apply_comm_env, apply_matmul_sm_carveout
    from titan_fp8.train.checkpoint import CheckpointError
    from titan_fp8.train.trainer import NonFiniteStepError, run

    comm_line = apply_comm_env(cfg)  # before the process group exists
    affinity_line = None
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        backend, device_id = "nccl", torch.device("cuda", local_rank)
        if cfg.comm.cpu_affinity == "gpu_numa_node":
            from titan_fp8.train.affinity import AffinityError, bind_to_gpu_numa_node
            try:
                affinity_line = bind_to_gpu_numa_node(local_rank)
            except AffinityError as e:
                return _fail(str(e), 2)
    else:
        backend, device_id = "gloo", None
        if cfg.comm.cpu_affinity != "none":
            return _fail(f"{cfg.source}: [comm] cpu_affinity = {cfg.comm.cpu_affinity!r} binds each rank to its "
                         f"GPU's CPUs; there is no GPU here (use 'none')", 2)
    try:
        carveout_line = apply_matmul_sm_carveout(cfg)
    except RuntimeError as e:
        return _fail(str(e), 2)
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device_id)
    else:  # a single process started without torchrun
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id)
    if _is_rank0():
        _log(comm_line + ("" if backend == "nccl" else " (not used: gloo backend)"))
        for line in (affinity_line, carveout_line):
            if line:
                _log(line)

    code = 0
    try:
        run(cfg, log=_log)
        dist.barrier()
    except NonFiniteStepError as e:
        code = _fail(str(e), 3)
    except (ConfigError, DataError, CheckpointError) as e:  # found once the model exists (float8 checks)
        code = _fail(str(e), 2)
    except BaseException:
        # An unexpected error can stop one rank while the others wait for it in a collective (e.g. a compile error
        # on one rank only). Destroying the process group would then wait for them forever (NCCL), and Python
        # prints the traceback only after `finally`: a silent stall. Print it and leave now; torchrun stops the
        # other ranks.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()
    if backend == "gloo":
        # Leave now, without the interpreter's finalization. torch's gloo ProcessGroup has no shutdown():
        # destroy_process_group only unregisters it, and DTensor's caches keep it (and its worker threads) alive
        # past the end of main. A worker frees the works it ran after the caller has moved on, and a barrier's work
        # holds weak references to the works queued or running before it, so the last all-reduce's tensors can go
        # only when the worker drops the barrier. A tensor Python once held needs the GIL to go; a thread that asks
        # for it once the interpreter is finalizing is ended by pthread_exit, which unwinds through a noexcept
        # destructor: std::terminate ("terminate called without an active exception"), SIGABRT after a complete
        # run, and torchrun reports the run failed (~1% of the 2-rank CPU test runs on 2 busy cores). With no
        # finalization no thread can be cut off. NCCL's shutdown() stops its threads, so GPU runs exit normally.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
