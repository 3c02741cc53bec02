"""Expert parallelism (EP): the routed experts of every MoE split over `ep` ranks, tokens moved by all-to-all.

Forward of one MoE layer on every rank of an EP group (N local tokens, top-k, E experts, E/ep local experts):

  route      as without EP: this rank's tokens -> top-k experts and weights
  sort       the N*k (token, slot) pairs by GLOBAL expert (stable, no padding): experts are numbered so
             that rank j holds experts [j*E/ep, (j+1)*E/ep), so the sorted pairs are already grouped by
             destination rank
  counts     one small all-to-all of the per-expert counts [E] (int64): afterwards every rank knows how many
             rows each source rank sends it for each of its local experts
  HOST SYNC  all_to_all_single with variable splits takes the split sizes as Python ints: ONE device->host
             copy per layer in forward (send and receive splits read together); backward reuses them (none).
             Activation checkpointing recomputes the forward, and with it the sync.
  dispatch   all_to_all_single of the sorted rows (bf16, or float8 rows + scales as bytes: dispatch_dtype)
  experts    received rows arrive grouped by (source rank, local expert); a k=1 dispatch plan regroups them
             into local-expert order (padded to the MoE's token_group_align) and the SAME
             `experts.routed` as without EP computes them (bf16 GroupedExperts or Float8GroupedExperts)
  combine    the reverse all_to_all_single brings every row's expert output home (bf16), where each token
             sums its k outputs with its router weights in slot order (fp32, deterministic)

Backward: each all-to-all's backward is the reverse all-to-all of the gradient (bf16; see the float8 note in
`titan_fp8.float8.experts.Float8Dispatch`). Expert weights hold only local experts; their gradient on a rank
already sums the contributions of every rank of its EP group, so it is divided by ep here (see _scale_grad) and
needs no reduction across the EP group; FSDP2 averages it over the remaining data-parallel ranks (if any).

Under torch.compile everything between the sort by destination and the gather home runs eagerly
(`ep_exchange_and_experts`, torch.compiler.disable; one graph break per MoE layer): its sizes depend on the routing,
and traced they made each rank recompile on its own data (see ep_routed). The traced parts have static shapes, so
every rank runs the same graphs at every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

__all__ = ["ExpertParallel", "exchange_counts", "all_to_all", "local_tensor", "ep_routed", "ep_exchange_and_experts"]


@dataclass
class ExpertParallel:
    """What an MoE needs to run its experts over an EP group (attached as `moe.ep` by titan_fp8.parallel)."""
    group: dist.ProcessGroup
    size: int
    rank: int
    dispatch_dtype: str = "bf16"  # "bf16" | "float8" (the float8 experts' rows + scales)


def local_tensor(w: Tensor) -> Tensor:
    """The local shard of an expert weight (a DTensor sharded over the EP mesh) or w itself."""
    return w.to_local() if isinstance(w, DTensor) else w


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g: Tensor):
        return g * ctx.factor, None


def scale_grad(w: Tensor, factor: float) -> Tensor:
    """Identity forward; gradient times `factor`. Each rank's loss is its local mean and FSDP averages over the
    data-parallel ranks; an EP rank's expert gradient sums ALL ranks' tokens of its EP group, so 1/ep makes it
    the same average (FSDP then averages over the remaining ranks, none when there are none)."""
    return w if factor == 1 else _ScaleGrad.apply(w, factor)


@torch.compiler.disable
def exchange_counts(counts: Tensor, ep: ExpertParallel) -> tuple[Tensor, list[int], list[int]]:
    """counts [E] int64 (this rank's rows per global expert) -> (received counts [ep, E/ep]: rows that source
    rank j sends for each local expert, send splits, receive splits). The splits are read to the host together:
    the layer's one device->host sync (all_to_all_single needs them as ints)."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=ep.group)
    received = received.view(ep.size, -1)
    both = torch.cat([counts.view(ep.size, -1).sum(1), received.sum(1)]).tolist()  # the one D2H sync
    return received, both[:ep.size], both[ep.size:]


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with variable splits; backward sends the gradient back the reverse way."""

    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list, in_splits: list, group) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all_raw(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, g: Tensor):
        out_splits, in_splits = ctx.splits
        return _all_to_all_raw(g, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all_raw(x: Tensor, out_splits: list, in_splits: list, group) -> Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


@torch.compiler.disable
def all_to_all(x: Tensor, out_splits: list, in_splits: list, group) -> Tensor:
    """Rows of x [sum(in_splits), ...] sent in_splits[j] to rank j; returns [sum(out_splits), ...]. Autograd."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


