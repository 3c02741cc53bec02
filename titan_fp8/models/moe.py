"""Mixture-of-Experts layer: router, sync-free dropless dispatch, grouped SwiGLU experts.

Data flow of `MoE.forward` for N tokens, E experts, top-k routing (no host syncs anywhere):

  route      fp32 router scores [N, E] -> top-k experts and weights [N, k]
  plan       stable sort of the N*k (token, slot) pairs by expert; each expert's group is padded to a
             multiple of `token_group_align` rows inside a buffer whose size depends only on N, k, E
             and the alignment; padding rows are zero; offs = cumulative group ends (int32)
  experts    `GroupedExperts.routed(x, weights, plan)`: permute the tokens into expert order, ONE
             grouped GEMM for the gate+up projections (w13) and one for w2 (SwiGLU), then every
             token gathers its k expert outputs and sums them weighted by its router weights.
             The float8 layer swaps this whole path for its fused version.

Every gather's backward writes to unique rows or is a fixed-order sum over the k slots, so neither
direction needs atomics: the backward is deterministic as well as the forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function

__all__ = ["MoEArgs", "grouped_mm", "GroupedExperts", "Router", "FeedForward", "MoE", "DispatchPlan", "dispatch_plan"]


@dataclass
class MoEArgs:
    num_experts: int = 8
    top_k: int = 2
    hidden_dim: int = 1408  # routed expert hidden size
    score_func: str = "softmax"  # "softmax" | "sigmoid"
    route_norm: bool = False  # renormalise the top-k weights to sum 1 (DeepSeek V3 with sigmoid)
    load_balance: str = "aux_loss"  # "aux_loss" | "aux_free" | "none"
    aux_loss_coef: float = 0.01
    bias_update_rate: float = 1e-3  # aux-loss-free bias step
    num_shared_experts: int = 0  # 0 = no shared expert
    shared_hidden_dim: int = 0  # hidden size of one shared expert (SwiGLU)

    def __post_init__(self):
        def bad(key, value, allowed):
            raise ValueError(f"MoEArgs.{key}={value!r} is invalid; allowed: {allowed}")

        if self.num_experts < 1:
            bad("num_experts", self.num_experts, ">= 1")
        if not 1 <= self.top_k <= self.num_experts:
            bad("top_k", self.top_k, f"1..num_experts ({self.num_experts})")
        if self.hidden_dim < 1:
            bad("hidden_dim", self.hidden_dim, ">= 1")
        if self.score_func not in ("softmax", "sigmoid"):
            bad("score_func", self.score_func, "'softmax' | 'sigmoid'")
        if self.load_balance not in ("aux_loss", "aux_free", "none"):
            bad("load_balance", self.load_balance, "'aux_loss' | 'aux_free' | 'none'")
        if self.aux_loss_coef < 0:
            bad("aux_loss_coef", self.aux_loss_coef, ">= 0")
        if self.bias_update_rate < 0:
            bad("bias_update_rate", self.bias_update_rate, ">= 0")
        if self.num_shared_experts < 0:
            bad("num_shared_experts", self.num_shared_experts, ">= 0")
        if self.num_shared_experts > 0 and self.shared_hidden_dim < 1:
            bad("shared_hidden_dim", self.shared_hidden_dim, ">= 1 when num_shared_experts > 0")


# ---------------------------------------------------------------------------------------------
# grouped GEMM
# ---------------------------------------------------------------------------------------------


def _probe_cpu_grouped_mm() -> frozenset:
    """dtypes for which torch._grouped_mm runs on CPU in this torch (2.13: fp32, bf16; older: none)."""
    ok = set()
    for dtype in (torch.float32, torch.bfloat16):
        try:
            x = torch.ones(4, 8, dtype=dtype)
            w = torch.ones(2, 8, 8, dtype=dtype)
            out = torch._grouped_mm(x, w.transpose(-2, -1), offs=torch.tensor([1, 4], dtype=torch.int32))
            if out.shape == (4, 8) and bool((out == 8).all()):
                ok.add(dtype)
        except Exception:  # not implemented on CPU in this torch: use the loop
            pass
    return frozenset(ok)


_CPU_GROUPED_MM_DTYPES = _probe_cpu_grouped_mm()


def _aligned_16_bytes(t: Tensor) -> bool:
    # torch._grouped_mm needs the leading stride 16-byte aligned (it checks it and raises).
    # (data_ptr is not traceable; under torch.compile buffers come from the aligned allocator)
    step = 16 // t.element_size()
    if not torch.compiler.is_compiling() and t.data_ptr() % 16:
        return False
    return all(s % step == 0 for s in t.stride()[:-1]) and t.stride(-1) == 1


def _use_torch_grouped_mm(x: Tensor, w: Tensor) -> bool:
    if x.dtype != w.dtype or x.dim() != 2 or w.dim() != 3:
        return False
    if not (x.is_contiguous() and w.is_contiguous() and _aligned_16_bytes(x) and _aligned_16_bytes(w)):
        return False
    if x.device.type == "cuda":
        # bf16 only (torch's CUDA kernel takes nothing else). No capability query here: it would be
        # traced by torch.compile; torch >= 2.9 runs _grouped_mm on pre-sm90 GPUs through a fallback.
        return x.dtype == torch.bfloat16
    if x.device.type == "cpu":
        # torch's meta kernel for _grouped_mm accepts bf16 only, so compiled fp32 takes the loop
        return x.dtype in _CPU_GROUPED_MM_DTYPES and (x.dtype == torch.bfloat16 or not torch.compiler.is_compiling())
    return False


def _row_group(offs: Tensor, num_rows: int) -> Tensor:
    """Group index of every row (len(offs) for rows at or past offs[-1])."""
    rows = torch.arange(num_rows, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(offs, rows, right=True)


def _grouped_mm_loop(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    # One dense GEMM per expert over all rows, keeping that expert's rows: E times the FLOPs of the
    # grouped GEMM, but no host sync (no slicing by data-dependent offsets), any dtype, any device.
    group = _row_group(offs, x.shape[0]).unsqueeze(1)
    out = x.new_zeros(x.shape[0], w.shape[1])
    for e in range(w.shape[0]):
        mine = group == e  # masking the input too keeps other rows (even non-finite) out of w's grad
        out = torch.where(mine, torch.where(mine, x, 0) @ w[e].transpose(0, 1), out)
    return out


def grouped_mm(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """x [T, in] sorted by expert, w [E, out, in], offs int32 [E] cumulative END offsets.

    out [T, out] with out[s:e] = x[s:e] @ w[i].T for group i = [offs[i-1], offs[i]). Groups may be
    empty. Rows at or past offs[-1] are padding: their output and their input gradient are zero.
    offs must be non-decreasing with offs[-1] <= T; that is not checked (checking would sync).
    Uses torch._grouped_mm for bf16 on CUDA and on CPU where this torch has it (fp32/bf16 in 2.13;
    bf16 only under torch.compile), a masked per-expert loop elsewhere (fp64, fp32 on CUDA, other
    devices). Both give the same result.
    """
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError(f"grouped_mm: expected x [T, in] and w [E, out, in], got x {tuple(x.shape)}, "
                         f"w {tuple(w.shape)}")
    if offs.dim() != 1 or offs.shape[0] != w.shape[0] or offs.dtype != torch.int32:
        raise ValueError(f"grouped_mm: offs must be int32 [E={w.shape[0]}], got {offs.dtype} "
                         f"{tuple(offs.shape)}")
    if not _use_torch_grouped_mm(x, w):
        return _grouped_mm_loop(x, w, offs)
    # torch._grouped_mm leaves rows past offs[-1] uninitialised, in the output and in the input
    # gradient; the two masks make them zero. Where the caller fills the buffer exactly (MoE always
    # does: offs[-1] == T) they select everything, and torch.compile fuses them into neighbours.
    valid = (_row_group(offs, x.shape[0]) < w.shape[0]).unsqueeze(1)
    x = torch.where(valid, x, 0)
    out = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    return torch.where(valid, out, 0)


class GroupedExperts(nn.Module):
    """E SwiGLU experts as 3-D weights [experts, out, in].

    w13 [E, 2*hidden, dim] holds the gate (w1, rows [0, hidden)) and up (w3, rows [hidden, 2*hidden))
    projections of every expert: ONE grouped GEMM reads the tokens once for both. w2 [E, dim, hidden].
    `forward(x_sorted, offs)` runs tokens already sorted by expert; `routed(x, weights, plan)` is the whole
    expert path of an MoE layer (permute -> experts -> weighted unpermute), the unit the float8 layer swaps
    for its fused version.
    """

    mm = staticmethod(grouped_mm)  # the float8 layer swaps this attribute on an instance

    def __init__(self, dim: int, hidden_dim: int, num_experts: int):
        super().__init__()
        self.dim, self.hidden_dim, self.num_experts = dim, hidden_dim, num_experts
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self._register_load_state_dict_pre_hook(_fuse_w1_w3_on_load)

    def local_weights(self, grad_scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """(w13, w2) as plain local tensors: under expert parallelism the parameters are DTensors sharded over
        the EP mesh (these are this rank's experts); grad_scale multiplies their gradient (expert_parallel)."""
        from titan_fp8.models.expert_parallel import local_tensor, scale_grad

        return tuple(scale_grad(local_tensor(w), grad_scale) for w in (self.w13, self.w2))

    def forward(self, x_sorted: Tensor, offs: Tensor, grad_scale: float = 1.0) -> Tensor:
        w13, w2 = self.local_weights(grad_scale)
        h1, h3 = self.mm(x_sorted, w13, offs).chunk(2, dim=-1)
        return self.mm(F.silu(h1) * h3, w2, offs)

    def routed(self, x: Tensor, weights: Tensor, plan: "DispatchPlan", grad_scale: float = 1.0,
               x_kept: bool = False) -> Tensor:
        """x [N, D], router weights [N, k] -> sum over each token's k experts of weight * expert(x).
        x_kept: the caller holds x through backward anyway; the float8 subclass then saves x instead of a float8
        copy of its own (bf16 keeps nothing extra either way)."""
        n, k = weights.shape
        with record_function("moe.permute"):
            x_buf = _Permute.apply(x, plan.src, plan.pos, k)
        with record_function("moe.experts"):
            # (subclasses may define forward(x_sorted, offs): the scale only travels where it is used)
            y_buf = self(x_buf, plan.offs) if grad_scale == 1 else self(x_buf, plan.offs, grad_scale)
        with record_function("moe.unpermute"):
            # each token's k outputs, summed in slot order with its router weights (fp32 sum)
            y_pairs = y_buf.index_select(0, plan.pos).view(n, k, self.dim)
            return (y_pairs.to(weights.dtype) * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)

    def init_weights(self, std: float):
        with torch.no_grad():
            nn.init.trunc_normal_(self.w13[:, :self.hidden_dim], mean=0.0, std=0.02)  # w1 (gate)
            nn.init.trunc_normal_(self.w13[:, self.hidden_dim:], mean=0.0, std=std)  # w3 (up)
        nn.init.trunc_normal_(self.w2, mean=0.0, std=std)


def _fuse_w1_w3_on_load(state_dict, prefix, *args):
    """Plain state dicts saved before w1 and w3 were fused load into w13."""
    w1, w3 = state_dict.get(prefix + "w1"), state_dict.get(prefix + "w3")
    if w1 is not None and w3 is not None and prefix + "w13" not in state_dict:
        state_dict[prefix + "w13"] = torch.cat([state_dict.pop(prefix + "w1"), state_dict.pop(prefix + "w3")], dim=1)


class FeedForward(nn.Module):
    """Dense SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, std: float):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.w2.weight, mean=0.0, std=std)
        nn.init.trunc_normal_(self.w3.weight, mean=0.0, std=std)


# ---------------------------------------------------------------------------------------------
# router
# ---------------------------------------------------------------------------------------------


# Up to this many experts the compiled input gradient of the router is written as broadcast products (one fused
# kernel reads each expert's gate row per element); beyond it an fp32 GEMM is the cheaper form.
_FUSED_DX_MAX_EXPERTS = 16


def _bf16_terms(g: Tensor) -> Tensor:
    """fp32 g [N, E] -> bf16 [N, 3E] = [hi | mid | lo] with hi + mid + lo == g exactly for |g| >= 2^-110: hi keeps
    g's top 8 significant bits, mid the next 8 of the (exact) residual, lo the rest (below that a subnormal
    residual loses bits under 2^-133: nothing a router gradient can notice). Truncation by bit masks, not rounding
    casts: inductor does not emulate an intermediate bf16 rounding inside a fused kernel (emulate_precision_casts
    is off), and each term is exactly representable in bf16, so its final cast is exact."""
    def top_bits(v: Tensor) -> Tensor:
        return (v.view(torch.int32) & -65536).view(torch.float32)

    hi = top_bits(g)
    r = g - hi
    mid = top_bits(r)
    return torch.cat([hi, mid, r - mid], dim=1).to(torch.bfloat16)


class _Bf16RouterLogits(torch.autograd.Function):
    """fp32 logits x @ w^T for bf16 x and w: the numbers of `F.linear(x.float(), w.float())` (every product is
    exact in fp32; only the order of the fp32 sums differs) without that path's fp32 copy of x. At dsv3_layer
    (16k tokens x 7168, H100) the copy, the fp32 GEMMs over it and the fp32 input gradient added into x's gradient
    took ~1.2 ms of a 14-19 ms MoE layer step, for a product with 8 columns.

    forward   CUDA: one bf16 GEMM with an fp32 result (`torch.mm(..., out_dtype=float32)`, which has no autograd
              formula of its own); elsewhere the fp32 path.
    dw        g^T @ x as ONE bf16 GEMM with an fp32 result over g split into three bf16 terms (_bf16_terms: exact),
              so x is read once in bf16 (inductor's own reduction over the tokens took ~1 ms).
    dx        g @ w: under torch.compile, for up to _FUSED_DX_MAX_EXPERTS experts, written as E broadcast products,
              which inductor fuses into the sum with x's other gradients (no fp32 [N, D] tensor); otherwise (and in
              eager) the fp32 GEMM as before."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        if x.is_cuda:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        return F.linear(x.float(), w.float())

    @staticmethod
    def backward(ctx, g: Tensor):
        x, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            wf = w.float()
            if torch.compiler.is_compiling() and w.shape[0] <= _FUSED_DX_MAX_EXPERTS:
                dx = sum(g[:, e, None] * wf[e] for e in range(w.shape[0]))
            else:
                dx = g @ wf
            dx = dx.to(x.dtype)
        if ctx.needs_input_grad[1]:
            terms = _bf16_terms(g).t()
            if x.is_cuda:
                parts = torch.mm(terms, x, out_dtype=torch.float32)
            else:
                parts = terms.float() @ x.float()
            dw = parts.view(3, *w.shape).sum(0).to(w.dtype)
        return dx, dw


