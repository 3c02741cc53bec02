"""gloo worker for tests/cpu/test_float8_mx128_linear.py: FSDP2 float8 all-gather of mxfp8 "mx128" or "mx32" Linear
weights (128x128 tiles, the same bytes for both) on `world` CPU processes (argv: out_dir world [granularity]).
Saves per rank: the weight each Float8Linear saw
in its first forward (the decoded gathered weight, or the plain weight without float8 all-gather) and its type,
the full weights at that moment, losses with float8 all-gather on and off, the first step's gradients, how often
the Linear quantized a weight (128x128 tiles) itself, and the all-gather / MAX all-reduce counts."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from tests.cpu.float8_fsdp_worker import Counter  # noqa: E402  (collective counting, shared)

TOKENS, STEPS = 128, 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(128, 256, bias=False)   # 256 rows: 128 per rank over 2 ranks (whole tiles)
        self.w2 = nn.Linear(256, 256, bias=False)
        self.output = nn.Linear(256, 16, bias=False)  # excluded (filter_fqns default)

    def forward(self, x):
        return self.output(self.w2(torch.relu(self.w1(x)))).pow(2).mean()


def batch(step):
    g = torch.Generator().manual_seed(1000 + 17 * step + dist.get_rank())
    x = torch.randn(TOKENS, 128, generator=g)
    x[3] = 0  # an all-zero token
    x[5, :64] *= 1e4  # a block far above the rest
    return x


def train(all_gather: bool, granularity: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from titan_fp8.float8 import Float8Config, Float8Linear, check_float8_all_gather, convert_to_float8_training
    from titan_fp8.float8 import linear as f8linear

    from titan_fp8.float8.gathered import Float8GatheredWeight

    cfg = Float8Config(recipe_name="mxfp8", linear_granularity=granularity, emulate=True,
                       enable_fsdp_float8_all_gather=all_gather)
    torch.manual_seed(0)
    m = convert_to_float8_training(Net(), cfg)
    check_float8_all_gather(m, dist.get_world_size())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    # w1, w2 as their own FSDP units: FSDP2 reshards them after forward and gathers them again for backward
    # (into the same unsharded parameter, fsdp_post_all_gather's `out=` path); the root alone never regathers
    for mod in (m.w1, m.w2):
        fully_shard(mod, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    seen, seen_types, full, grads = {}, {}, {}, {}

    def hook(mod, args, name):
        if name not in seen:
            seen[name] = mod.weight.detach().clone()  # a gathered weight decodes on clone
            seen_types[name] = type(mod.weight).__name__
    for name, mod in m.named_modules():
        if isinstance(mod, Float8Linear):
            mod.register_forward_pre_hook(lambda mod, args, name=name: hook(mod, args, name))
    quantize_mx128, mx32_weight, weight_quantizations = f8linear._quantize_mx128, f8linear._mx32_weight, [0]

    def counting(t, tile, *args, **kwargs):  # mx128, tile=True: a 128x128-tile (weight) quantization in the Linear
        weight_quantizations[0] += bool(tile)
        return quantize_mx128(t, tile, *args, **kwargs)

    def counting_mx32(w, *args, **kwargs):  # mx32: the Linear's weight operand, quantized unless it was gathered
        weight_quantizations[0] += not isinstance(w, Float8GatheredWeight)
        return mx32_weight(w, *args, **kwargs)
    f8linear._quantize_mx128, f8linear._mx32_weight = counting, counting_mx32
    counter = Counter()
    losses = []
    for step in range(STEPS):
        if step == STEPS - 1:  # the weights the last step's forward quantizes
            full = {k: v.full_tensor().detach().clone() for k, v in m.state_dict().items()}
            seen.clear()
        loss = m(batch(step))
        loss.backward()
        if step == 0:
            grads = {k: p.grad.full_tensor().clone() for k, p in m.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    counter.restore()
    f8linear._quantize_mx128, f8linear._mx32_weight = quantize_mx128, mx32_weight
    return dict(losses=losses, seen=seen, seen_types=seen_types, full=full, grads=grads,
                weight_quantizations=weight_quantizations[0], ag_bytes=counter.ag_bytes,
                max_allreduce=counter.max_allreduce)


def main(rank, world, init_file, out_dir, granularity):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    res = {"on": train(True, granularity), "off": train(False, granularity)}
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp
    out_dir, world = sys.argv[1], int(sys.argv[2])
    granularity = sys.argv[3] if len(sys.argv) > 3 else "mx128"
    mp.spawn(main, args=(world, os.path.join(out_dir, "init"), out_dir, granularity), nprocs=world, join=True)
