"""2-process gloo worker for tests/cpu/test_float8_fsdp.py: runs every FSDP2 float8 scenario once and saves
what the tests assert on (losses, collective counts and bytes, gathered weights) per rank."""
from __future__ import annotations

import dataclasses
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DIM, HID, TOKENS, STEPS = 64, 128, 64, 10
# FLOAT8_WORKER_DEVICE=cuda: the same scenarios over NCCL, one GPU per rank, real float8 GEMMs (tests/gpu)
DEVICE = os.environ.get("FLOAT8_WORKER_DEVICE", "cpu")
EMULATE = DEVICE == "cpu"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HID, bias=False)
        self.w2 = nn.Linear(HID, DIM, bias=False)

    def forward(self, x):
        return x + self.w2(F.silu(self.w1(x)))


class Net(nn.Module):
    """Two blocks, an excluded `output` head, and a float8 `tiny` Linear [DIM -> 1] whose second FSDP shard is
    EMPTY with 2 ranks (it must still join the AMAX all-reduce)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.tiny = nn.Linear(DIM, 1, bias=False)
        self.output = nn.Linear(DIM, 16, bias=False)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.output(x).float().pow(2).mean() + self.tiny(x).float().pow(2).mean()


class Counter:
    """Wraps the collectives FSDP2 and our code call: bytes handed to all-gathers, AMAX (MAX) all-reduces."""

    def __init__(self):
        self.ag_bytes = 0
        self.ag_calls = 0
        self.max_allreduce = 0
        self._orig = {}
        for name in ("all_gather_into_tensor", "all_gather_single", "all_reduce"):
            if hasattr(dist, name):
                self._orig[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self._orig[name]))

    def _wrap(self, name, fn):
        def wrapped(*args, **kwargs):
            if name == "all_reduce":
                op = kwargs.get("op", args[1] if len(args) > 1 else dist.ReduceOp.SUM)
                if op == dist.ReduceOp.MAX:
                    self.max_allreduce += 1
            else:
                inp = kwargs.get("input_tensor", args[1] if len(args) > 1 else None)
                self.ag_bytes += inp.numel() * inp.element_size()
                self.ag_calls += 1
            return fn(*args, **kwargs)
        return wrapped

    def restore(self):
        for name, fn in self._orig.items():
            setattr(dist, name, fn)


def build(config, fsdp: bool, param_dtype=None, force_tiny=True, batched=False):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from titan_fp8.float8 import Float8Linear, convert_to_float8_training

    torch.manual_seed(0)
    m = Net().to(device())
    if config is not None and force_tiny:
        # [64 -> 1]: forced, to get an empty shard; made before convert_to_float8_training, which puts it in the
        # model's ScaleGroup (one all-reduce for all weights' scales)
        # model's ScaleGroup (one all-reduce for all weights' scales). Its GEMMs are emulated even on a GPU:
        # _scaled_mm needs every dim divisible by 16, and only the all-gather / amax path is under test here.
        m.tiny = Float8Linear.from_linear(m.tiny, dataclasses.replace(config, emulate=True))
    if config is not None:
        convert_to_float8_training(m, config)
    if fsdp:
        mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
        mp = MixedPrecisionPolicy(param_dtype=param_dtype) if param_dtype else MixedPrecisionPolicy()
        for b in m.layers:
            fully_shard(b, mesh=mesh, mp_policy=mp)
            if batched:  # what parallelize does: one cast launch per block all-gather
                from titan_fp8.float8 import batch_weight_casts
                assert batch_weight_casts(b) == {"tensorwise": 2}
        fully_shard(m, mesh=mesh, mp_policy=mp)
    return m


def device():
    return torch.device(DEVICE, dist.get_rank()) if DEVICE == "cuda" else torch.device("cpu")


def batch(step):
    g = torch.Generator().manual_seed(1000 + 17 * step + dist.get_rank())
    return torch.randn(TOKENS, DIM, generator=g).to(device())


def train(config, fsdp=True, precompute=False, steps=STEPS, param_dtype=None, skip_precompute_at=(),
          fused=False, record_weights=False, batched=False):
    from titan_fp8.float8 import Float8Linear, precompute_float8_dynamic_scale_for_fsdp

    m = build(config, fsdp, param_dtype, force_tiny=config is None or config.recipe_name == "tensorwise",
              batched=batched)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=not fused, fused=fused)
    recorded = {}
    if record_weights:
        def hook(mod, args, name):
            w = mod.weight
            if name not in recorded:
                recorded[name] = {"data": getattr(w, "_data", w).detach().cpu().clone(),
                                  "scale": getattr(w, "_scale", torch.tensor(float("nan"))).detach().cpu().clone()}
        for name, mod in m.named_modules():
            if isinstance(mod, Float8Linear):
                mod.register_forward_pre_hook(lambda mod, args, name=name: hook(mod, args, name))
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
                for k, v in m.state_dict().items()}
    counter = Counter()
    if precompute:
        precompute_float8_dynamic_scale_for_fsdp(m)  # at start-up: step 1 pays no per-weight all-reduce
    losses, per_step_max_ar = [], []
    for step in range(steps):
        before = counter.max_allreduce
        loss = m(batch(step))
        loss.backward()
        if not fsdp:  # reference: average gradients exactly as FSDP2's reduce-scatter does
            for p in m.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())
        opt.step()
        opt.zero_grad(set_to_none=True)
        if precompute and step not in skip_precompute_at:
            precompute_float8_dynamic_scale_for_fsdp(m)
        losses.append(loss.item())
        per_step_max_ar.append(counter.max_allreduce - before)
    counter.restore()
    out = {"losses": losses, "per_step_max_allreduce": per_step_max_ar, "ag_bytes": counter.ag_bytes,
           "ag_calls": counter.ag_calls}
    if record_weights:
        out["recorded"] = recorded
        out["full_weights"] = full
    return out, m


def dcp_roundtrip(config, tmpdir):
    """Train 3 steps, save with DCP, train 3 more (A); fresh model loads the checkpoint, trains 3 (B)."""
    import torch.distributed.checkpoint as dcp

    from titan_fp8.float8 import precompute_float8_dynamic_scale_for_fsdp

    m = build(config, True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)

    def run(model, optim, steps, start):
        out = []
        for s in range(start, start + steps):
            loss = model(batch(s))
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            if config.precompute_float8_dynamic_scale_for_fsdp:
                precompute_float8_dynamic_scale_for_fsdp(model)
            out.append(loss.item())
        return out

    if config.precompute_float8_dynamic_scale_for_fsdp:
        precompute_float8_dynamic_scale_for_fsdp(m)
    run(m, opt, 3, 0)
    sd = m.state_dict()
    kinds = sorted({type(getattr(v, "_local_tensor", v)).__name__ for v in sd.values()})
    dcp.save({"model": sd, "optim": opt.state_dict()}, checkpoint_id=tmpdir)
    a = run(m, opt, 3, 3)

    m2 = build(config, True)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, foreach=True)
    m2(batch(0)).backward()  # materialize optimizer state so its state_dict has the keys to load into
    opt2.step()
    opt2.zero_grad(set_to_none=True)
    state = {"model": m2.state_dict(), "optim": opt2.state_dict()}
    dcp.load(state, checkpoint_id=tmpdir)
    m2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optim"])
    if config.precompute_float8_dynamic_scale_for_fsdp:
        precompute_float8_dynamic_scale_for_fsdp(m2)
    b = run(m2, opt2, 3, 3)
    return {"after_save": a, "after_load": b, "state_dict_local_types": kinds}


def mxfp8_gather(tmp):
    """The mxfp8 "mx32_tile32" all-gathered weight (the Float8GatheredWeight's bytes and 32x32 tile scales) vs
    quantize-after-gather, and AG on/off losses (the 128x128-tile granularities: float8_mx128_fsdp_worker.py)."""
    from kernels.mxfp8 import to_mxfp8_tiles32

    from titan_fp8.float8 import Float8Config
    on = Float8Config(recipe_name="mxfp8", linear_granularity="mx32_tile32", emulate=EMULATE,
                      enable_fsdp_float8_all_gather=True)
    off = Float8Config(recipe_name="mxfp8", linear_granularity="mx32_tile32", emulate=EMULATE)
    res_on, _ = train(on, steps=3, record_weights=True)
    res_off, _ = train(off, steps=3)
    exact = {}
    for name, rec in res_on["recorded"].items():
        if name == "tiny":
            continue
        full = res_on["full_weights"][name + ".weight"]
        d, sk, _ = to_mxfp8_tiles32(full)
        exact[name] = (rec["data"].dtype == torch.float8_e4m3fn
                       and bool(torch.equal(rec["data"].view(torch.uint8), d.view(torch.uint8)))
                       and bool(torch.equal(rec["scale"], sk[::32])))
    return {"exact": exact, "losses_on": res_on["losses"], "losses_off": res_off["losses"],
            "max_allreduce_on": res_on["per_step_max_allreduce"]}


def main(rank, world, init_file, out_dir):
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    from titan_fp8.float8 import Float8Config
    from titan_fp8.float8.scaling import amax_to_scale, to_float8

    tw = dict(recipe_name="tensorwise", emulate=EMULATE)
    ag = Float8Config(**tw, enable_fsdp_float8_all_gather=True)
    ag_pre = Float8Config(**tw, enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True)
    no_ag = Float8Config(**tw)
    results = {}
    # (a) bytes at the collective: float8 all-gather vs bf16 all-gather (bf16 mixed precision both)
    results["bytes_fp8"] = train(ag, steps=2, param_dtype=torch.bfloat16)[0]["ag_bytes"]
    results["bytes_bf16"] = train(no_ag, steps=2, param_dtype=torch.bfloat16)[0]["ag_bytes"]
    # (b) gathered float8 weight vs all-gather-then-cast with the global scale
    res, _ = train(ag_pre, steps=1, precompute=True, record_weights=True)
    exact = {}
    for name, rec in res["recorded"].items():
        full = res["full_weights"][name + ".weight"]
        scale = amax_to_scale(full.abs().max().float(), torch.float8_e4m3fn)
        ref = to_float8(full, scale, torch.float8_e4m3fn)
        exact[name] = (bool(torch.equal(rec["data"].view(torch.uint8), ref.view(torch.uint8)))
                       and bool(torch.equal(rec["scale"], scale)))
    results["gather_exact"] = exact
    res_np, _ = train(ag, steps=1, record_weights=True)
    results["gather_exact_no_precompute"] = {
        n: bool(torch.equal(r["data"].view(torch.uint8), res["recorded"][n]["data"].view(torch.uint8)))
        for n, r in res_np["recorded"].items()}
    # (c) one AMAX all-reduce per step with precompute; losses equal no-precompute and non-FSDP reference
    results["pre"] = train(ag_pre, precompute=True)[0]
    results["nopre"] = train(ag)[0]
    results["noag"] = train(no_ag)[0]
    results["ref"] = train(no_ag, fsdp=False)[0]
    # a forgotten precompute after a FUSED optimizer step must not reuse the stale cast
    results["stale"] = train(ag_pre, precompute=True, steps=4, skip_precompute_at=(1,), fused=True)[0]
    results["stale_ref"] = train(no_ag, fsdp=False, steps=4, fused=True)[0]
    # the blocks' weights cast by ONE launch per all-gather (parallelize's batch_tensorwise_casts): same losses,
    # every block member's bytes from that launch, the unbatched `tiny` cast alone
    import kernels.float8_cast as fc
    from titan_fp8.float8 import weights
    calls = {"many": 0, "alone": 0}
    many, alone = fc.to_float8_tensorwise_many, weights.to_float8_fused

    def counting_many(xs, *a, **k):
        calls["many"] += 1
        return many(xs, *a, **k)

    def counting_alone(x, *a, **k):
        calls["alone"] += 1
        return alone(x, *a, **k)
    fc.to_float8_tensorwise_many, weights.to_float8_fused = counting_many, counting_alone
    try:
        results["batched"] = train(ag_pre, precompute=True, batched=True)[0]
        results["batched_calls"] = dict(calls)
        results["batched_stale"] = train(ag_pre, precompute=True, steps=4, skip_precompute_at=(1,), fused=True,
                                         batched=True)[0]
    finally:
        fc.to_float8_tensorwise_many, weights.to_float8_fused = many, alone
    # checkpoints
    ck = os.path.join(out_dir, "dcp")
    results["dcp"] = dcp_roundtrip(ag_pre, ck)
    results["mxfp8"] = mxfp8_gather(out_dir)
    save_and_finish(results, out_dir, rank)


def save_and_finish(results, out_dir, rank):
    """Each rank writes its results for the test to read, then leaves the process group together."""
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def spawn_two(main):
    """Run main(rank, 2, init_file, out_dir) on 2 processes, out_dir from the command line."""
    import torch.multiprocessing as mp
    out_dir = sys.argv[1]
    mp.spawn(main, args=(2, os.path.join(out_dir, "init"), out_dir), nprocs=2, join=True)


if __name__ == "__main__":
    spawn_two(main)
