"""2-process gloo worker for tests/cpu/test_float8_experts_fsdp.py: FSDP2 float8 all-gather of 3-D expert
weights (expert_weights.Float8ExpertWeight), every scenario once; saves what the tests assert on per rank.

The expert GEMMs here are a test-local emulated op (`EmulatedExpertMM`: dequantize the contract-1 operands,
fp32 bmm; every expert gets an equal slice of the tokens): what is under test is the all-gather, the scales
and the gradients' way back, not the fused expert path (tests/cpu/test_float8_moe_fused.py)."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (ROOT, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from float8_fsdp_worker import Counter, save_and_finish, spawn_two  # noqa: E402  (bytes at FSDP2's all-gather entry points, MAX all-reduces)

# w13 [E, 192, 192], w2 [E, 192, 96]: several 128x128 tiles per expert, partial edge tiles, and with Shard(1)
# (96 rows per rank) tiles that straddle the two shards
DIM, HID, TOKENS = 192, 96, 64


def dequant_fwd(ops, recipe):
    from titan_fp8.float8.expert_weights import dequantize_operands
    return dequantize_operands(ops, recipe, torch.float32)


def dequant_bwd(ops, recipe):
    """[E, K, N] decoded from the dgrad operands."""
    if recipe == "fp8_rowwise":
        return ops.bwd_data.float() / ops.bwd_scale.unsqueeze(-1)
    from kernels.mxfp8 import from_mxfp8
    return from_mxfp8(ops.bwd_data, ops.bwd_scale.transpose(1, 2).contiguous(), -1, torch.float32)


class EmulatedExpertMM(torch.autograd.Function):
    """out[e] = x[e] @ W[e]^T (x [E, T, K]) from contract-1 operands; dgrad from the bwd operands."""

    @staticmethod
    def forward(ctx, x, w, recipe, gran):
        from titan_fp8.float8.expert_weights import expert_weight_operands
        ops = expert_weight_operands(w, recipe, gran, which="fwd")
        ctx.save_for_backward(x, w)
        ctx.recipe, ctx.gran, ctx.w_dtype = recipe, gran, w.dtype
        return torch.bmm(x.float(), dequant_fwd(ops, recipe).transpose(1, 2)).to(x.dtype)

    @staticmethod
    def backward(ctx, dout):
        from titan_fp8.float8.expert_weights import expert_weight_operands
        x, w = ctx.saved_tensors
        ops = expert_weight_operands(w, ctx.recipe, ctx.gran, which="bwd")
        wk = dequant_bwd(ops, ctx.recipe)  # [E, K, N]
        dx = torch.bmm(dout.float(), wk.transpose(1, 2)).to(x.dtype)
        dw = torch.bmm(dout.float().transpose(1, 2), x.float()).to(ctx.w_dtype)
        return dx, dw, None, None


class Experts(nn.Module):
    def __init__(self, E, recipe, gran):
        super().__init__()
        self.recipe, self.gran = recipe, gran
        self.w13 = nn.Parameter(torch.randn(E, 2 * HID, DIM) * 0.05)
        self.w2 = nn.Parameter(torch.randn(E, DIM, HID) * 0.05)
        with torch.no_grad():
            self.w13[:, HID:] *= 4  # gate and up halves at different magnitudes
            self.w2[0, :5, :7] = 0.0

    def forward(self, x):
        E = self.w13.shape[0]
        xe = x.reshape(E, -1, x.shape[-1])
        h = EmulatedExpertMM.apply(xe, self.w13, self.recipe, self.gran)
        h1, h3 = h.chunk(2, dim=-1)
        return EmulatedExpertMM.apply(F.silu(h1) * h3, self.w2, self.recipe, self.gran).reshape(x.shape)


class Block(nn.Module):
    def __init__(self, E, recipe, gran, linears):
        super().__init__()
        self.experts = Experts(E, recipe, gran)
        self.proj = nn.Linear(DIM, DIM, bias=False) if linears else None

    def forward(self, x):
        if self.proj is not None:
            x = x + self.proj(x)
        return x + self.experts(x)


class Net(nn.Module):
    def __init__(self, E, recipe, gran, linears):
        super().__init__()
        self.layers = nn.ModuleList([Block(E, recipe, gran, linears) for _ in range(2)])

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x


def build(recipe, gran, E, ag, fsdp=True, linears=False, shard1=False, precompute=False, param_dtype=None,
          batched=None):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    from titan_fp8.float8 import Float8Config, convert_to_float8_training
    from titan_fp8.float8.convert import wrap_expert_weights_for_all_gather

    torch.manual_seed(0)
    m = Net(E, recipe, gran, linears)
    cfg = Float8Config(recipe_name="tensorwise", emulate=True, moe_recipe_name=recipe, moe_granularity=gran,
                       enable_fsdp_float8_all_gather=ag, precompute_float8_dynamic_scale_for_fsdp=precompute)
    if ag:
        for b in m.layers:
            wrap_expert_weights_for_all_gather(b.experts, cfg)
    convert_to_float8_training(m, cfg)  # the tensorwise Linears, and the model's one ScaleGroup
    if fsdp:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        kw = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype))
        if shard1:
            kw["shard_placement_fn"] = lambda p: Shard(1) if p.ndim == 3 else None
        for b in m.layers:
            fully_shard(b, **kw)
            if batched is not None:  # what parallelize does: one quantization launch per block all-gather
                from titan_fp8.float8 import batch_weight_casts
                assert batch_weight_casts(b) == {"mx128": 2}
                batch = b.experts._float8_cast_batch
                cast_all = batch._cast_all
                batch._cast_all = lambda *a, f=cast_all: batched.append(1) or f(*a)
        fully_shard(m, **kw)
    return m


def batch(step):
    g = torch.Generator().manual_seed(1000 + 17 * step + dist.get_rank())
    return torch.randn(TOKENS, DIM, generator=g)


def train(recipe, gran, E, ag, steps=3, record=False, precompute=False, **kw):
    from titan_fp8.float8.gathered import Float8GatheredWeight

    m = build(recipe, gran, E, ag, precompute=precompute, **kw)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
    recorded, full = {}, {}
    if record:
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                for k, v in m.state_dict().items()}

        def hook(mod, args, name):
            for pn in ("w13", "w2"):
                w = getattr(mod, pn)
                if f"{name}.{pn}" not in recorded and isinstance(w, Float8GatheredWeight):
                    recorded[f"{name}.{pn}"] = {"data": w._data.view(torch.uint8).clone(), "scale": w._scale.clone(),
                                                "shape": tuple(w.shape)}
        for name, mod in m.named_modules():
            if isinstance(mod, Experts):
                mod.register_forward_pre_hook(lambda mod, args, name=name: hook(mod, args, name))
    out = run_steps(m, opt, [batch(s) for s in range(steps)], precompute, sync_grads=not kw.get("fsdp", True))
    return {**out, "recorded": recorded, "full": full}


def run_steps(m, opt, batches, precompute, sync_grads=False):
    """Train on `batches` (loss = mean square of the output), counting MAX all-reduces per step (the
    precompute call after each step included, as the trainer makes it)."""
    from titan_fp8.float8 import precompute_float8_dynamic_scale_for_fsdp

    counter = Counter()
    if precompute:
        precompute_float8_dynamic_scale_for_fsdp(m)  # at start-up: step 1 pays no all-reduce in its gathers
    losses, per_step, grad_types = [], [], set()
    for x in batches:
        before = counter.max_allreduce
        loss = m(x).float().pow(2).mean()
        loss.backward()
        if sync_grads:  # non-FSDP reference: average gradients as FSDP2's reduce-scatter does
            for p in m.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())
        grad_types |= {type(getattr(p.grad, "_local_tensor", p.grad)).__name__ for p in m.parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        if precompute:
            precompute_float8_dynamic_scale_for_fsdp(m)
        losses.append(loss.item())
        per_step.append(counter.max_allreduce - before)
    counter.restore()
    return {"losses": losses, "per_step_max_allreduce": per_step, "ag_bytes": counter.ag_bytes,
            "grad_types": sorted(grad_types)}


def exact_vs_quantize_after_gather(res, recipe, gran):
    from titan_fp8.float8.expert_weights import compact_scale, local_group_amax, quantize_expert_weight
    out = {}
    for name, rec in res["recorded"].items():
        w = res["full"][name]
        ops = quantize_expert_weight(w, recipe, gran, "fwd")
        scale = compact_scale(local_group_amax(w, (0, 0, 0), w.shape, recipe), recipe)
        out[name] = (rec["shape"] == tuple(w.shape)
                     and torch.equal(rec["data"], ops.fwd_data.view(torch.uint8))
                     and torch.equal(rec["scale"].view(torch.uint8), scale.view(torch.uint8)))
    return out


RECIPES = [("fp8_rowwise", None), ("mxfp8", "mx128"), ("mxfp8", "mx32")]


class MoEBlock(nn.Module):
    def __init__(self, E):
        super().__init__()
        from titan_fp8.models.moe import MoE, MoEArgs
        self.proj = nn.Linear(128, 128, bias=False)
        self.moe = MoE(128, MoEArgs(num_experts=E, top_k=min(2, E), hidden_dim=128, load_balance="none"))
        self.moe.init_weights(0.05)

    def forward(self, x):
        x = x + self.proj(x)
        return x + self.moe(x)


def moe_train(recipe, gran, E, ag, precompute=False, steps=3):
    """The real float8 expert module (Float8GroupedExperts from convert_to_float8_training, emulated) under
    FSDP2 with tensorwise Linears."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from titan_fp8.float8 import Float8Config, convert_to_float8_training

    torch.manual_seed(0)
    m = nn.Sequential(*[MoEBlock(E) for _ in range(2)])
    cfg = Float8Config(recipe_name="tensorwise", emulate=True, moe_recipe_name=recipe, moe_granularity=gran,
                       enable_fsdp_float8_all_gather=ag, precompute_float8_dynamic_scale_for_fsdp=precompute)
    convert_to_float8_training(m, cfg)
    seen = set()
    for b in m:
        b.moe.register_forward_pre_hook(lambda mod, args: seen.add(
            (type(mod.experts).__name__, type(mod.experts.w13).__name__, type(mod.experts.w2).__name__)))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for b in m:
        fully_shard(b, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
    batches = [torch.randn(1, 64, 128, generator=torch.Generator().manual_seed(77 + 5 * s + dist.get_rank()))
               for s in range(steps)]
    out = run_steps(m, opt, batches, precompute)
    # checkpoints hold the plain high-precision expert weights, never the float8 subclasses
    kinds = sorted({type(getattr(v, "_local_tensor", v)).__name__ for v in m.state_dict().values()})
    return {**out, "seen": sorted(seen), "state_dict_types": kinds}


def main(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for recipe, gran in RECIPES:
        key = recipe if gran is None else f"{recipe}:{gran}"
        r = {}
        # bytes at the collective: float8 vs bf16 all-gather of the same expert-only model (bf16 mixed precision)
        r["bytes_fp8"] = train(recipe, gran, 4, True, steps=1, param_dtype=torch.bfloat16)["ag_bytes"]
        r["bytes_bf16"] = train(recipe, gran, 4, False, steps=1, param_dtype=torch.bfloat16)["ag_bytes"]
        # gathered == quantize-after-gather: whole experts per rank (scales travel), 1 expert over 2 ranks
        # (one empty shard), Shard(1) (rows of every expert, hence tiles, split across ranks)
        for case, kw in (("even", dict(E=4)), ("one_expert", dict(E=1)), ("shard1", dict(E=2, shard1=True))):
            res = train(recipe, gran, kw.pop("E"), True, record=True, **kw)
            r[f"exact_{case}"] = exact_vs_quantize_after_gather(res, recipe, gran)
            r[f"losses_{case}"] = res["losses"]
            r[f"ar_{case}"] = res["per_step_max_allreduce"]
            r[f"grad_types_{case}"] = res["grad_types"]
            ref = train(recipe, gran, {"even": 4, "one_expert": 1, "shard1": 2}[case], False, fsdp=False)
            r[f"losses_ref_{case}"] = ref["losses"]
        # ONE AMAX all-reduce per step for tensorwise Linears + experts whose groups straddle shards
        for case, kw in (("shard1", dict(E=2, shard1=True)), ("one_expert", dict(E=1)), ("even", dict(E=4))):
            for pre in (True, False):
                res = train(recipe, gran, kw["E"], True, linears=True, precompute=pre, steps=3,
                            **{k: v for k, v in kw.items() if k != "E"})
                r[f"ar_linears_{case}_{'pre' if pre else 'nopre'}"] = res["per_step_max_allreduce"]
                r[f"losses_linears_{case}_{'pre' if pre else 'nopre'}"] = res["losses"]
            r[f"losses_linears_{case}_noag"] = train(recipe, gran, kw["E"], False, linears=True, steps=3)["losses"]
        # the real fused expert module: float8-gathered vs bf16-gathered weights give the same training
        for E in (4, 1):
            r[f"moe_{E}_pre"] = moe_train(recipe, gran, E, True, precompute=True)
            r[f"moe_{E}_nopre"] = moe_train(recipe, gran, E, True)
            r[f"moe_{E}_noag"] = moe_train(recipe, gran, E, False)
        if recipe == "mxfp8":
            # w13 and w2 of each block quantized by ONE call per all-gather (2 blocks x forward + backward's
            # regather x 3 steps); the same gathered bytes and losses as one quantization per weight
            calls = []
            res = train(recipe, gran, 4, True, record=True, batched=calls)
            r["exact_even_batched"] = exact_vs_quantize_after_gather(res, recipe, gran)
            r["losses_even_batched"] = res["losses"]
            r["batched_calls"] = len(calls)
        results[key] = r
    save_and_finish(results, out_dir, rank)


if __name__ == "__main__":
    spawn_two(main)