def ep_routed(moe, xf: Tensor, weights: Tensor, experts: Tensor) -> tuple[Tensor, Tensor]:
    """The MoE's expert path over its EP group (module docstring). xf [N, D], weights [N, k] fp32, experts
    [N, k] global expert ids -> (out [N, D], this rank's tokens per GLOBAL expert [E]).

    Compiled, only the shape-static ends are traced (sort by destination, gather home, weighted sum: sizes
    N and N*k); everything whose size depends on the routing runs in `ep_exchange_and_experts`, outside the
    graph. Traced, the received-row count and the splits were Python ints in the compiled frames, guarded by
    each rank on its own values: a rank that received no rows in a layer (its experts unchosen by every rank)
    recompiled alone, at a step of the data's choosing, while the other ranks waited in a collective (and with
    fp8_rowwise emulated on CPU that recompile failed: tests/cpu/test_expert_parallel.py)."""
    from titan_fp8.models.moe import _Permute, dispatch_plan

    n, k = weights.shape
    with torch.no_grad():
        plan = dispatch_plan(experts, moe.num_experts, 1)  # sorted by global expert = by destination rank
    x_send = _Permute.apply(xf, plan.src, plan.pos, k)  # [N*k, D] in destination order
    y_back = ep_exchange_and_experts(moe, x_send, plan.counts)  # [N*k, D], the same order
    y_pairs = y_back.index_select(0, plan.pos).view(n, k, -1)
    out = (y_pairs.to(weights.dtype) * weights.unsqueeze(-1)).sum(dim=1).to(xf.dtype)
    return out, plan.counts


@torch.compiler.disable
def ep_exchange_and_experts(moe, x_send: Tensor, counts: Tensor) -> Tensor:
    """x_send [N*k, D] (rows sorted by global expert), counts [E] -> every row's expert output [N*k, D], same
    order: counts exchange (the host sync), dispatch all-to-all, this rank's experts, combine all-to-all.
    Eager (one graph break per MoE layer): every shape here depends on the routing (see ep_routed)."""
    from titan_fp8.models.moe import dispatch_plan

    ep: ExpertParallel = moe.ep
    num_local = moe.num_experts // ep.size
    with torch.no_grad():
        received, send, recv = exchange_counts(counts, ep)
        rows = sum(recv)
        # received rows come grouped by (source rank, local expert): their local expert ids, then a k=1 plan
        # that regroups them into local-expert order with the MoE's group padding
        local_ids = torch.arange(num_local, device=x_send.device).repeat(ep.size)
        recv_expert = torch.repeat_interleave(local_ids, received.reshape(-1), output_size=rows)
        local_plan = dispatch_plan(recv_expert.unsqueeze(1), num_local, moe.token_group_align)
    ones = torch.ones(rows, 1, device=x_send.device, dtype=torch.float32)
    if ep.dispatch_dtype == "float8":
        x_recv, rows_q = moe.experts.dispatch_float8(x_send, recv, send, ep.group)
        y_recv = moe.experts.routed(x_recv, ones, local_plan, rows_q=rows_q, grad_scale=1.0 / ep.size)
    else:
        x_recv = all_to_all(x_send, recv, send, ep.group)
        y_recv = moe.experts.routed(x_recv, ones, local_plan, grad_scale=1.0 / ep.size)
    return all_to_all(y_recv, send, recv, ep.group)  # combine: bf16, back to the tokens' rank
