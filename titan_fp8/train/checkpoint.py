"""Atomic distributed checkpoints with torch.distributed.checkpoint (DCP).

Layout under the checkpoint folder:
    step-<N>/            a complete checkpoint: DCP shards + .metadata (model, optimizer),
                         train_state.json (step, scheduler, data position), rng-rank<r>.pt, COMPLETE
    .tmp-step-<N>/       a checkpoint being written (ignored when resuming)

Atomicity: every rank writes into .tmp-step-<N>, all ranks meet at a barrier, rank 0 writes COMPLETE and
renames the directory to step-<N> (a rename within one file system is atomic). `latest_step` only accepts
step-<N> directories that hold COMPLETE, so a half-written or planted directory is never picked.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

STEP_DIR = re.compile(r"^step-(\d+)$")
MARKER = "COMPLETE"


class CheckpointError(RuntimeError):
    pass


def step_dir(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step}")


def latest_step(folder: str) -> int | None:
    """Highest N with a complete step-<N> directory in `folder`, or None."""
    if not os.path.isdir(folder):
        return None
    best = None
    for name in os.listdir(folder):
        m = STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(folder, name, MARKER)):
            n = int(m.group(1))
            best = n if best is None or n > best else best
    return best


def incomplete_dirs(folder: str) -> list[str]:
    """Directories that look like checkpoints but are not complete (reported, never loaded)."""
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if name.startswith(".tmp-step-") or (STEP_DIR.match(name) and not os.path.isfile(os.path.join(full, MARKER))):
            out.append(name)
    return out


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class CheckpointManager:
    def __init__(self, folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 data_loader, log=print):
        self.folder = folder
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.data_loader = data_loader
        self.log = log
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def _model_optim_state(self) -> dict:
        msd, osd = get_state_dict(self.model, self.optimizer, options=StateDictOptions(full_state_dict=False))
        return {"model": msd, "optim": osd}

    def save(self, step: int) -> str:
        final = step_dir(self.folder, step)
        tmp = os.path.join(self.folder, f".tmp-step-{step}")
        if self.rank == 0:
            os.makedirs(self.folder, exist_ok=True)
            if os.path.exists(tmp):
                shutil.rmtree(tmp)  # left over from a run killed while saving
            os.makedirs(tmp)
        dist.barrier()
        dcp.save(self._model_optim_state(), checkpoint_id=tmp)
        torch.save(_rng_state(), os.path.join(tmp, f"rng-rank{self.rank}.pt"))
        if self.rank == 0:
            train_state = {"step": step, "world_size": self.world, "scheduler": self.scheduler.state_dict(),
                           "data": self.data_loader.state_dict()}
            with open(os.path.join(tmp, "train_state.json"), "w") as f:
                json.dump(train_state, f)
        dist.barrier()  # every rank's files are in tmp
        if self.rank == 0:
            with open(os.path.join(tmp, MARKER), "w") as f:
                f.write(f"{step}\n")
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
        dist.barrier()
        return final

    def load(self, step: int) -> dict:
        path = step_dir(self.folder, step)
        try:
            with open(os.path.join(path, "train_state.json")) as f:
                train_state = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"checkpoint {path}: cannot read train_state.json ({e})") from None
        state = self._model_optim_state()
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=StateDictOptions(full_state_dict=False))
        self.scheduler.load_state_dict(train_state["scheduler"])
        self.data_loader.load_state_dict(train_state["data"])
        rng_file = os.path.join(path, f"rng-rank{self.rank}.pt")
        if train_state.get("world_size") == self.world and os.path.isfile(rng_file):
            _set_rng_state(torch.load(rng_file, weights_only=True))
        elif self.rank == 0:
            self.log(f"checkpoint {path}: saved with {train_state.get('world_size')} ranks, running with "
                     f"{self.world}: RNG states not restored")
        return train_state