def router_logits(x: Tensor, w: Tensor) -> Tensor:
    """Router logits in fp32 (fp64 for fp64 input) from x [N, D] and the gate weight w [E, D]."""
    if x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16:
        return _Bf16RouterLogits.apply(x, w)
    dtype = torch.promote_types(x.dtype, torch.float32)
    return F.linear(x.to(dtype), w.to(dtype))


class Router(nn.Module):
    """Token-choice top-k router computed in fp32 (fp64 when the input is fp64).

    aux_free (DeepSeek V3): `expert_bias` is added to the scores only to SELECT experts; the weights
    that scale expert outputs are the unbiased scores.
    """

    def __init__(self, dim: int, args: MoEArgs):
        super().__init__()
        self.num_experts, self.top_k = args.num_experts, args.top_k
        self.score_func, self.route_norm = args.score_func, args.route_norm
        self.use_bias = args.load_balance == "aux_free"
        self.gate = nn.Linear(dim, args.num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(args.num_experts), persistent=True)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [N, D] -> (weights [N, k] fp32, experts [N, k] int64, scores [N, E] fp32)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        logits = router_logits(x, self.gate.weight)
        if self.score_func == "softmax":
            scores = torch.softmax(logits, dim=-1)
        else:
            scores = torch.sigmoid(logits)
        select = scores + self.expert_bias.to(dtype) if self.use_bias else scores
        _, experts = torch.topk(select, self.top_k, dim=-1, sorted=False)
        weights = scores.gather(1, experts)
        if self.route_norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights, experts, scores

    def init_weights(self, std: float = 0.02):
        nn.init.trunc_normal_(self.gate.weight, mean=0.0, std=std)
        self.expert_bias.zero_()


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------


