"""Device-side launch tables for multi-tensor kernels (one launch over a list of tensors).

A multi-tensor kernel reads, per tensor, its address and sizes from a small int64 table on the GPU. FSDP2's weight
shards keep their storage across steps, so the table is built on the host and copied to the device ONCE per set
of (addresses, sizes) and reused by every later launch over the same tensors: no host -> device copy per call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_TABLES: dict = {}
_MAX_TABLES = 256


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def cached_table(tensors, rows: list[list[int]]) -> torch.Tensor:
    """The int64 table `rows` (equal-length rows of Python ints) on the tensors' device, cached under the
    tensors' addresses, shapes and dtype and the rows themselves. The pinned host copy stays referenced with it
    (the non-blocking copy may still be reading it)."""
    device = tensors[0].device
    key = (tuple(t.data_ptr() for t in tensors), tuple(tuple(t.shape) for t in tensors), tensors[0].dtype, device,
           tuple(map(tuple, rows)))
    hit = _TABLES.get(key)
    if hit is not None:
        return hit[0]
    host = torch.tensor(rows, dtype=torch.int64).reshape(-1)
    if device.type == "cuda":
        host = host.pin_memory()
    table = host.to(device, non_blocking=True)
    if len(_TABLES) >= _MAX_TABLES:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[key] = (table, host)
    return table


@triton.jit
def table_member(table_ptr, T_PAD: tl.constexpr, X_DTYPE: tl.constexpr):
    """For this program of a multi-tensor launch whose table holds each tensor's address in row 0 and its first
    program in row 2 (padding entries: a huge first program): (t, tensor t's pointer typed X_DTYPE, this
    program's index among tensor t's programs). t = the last tensor whose first program is <= this program."""
    pid = tl.program_id(0)
    first = tl.load(table_ptr + 2 * T_PAD + tl.arange(0, T_PAD))
    t = tl.sum((first <= pid).to(tl.int32)) - 1
    x_ptr = tl.load(table_ptr + t).to(tl.pointer_type(X_DTYPE))
    return t, x_ptr, pid - tl.load(table_ptr + 2 * T_PAD + t)
