"""launch/train.py with torch.distributed's collectives wrapped to record, per rank, which ranks each one spans.

Same arguments as launch/train.py. Each rank writes <dump_folder>/collectives-rank<RANK>.json when the launcher
destroys its process group (a gloo run leaves with os._exit right after: launch/train.py says why):
  max_all_reduce: [{"ranks": [...], "numel": n}] for every all_reduce(op=MAX) (the float8 AMAX all-reduce is the
                  only MAX reduction in the project);
  other_all_reduce_groups: the sorted distinct rank lists of every other all_reduce (loss stats, router loads,
                  FSDP2's HSDP gradient all-reduce across replicas);
  uint8_all_gather_groups: the distinct rank lists of all-gathers of uint8 inputs (float8 bytes; FSDP2's bf16 /
                  fp32 gathers are not uint8).
The wrappers look the group up at call time (the process group is gone at exit).
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "launch", "train.py")

RECORD = {"max_all_reduce": [], "other_all_reduce_groups": set(), "uint8_all_gather_groups": set()}


def _ranks(group) -> tuple:
    return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def _arg(args, kwargs, name, index, default=None):
    return kwargs.get(name, args[index] if len(args) > index else default)


def _wrap(name, fn):
    def wrapped(*args, **kwargs):
        if name == "all_reduce":
            tensor, op = _arg(args, kwargs, "tensor", 0), _arg(args, kwargs, "op", 1, dist.ReduceOp.SUM)
            ranks = _ranks(_arg(args, kwargs, "group", 2))
            if op == dist.ReduceOp.MAX:
                RECORD["max_all_reduce"].append({"ranks": list(ranks), "numel": tensor.numel()})
            else:
                RECORD["other_all_reduce_groups"].add(ranks)
        else:
            inp = _arg(args, kwargs, "input_tensor", 1)
            if isinstance(inp, torch.Tensor) and inp.dtype == torch.uint8:
                RECORD["uint8_all_gather_groups"].add(_ranks(_arg(args, kwargs, "group", 2)))
        return fn(*args, **kwargs)
    return wrapped


def _write_record(dump: str) -> None:
    out = {k: sorted(map(list, v)) if isinstance(v, set) else v for k, v in RECORD.items()}
    with open(os.path.join(dump, f"collectives-rank{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump(out, f)


def main() -> int:
    for name in ("all_reduce", "all_gather_into_tensor", "all_gather_single"):
        if hasattr(dist, name):
            setattr(dist, name, _wrap(name, getattr(dist, name)))
    dump = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--job.dump_folder="))
    destroy = dist.destroy_process_group

    def write_then_destroy(*args, **kwargs):
        _write_record(dump)  # the last moment this process is sure to have: nothing after runpy runs on gloo
        return destroy(*args, **kwargs)

    dist.destroy_process_group = write_then_destroy
    sys.argv[0] = TRAIN
    try:
        runpy.run_path(TRAIN, run_name="__main__")
    except SystemExit as e:
        return e.code or 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
