"""Token data: packed windows of seq_len + 1 tokens, deterministic per seed, sharded by rank.

Two sources:
- "stdlib": the running Python's standard library source (every `.py` under sysconfig's stdlib path,
  site-packages excluded, files in sorted order), read as bytes -> byte-level tokens 0..255. Present on every
  machine, no download.
- a `.bin` token file (uint16 or uint32, native little-endian) with a JSON sidecar `<file>.json`:
  {"dtype": "uint16" | "uint32", "vocab_size": int, "num_tokens": int (optional)}.

The token stream is cut into non-overlapping windows of seq_len + 1 tokens (inputs = w[:-1], labels = w[1:]).
The last `VALIDATION_FRACTION` of the windows is the validation split; the rest is training data.

Batch order: global sample g (= step_index * global_batch + i) is window perm_e[g mod W] of epoch
e = g // W, with perm_e a permutation drawn from (seed, e). Rank r takes rows [r * B, (r + 1) * B) of each
global batch, so the samples a step sees do not depend on how many ranks share them: a 1-rank run with
B = 2 sees what a 2-rank run with B = 1 sees. The position (global batches consumed) is all the state.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

VALIDATION_FRACTION = 0.02
# The validation batches are drawn with this seed, not the run's: runs with other seeds (compare.py --seeds)
# must be scored on the same held-out windows, or their difference measures the windows, not the models.
VALIDATION_SEED = 0


class DataError(ValueError):
    """Missing, corrupt or mismatched data; str(err) is one line naming the file and the problem."""


# --------------------------------------------------------------------------------------------------
# Token sources
# --------------------------------------------------------------------------------------------------


def stdlib_files() -> list[str]:
    """Every .py file of the running Python's standard library, sorted by relative path."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        for name in filenames:
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                found.append((os.path.relpath(full, root).replace(os.sep, "/"), full))
    found.sort()
    return [full for _, full in found]


@functools.lru_cache(maxsize=1)  # the training and the validation loader share one read (seconds on 2 cores)
def load_stdlib_tokens() -> np.ndarray:
    files = stdlib_files()
    if not files:
        raise DataError(f"dataset 'stdlib': no .py files under {sysconfig.get_paths()['stdlib']}")
    chunks = []
    for path in files:
        try:
            with open(path, "rb") as f:
                chunks.append(f.read())
        except OSError:
            continue  # an unreadable file is skipped; the list order stays deterministic
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


def read_sidecar(path: str) -> dict:
    sidecar = path + ".json"
    if not os.path.isfile(path):
        raise DataError(f"dataset {path}: file not found")
    if not os.path.isfile(sidecar):
        raise DataError(f"dataset {path}: sidecar {sidecar} not found (expected "
                        '{"dtype": "uint16"|"uint32", "vocab_size": N})')
    try:
        with open(sidecar) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"dataset {path}: sidecar {sidecar} is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise DataError(f"dataset {path}: sidecar {sidecar} must hold a JSON object")
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise DataError(f"dataset {path}: sidecar dtype = {meta.get('dtype')!r}; allowed: 'uint16', 'uint32'")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise DataError(f"dataset {path}: sidecar vocab_size = {vocab!r}; expected a positive integer")
    if meta["dtype"] == "uint16" and vocab > 2**16:
        raise DataError(f"dataset {path}: vocab_size {vocab} does not fit dtype uint16")
    return meta


def load_bin_tokens(path: str, model_vocab_size: int) -> np.ndarray:
    meta = read_sidecar(path)
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise DataError(f"dataset {path}: {size} bytes is not a whole number of {meta['dtype']} tokens "
                        "(truncated or corrupt file)")
    n = size // dtype.itemsize
    if "num_tokens" in meta and meta["num_tokens"] != n:
        raise DataError(f"dataset {path}: sidecar says num_tokens = {meta['num_tokens']} but the file holds "
                        f"{n} (truncated or corrupt file)")
    if meta["vocab_size"] > model_vocab_size:
        raise DataError(f"dataset {path}: vocab_size {meta['vocab_size']} exceeds the model's vocab_size "
                        f"{model_vocab_size} (set [model] vocab_size)")
    return np.memmap(path, dtype=dtype, mode="r")


def check_dataset(dataset: str, model_vocab_size: int) -> None:
    """Start-up check that raises DataError before any process group exists."""
    if dataset == "stdlib":
        if model_vocab_size < 256:
            raise DataError(f"dataset 'stdlib' has byte tokens 0..255 but the model's vocab_size is "
                            f"{model_vocab_size}")
        return
    load_bin_tokens(dataset, model_vocab_size)


# --------------------------------------------------------------------------------------------------
# Windows, splits and the per-rank loader
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    tokens: np.ndarray  # the whole token stream
    first_window: int  # windows [first_window, first_window + num_windows) of seq_len+1 tokens
    num_windows: int
    seq_len: int
    name: str

    def window(self, k: int) -> np.ndarray:
        start = (self.first_window + k) * (self.seq_len + 1)
        return self.tokens[start : start + self.seq_len + 1]


def make_splits(tokens: np.ndarray, seq_len: int, source: str) -> tuple[Split, Split]:
    total = len(tokens) // (seq_len + 1)
    n_val = max(1, int(total * VALIDATION_FRACTION))
    n_train = total - n_val
    if n_train < 1:
        raise DataError(f"dataset {source}: {len(tokens)} tokens make only {total} windows of seq_len + 1 = "
                        f"{seq_len + 1}; need at least 2")
    return (Split(tokens, 0, n_train, seq_len, "train"), Split(tokens, n_train, n_val, seq_len, "validation"))


