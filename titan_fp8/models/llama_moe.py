"""Llama-style Mixture-of-Experts transformer, readable in one sitting.

tokens -> tok_embeddings -> n_layers x TransformerBlock -> norm -> output -> logits (float32)

TransformerBlock: h = x + attention(attention_norm(x)); out = h + ffn(ffn_norm(h)), where ffn is a
dense SwiGLU `feed_forward` for the first `n_dense_layers` blocks and a routed `moe` after that.
Attention is causal GQA with RoPE (rotate-half pairing) through F.scaled_dot_product_attention.

Build on the meta device and call `to_empty` + `init_weights` (the FSDP2 flow), or build on a real
device, which initialises at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from titan_fp8.models.moe import FeedForward, GroupedExperts, MoE, MoEArgs

__all__ = ["ModelArgs", "FLAVORS", "Transformer", "TransformerBlock", "Attention"]


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 256  # byte-level data
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 256
    n_dense_layers: int = 1  # first layers use a dense SwiGLU FFN instead of MoE
    dense_hidden_dim: int = 128
    moe: MoEArgs = field(default_factory=MoEArgs)

    def __post_init__(self):
        def bad(key, value, allowed):
            raise ValueError(f"ModelArgs.{key}={value!r} is invalid; allowed: {allowed}")

        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len"):
            if getattr(self, key) < 1:
                bad(key, getattr(self, key), ">= 1")
        if self.dim % self.n_heads:
            bad("n_heads", self.n_heads, f"a divisor of dim={self.dim}")
        if (self.dim // self.n_heads) % 2:
            bad("n_heads", self.n_heads, f"one giving an even head dim (dim={self.dim})")
        if self.n_heads % self.n_kv_heads:
            bad("n_kv_heads", self.n_kv_heads, f"a divisor of n_heads={self.n_heads}")
        if not 0 <= self.n_dense_layers <= self.n_layers:
            bad("n_dense_layers", self.n_dense_layers, f"0..n_layers ({self.n_layers})")
        if self.n_dense_layers > 0 and self.dense_hidden_dim < 1:
            bad("dense_hidden_dim", self.dense_hidden_dim, ">= 1 when n_dense_layers > 0")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            bad("norm_eps/rope_theta", (self.norm_eps, self.rope_theta), "> 0")
        if not isinstance(self.moe, MoEArgs):
            bad("moe", type(self.moe).__name__, "a MoEArgs")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


FLAVORS: dict[str, ModelArgs] = {
    # trains on 2 CPU cores: 1 dense block, 2 MoE blocks
    "debug": ModelArgs(
        dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=256,
        n_dense_layers=1, dense_hidden_dim=128,
        moe=MoEArgs(num_experts=4, top_k=2, hidden_dim=64, num_shared_experts=1, shared_hidden_dim=64),
    ),
    # ~2.83 B params (1.17 B active), 2 H200s with FSDP2 at seq_len 4096
    "llama_moe": ModelArgs(
        dim=4096, n_layers=8, n_heads=32, n_kv_heads=8, vocab_size=256, rope_theta=500000.0,
        max_seq_len=4096, n_dense_layers=0, dense_hidden_dim=11008,
        moe=MoEArgs(num_experts=8, top_k=2, hidden_dim=2816, num_shared_experts=1, shared_hidden_dim=2816),
    ),
    # DeepSeek-V3-sized expert shapes for benchmarks (GQA instead of MLA)
    "dsv3_layer": ModelArgs(
        dim=7168, n_layers=2, n_heads=56, n_kv_heads=8, vocab_size=256, rope_theta=10000.0,
        max_seq_len=4096, n_dense_layers=0, dense_hidden_dim=18432,
        moe=MoEArgs(num_experts=8, top_k=2, hidden_dim=2048, num_shared_experts=1, shared_hidden_dim=2048,
                    score_func="sigmoid", route_norm=True, load_balance="aux_free"),
    ),
}


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[Tensor, Tensor]:
    """cos, sin [max_seq_len, head_dim] in fp32 for rotate-half RoPE."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, S, H, Dh]; cos, sin [S, Dh]. Rotates pairs (i, i + Dh/2) in fp32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (xf * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, Dh]
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:  # query head h reads kv head h // rep
            k = k.unsqueeze(2).expand(b, self.n_kv_heads, rep, s, self.head_dim).reshape(b, self.n_heads, s, -1)
            v = v.unsqueeze(2).expand(b, self.n_kv_heads, rep, s, self.head_dim).reshape(b, self.n_heads, s, -1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def init_weights(self, init_std: float):
        for lin in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.is_moe = layer_id >= args.n_dense_layers
        if self.is_moe:
            self.moe = MoE(args.dim, args.moe)
        else:
            self.feed_forward = FeedForward(args.dim, args.dense_hidden_dim)
        # depth-scaled init of the projections that write into the residual stream (torchtitan's)
        self.init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        ffn = self.moe if self.is_moe else self.feed_forward
        return h + ffn(self.ffn_norm(h))

    def init_weights(self):
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.init_std)
        (self.moe if self.is_moe else self.feed_forward).init_weights(self.init_std)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if self.output.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """Deterministic given torch.manual_seed: the same draws in the same order however the module
        was built (also after meta -> to_empty, where the RoPE tables are recomputed too)."""
        device = self.output.weight.device
        cos, sin = rope_tables(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, device=device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        std = self.args.dim ** -0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [B, S] int64 -> logits [B, S, vocab] in float32."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"Transformer: tokens must be integer [B, S], got {tokens.dtype} {tuple(tokens.shape)}")
        seq_len = tokens.shape[1]
        if seq_len > self.args.max_seq_len:
            raise ValueError(f"Transformer: sequence length {seq_len} exceeds max_seq_len={self.args.max_seq_len}")
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return self.output(self.norm(h)).float()

    def moe_layers(self) -> list[MoE]:
        # by type, not through self.layers: parallelize wraps blocks (checkpoint, torch.compile)
        return [m for m in self.modules() if isinstance(m, MoE)]

    def aux_loss(self) -> Tensor:
        """Sum over MoE layers of the load-balance loss of the last forward (0-dim tensor)."""
        losses = [m.aux_loss for m in self.moe_layers()]
        if not losses:
            return torch.zeros((), device=self.output.weight.device)
        return torch.stack([loss.to(losses[0].device) for loss in losses]).sum()

    @torch.no_grad()
    def update_router_biases(self, skip: torch.Tensor | None = None):
        """aux_free: move every MoE layer's expert bias toward balance. Call after optimizer.step().

        With torch.distributed initialised, the token counts of all layers are summed over the
        default process group in ONE all-reduce, so every rank updates its biases alike. `skip`: a 0-dim
        float tensor on the device, 1.0 for a step the trainer skips on the device (update_bias)."""
        layers = [m for m in self.moe_layers() if m.args.load_balance == "aux_free"]
        if not layers:
            return
        loads = torch.stack([m.load_since_update for m in layers])
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(loads)
        for m, load in zip(layers, loads):
            m.update_bias(load, skip)

    def num_params(self, active_only: bool = False) -> int:
        """All parameters, or (active_only) those one token uses, embedding table excluded: the
        routed experts count top_k / num_experts of their size; the output head counts (as in
        torchtitan's FLOP count)."""
        if not active_only:
            return sum(p.numel() for p in self.parameters())
        total = 0.0
        for module in self.modules():
            if module is self.tok_embeddings:
                continue
            own = sum(p.numel() for p in module.parameters(recurse=False))
            if isinstance(module, GroupedExperts):
                own = own * self.args.moe.top_k / self.args.moe.num_experts
            total += own
        return int(round(total))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 * active non-embedding params + 12 * L * H * Dh * S (attention
        scores and values, forward + backward, torchtitan's count without the causal halving)."""
        a = self.args
        return 6.0 * self.num_params(active_only=True) + 12.0 * a.n_layers * a.n_heads * a.head_dim * seq_len


def flavor(name: str, **overrides) -> ModelArgs:
    """A copy of FLAVORS[name] with top-level fields replaced; clear error for unknown names."""
    if name not in FLAVORS:
        raise ValueError(f"unknown model flavor {name!r}; allowed: {sorted(FLAVORS)}")
    return replace(FLAVORS[name], **overrides)