def padded_buffer_rows(num_pairs: int, num_experts: int, align: int) -> int:
    """Rows of the expert buffer: all (token, slot) pairs plus the worst-case padding, a multiple
    of `align`. Depends only on static sizes, so no host sync is needed to allocate it."""
    if align == 1:
        return num_pairs
    return (num_pairs + num_experts * (align - 1) + align - 1) // align * align


class DispatchPlan(NamedTuple):
    """Where every (token, slot) pair goes in the expert buffer of P rows (see dispatch_plan)."""
    src: Tensor     # [P] int64: the token (row of x) each buffer row holds; N = a zero padding row
    pos: Tensor     # [N*k] int64: the buffer row of each (token, slot) pair
    offs: Tensor    # [E] int32: cumulative group ends, offs[-1] == P
    counts: Tensor  # [E] int64: unpadded tokens per expert


def dispatch_plan(experts: Tensor, num_experts: int, align: int) -> DispatchPlan:
    """Where every (token, slot) pair goes in the expert buffer. All on device, no host sync.

    experts [N, k] int64 -> DispatchPlan(src, pos, offs, counts); each expert's group is padded to a
    multiple of `align` rows.
    """
    n, k = experts.shape
    flat = experts.reshape(-1)
    num_rows = padded_buffer_rows(n * k, num_experts, align)
    # stable: inside an expert's group, pairs stay in (token, slot) order -> deterministic layout
    sorted_experts, order = torch.sort(flat, stable=True)
    ids = torch.arange(num_experts, device=flat.device, dtype=flat.dtype)
    ends = torch.searchsorted(sorted_experts, ids, right=True)  # unpadded cumulative ends
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    if align == 1:
        dest = torch.arange(n * k, device=flat.device)
        offs = ends.to(torch.int32)
    else:
        padded = (counts + align - 1) // align * align
        padded_ends = torch.cumsum(padded, 0)
        shift = (padded_ends - padded) - (ends - counts)  # padded start - unpadded start
        dest = torch.arange(n * k, device=flat.device) + shift[sorted_experts]
        # The slack after the last real group joins the last group (zero rows, zero output), so
        # offs[-1] == num_rows and the grouped GEMM has no tail rows.
        offs = torch.cat([padded_ends[:-1], padded_ends.new_full((1,), num_rows)]).to(torch.int32)
    token = torch.div(order, k, rounding_mode="floor")
    src = torch.full((num_rows,), n, device=flat.device, dtype=torch.int64).index_put((dest,), token)
    pos = torch.empty_like(dest).index_put((order,), dest)
    return DispatchPlan(src, pos, offs, counts)