class TokenLoader:
    """Yields (inputs, labels) int64 [local_batch_size, seq_len] CPU tensors for one rank."""

    def __init__(self, split: Split, local_batch_size: int, dp_rank: int, dp_world: int, seed: int,
                 source: str, vocab_size: int):
        self.split = split
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_world = dp_world
        self.global_batch = local_batch_size * dp_world
        self.seed = seed
        self.source = source
        self.vocab_size = vocab_size
        self.batches_consumed = 0
        self._perm_epoch: Optional[int] = None
        self._perm: Optional[np.ndarray] = None
        # A cheap fingerprint of the stream, so resuming on other data is caught.
        head = np.asarray(split.tokens[: 1 << 16]).tobytes()
        self.fingerprint = hashlib.sha1(head + str((len(split.tokens), split.num_windows)).encode()).hexdigest()[:16]

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = rng.permutation(self.split.num_windows)
            self._perm_epoch = epoch
        return self._perm

    def batch_indices(self, batch_index: int) -> list[int]:
        """Window ids of this rank's rows of global batch `batch_index`."""
        W = self.split.num_windows
        first = batch_index * self.global_batch + self.dp_rank * self.local_batch_size
        out = []
        for g in range(first, first + self.local_batch_size):
            out.append(int(self._permutation(g // W)[g % W]))
        return out

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack([self.split.window(k) for k in self.batch_indices(self.batches_consumed)])
        self.batches_consumed += 1
        if rows.dtype != np.uint8:
            top = int(rows.max())
            if top >= self.vocab_size:
                raise DataError(f"dataset {self.source}: token id {top} >= vocab_size {self.vocab_size} in "
                                f"batch {self.batches_consumed - 1} (corrupt file or wrong sidecar)")
        rows = torch.from_numpy(rows.astype(np.int64))
        return rows[:, :-1], rows[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"batches_consumed": self.batches_consumed, "global_batch": self.global_batch,
                "seed": self.seed, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        for key in ("global_batch", "seed", "fingerprint"):
            if state.get(key) != getattr(self, key):
                raise DataError(f"checkpoint data position was saved with {key} = {state.get(key)!r} but this "
                                f"run has {getattr(self, key)!r}; resume with the same data, seed and global "
                                "batch (local_batch_size x data-parallel ranks)")
        self.batches_consumed = int(state["batches_consumed"])


def build_loader(dataset: str, seq_len: int, local_batch_size: int, dp_rank: int, dp_world: int, seed: int,
                 vocab_size: int, split: str = "train") -> TokenLoader:
    if dataset == "stdlib":
        tokens, source = load_stdlib_tokens(), "'stdlib'"
    else:
        tokens, source = load_bin_tokens(dataset, vocab_size), dataset
        vocab_size = read_sidecar(dataset)["vocab_size"]  # ids at or above the declared vocab mean corruption
    train, val = make_splits(tokens, seq_len, source)
    chosen = {"train": train, "validation": val}[split]
    if split == "validation":
        seed = VALIDATION_SEED  # every run scores the same held-out windows, whatever its seed
    return TokenLoader(chosen, local_batch_size, dp_rank, dp_world, seed, source, vocab_size)


class PinnedStager:
    """Host batches to the GPU through pinned buffers allocated once: `slots` sets used in turn, each refilled
    (a host copy) only after the GPU has finished reading it (an event recorded after its copies), then copied
    to the device without blocking the host. Why: `Tensor.pin_memory()` each step allocates pinned memory and
    first asks the driver whether the source is pinned; in a profiled llama_moe step on an H100 host that
    `aten::is_pinned` took 1.5 ms a call (benchmarks/results/issue10_s34/NOTE.md), host time on the critical
    path of a host-paced float8 step. `pin`: False only for CPU tests of the bookkeeping (no CUDA: plain
    buffers, no events)."""

    def __init__(self, slots: int = 3, pin: bool = True):
        if slots < 2:
            raise ValueError(f"PinnedStager: slots={slots}; need at least 2 (one can be in flight)")
        self.slots: list = [None] * slots  # per slot: the buffers of the last batch staged there
        self._events: list = [None] * slots
        self._next = 0
        self._pin = pin
        self.allocations = 0  # buffers allocated so far (a new batch shape or dtype allocates its slot's again)

    def to_device(self, device: torch.device, *tensors: torch.Tensor) -> list:
        i = self._next
        self._next = (i + 1) % len(self.slots)
        if self._events[i] is not None:
            self._events[i].synchronize()  # the copies out of this slot `slots` batches ago (long finished)
        bufs = self.slots[i]
        if bufs is None or [(b.shape, b.dtype) for b in bufs] != [(t.shape, t.dtype) for t in tensors]:
            bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=self._pin) for t in tensors]
            self.slots[i] = bufs
            self.allocations += len(bufs)
        out = []
        for buf, t in zip(bufs, tensors):
            buf.copy_(t)
            out.append(buf.to(device, non_blocking=True))
        if torch.device(device).type == "cuda":
            self._events[i] = torch.cuda.Event()
            self._events[i].record()
        return out