class _Permute(torch.autograd.Function):
    """x [N, D] -> buffer [P, D] with buffer[r] = x[src[r]] (zero where src[r] == N).

    Backward gathers the k rows of every token and sums them in slot order instead of the
    atomic scatter-add that plain indexing would use: deterministic.
    """

    @staticmethod
    def forward(ctx, x: Tensor, src: Tensor, pos: Tensor, k: int) -> Tensor:
        ctx.save_for_backward(pos)
        ctx.k = k
        x_ext = torch.cat([x, x.new_zeros(1, x.shape[1])])
        return x_ext.index_select(0, src)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (pos,) = ctx.saved_tensors
        d = grad.shape[1]
        grad_x = grad.index_select(0, pos).view(-1, ctx.k, d).sum(dim=1)
        return grad_x, None, None, None


# ---------------------------------------------------------------------------------------------
# MoE layer
# ---------------------------------------------------------------------------------------------


class MoE(nn.Module):
    """Routed experts (+ optional shared expert). See the module docstring for the data flow."""

    def __init__(self, dim: int, args: MoEArgs):
        super().__init__()
        self.args = args
        self.dim = dim
        self.num_experts, self.top_k = args.num_experts, args.top_k
        # Rows per expert group are padded to a multiple of this. bf16 torch._grouped_mm needs no
        # group alignment on sm90 (it checks 16-byte alignment only for groups laid along the
        # contracting dim of a row-major operand, which the wgrad layout avoids; torchtitan now uses
        # 1 for bf16). fp8 row-wise GEMMs need 16, MXFP8 needs 32 (its K-blocks run along tokens
        # in the weight gradient): the float8 conversion sets it.
        self.token_group_align = 1
        self.router = Router(dim, args)
        self.experts = GroupedExperts(dim, args.hidden_dim, args.num_experts)
        self.shared_expert = (
            FeedForward(dim, args.num_shared_experts * args.shared_hidden_dim)
            if args.num_shared_experts > 0 else None
        )
        # tokens routed to each expert since the last update_bias (aux_free): summed over
        # gradient-accumulation micro-batches; a recompute under activation checkpointing adds the
        # same counts again, which scales every expert alike and so leaves the signs unchanged.
        # (int64: exact at any count, and Module.to(bfloat16) leaves integer buffers alone)
        self.register_buffer("load_since_update", torch.zeros(args.num_experts, dtype=torch.int64),
                             persistent=False)
        self.aux_loss: Tensor = torch.zeros(())
        self.tokens_per_expert: Tensor = torch.zeros(args.num_experts, dtype=torch.int64)
        # expert parallelism (titan_fp8.models.expert_parallel.ExpertParallel), set by titan_fp8.parallel
        self.ep = None

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"MoE: expected x [B, S, {self.dim}], got {tuple(x.shape)}")
        shape = x.shape
        xf = x.reshape(-1, self.dim)
        n = xf.shape[0]

        with record_function("moe.route"):
            weights, experts, scores = self.router(xf)
        if self.ep is not None:
            from titan_fp8.models.expert_parallel import ep_routed

            y, counts = ep_routed(self, xf, weights, experts)
        else:
            with torch.no_grad():
                plan = dispatch_plan(experts, self.num_experts, self.token_group_align)
            # the router's weight gradient reads xf: it is alive through backward whatever the experts save
            y = self.experts.routed(xf, weights, plan, x_kept=self.router.gate.weight.requires_grad)
            counts = plan.counts
        # the shared expert after the routed ones: computed first (session 17, benchmarks/results/issue9_s17/
        # call2_static_tied), inductor interleaved the two backwards and the llama_moe layer's peak rose 62 MB
        if self.shared_expert is not None:
            y = y + self.shared_expert(xf)

        self.tokens_per_expert = counts
        self.aux_loss = self._aux_loss(scores, counts, n)
        if self.args.load_balance == "aux_free" and self.training:
            with torch.no_grad():
                self.load_since_update.add_(counts)
        return y.view(shape)

    def _aux_loss(self, scores: Tensor, counts: Tensor, n: int) -> Tensor:
        """Switch-style load-balance loss over the batch, as DeepSeek V3 writes it for top-k:
        coef * sum_i f_i * P_i, f_i = E/(k N) * tokens_i, P_i = mean over tokens of the normalised
        score of expert i. Equals coef when routing is perfectly balanced."""
        if self.args.load_balance != "aux_loss" or self.args.aux_loss_coef == 0:
            return scores.new_zeros(())
        probs = scores if self.args.score_func == "softmax" else scores / scores.sum(-1, keepdim=True)
        f = counts.to(scores.dtype) * (self.num_experts / (self.top_k * n))
        return self.args.aux_loss_coef * (f * probs.mean(dim=0)).sum()

    @torch.no_grad()
    def update_bias(self, load: Tensor | None = None, skip: Tensor | None = None):
        """aux_free: bias += rate * sign(mean load - load), on device (no host sync).

        `load` overrides the locally counted tokens (the trainer passes the all-reduced counts so
        that every data-parallel rank moves its biases the same way). Resets the count. `skip` (0-dim,
        1.0 or 0.0, on the device): 1.0 leaves the bias alone and keeps the count for the next update, as
        if this call had not been made (the trainer's deferred check skips a failing step this way)."""
        if self.args.load_balance != "aux_free":
            return
        load = self.load_since_update if load is None else load
        load = load.to(self.router.expert_bias.dtype)
        step = torch.sign(load.mean() - load) * self.args.bias_update_rate
        if skip is None:
            self.router.expert_bias.add_(step)
            self.load_since_update.zero_()
        else:
            self.router.expert_bias.add_(step * (1 - skip).to(step.dtype))
            self.load_since_update.mul_(skip.to(self.load_since_update.dtype))

    def init_weights(self, init_std: float):
        self.router.init_weights()
        self.experts.init_weights(init_std)
        if self.shared_expert is not None:
            self.shared_expert.init_weights(init_std)
        self.load_since_update.zero_()
