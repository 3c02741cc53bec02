"""gloo worker for tests/cpu/test_expert_parallel.py: expert parallelism on the debug model (fp32, CPU).

    python expert_parallel_worker.py OUT_DIR WORLD CASES_JSON

CASES_JSON names a JSON list of cases, run in order by the same process group (one launch: the 2-core CI pays
torch's import and gloo's start once, not once per case). A case is {"name", "scenario", "args", and optionally
"force_route", "save_dcp"}; each saves OUT_DIR/NAME/rank{r}.pt before the next starts, so a crash in one case
leaves the earlier cases' results and the traceback names the case.

SCENARIO "train": builds the model as launch/train.py does (build_model -> build_mesh -> parallelize ->
build_optimizer) with the given config overrides, trains 3 steps on fixed batches (every rank its own rows of one
global batch), and saves per rank: losses (averaged over ranks), grad norms, the full parameters after the steps,
and every all_to_all_single call (bytes, dtype, shape) seen at the collective during the case. With
"force_route": A every token is routed to experts [0, A) only (A = E/ep: EP rank 0's experts; the others get no
rows). With "save_dcp": true rank 0's model state dict is also saved with DCP to OUT_DIR/NAME/dcp (resharding
test). build_model seeds torch from the config, so a case does not depend on the cases before it.
SCENARIO "dispatch" (args: RECIPE [GRANULARITY]): float8 dispatch of hand-made rows (zeros, subnormals, huge
values, uneven splits incl. 0) against a bf16 all_to_all followed by quantization on the receiver: saves both for
a bit-for-bit comparison.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DEBUG_TOML = os.path.join(ROOT, "train_configs", "debug_moe.toml")
SMALL = ["--training.seq_len=16", "--training.local_batch_size=2", "--training.seed=3", "--optimizer.lr=3e-3",
         "--lr_scheduler.warmup_steps=1", "--training.max_norm=0.5"]
STEPS = 3
DISPATCH_DIM = 128  # a multiple of every MX block and weight tile (mx128, mx32)

A2A_CALLS: list = []


def _record_all_to_all():
    real = dist.all_to_all_single

    def recording(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        A2A_CALLS.append({"bytes": input.numel() * input.element_size(), "dtype": str(input.dtype),
                          "shape": tuple(input.shape)})
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    dist.all_to_all_single = recording


@contextlib.contextmanager
def _force_route(allowed: int | None):
    if allowed is None:
        yield
        return
    from titan_fp8.models import moe as moe_mod

    real = moe_mod.Router.forward

    def forward(self, x):
        weights, experts, scores = real(self, x)
        return weights, experts % allowed, scores  # only experts [0, allowed)

    moe_mod.Router.forward = forward
    try:
        yield
    finally:  # the next case routes normally
        moe_mod.Router.forward = real


def train(rank, world, out_dir, overrides, save_dcp=False):
    from titan_fp8.config import load_config
    from titan_fp8.parallel import build_mesh, parallelize
    from titan_fp8.train.optim import build_optimizer, grad_norm_and_clip
    from titan_fp8.train.trainer import build_model

    cfg = load_config(DEBUG_TOML, [*SMALL, *overrides], world_size=world)
    device = torch.device("cpu")
    mesh = build_mesh(cfg, "cpu", world)
    model, _ = build_model(cfg, device, lambda *a, **k: None)
    model = parallelize(model, cfg, mesh)
    model.train()
    opt = build_optimizer(model, cfg.optimizer, device)
    params = [p for p in model.parameters() if p.requires_grad]
    b, s = cfg.training.local_batch_size, cfg.training.seq_len
    losses, norms = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)
        batch = torch.randint(0, 256, (world * b, s + 1), generator=g)[rank * b:(rank + 1) * b]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()) + model.aux_loss()
        loss.backward()
        norms.append(float(grad_norm_and_clip(params, cfg.training.max_norm)))
        opt.step()
        opt.zero_grad()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(float(avg) / world)
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}
    if save_dcp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        dcp.save(get_model_state_dict(model), checkpoint_id=os.path.join(out_dir, "dcp"))
    return {"losses": losses, "norms": norms, "params": full, "a2a": list(A2A_CALLS),
            "mesh": (tuple(mesh.shape), mesh.mesh_dim_names)}


def dispatch(rank, world, recipe, granularity):
    """float8 dispatch vs bf16 dispatch + quantize on the receiver, on rows with special values."""
    from titan_fp8.float8.experts import Float8GroupedExperts, quantize_dispatch_rows
    from titan_fp8.models.expert_parallel import all_to_all

    ex = Float8GroupedExperts(DISPATCH_DIM, DISPATCH_DIM, 2, recipe, granularity, backend="emulated")
    g = torch.Generator().manual_seed(rank)
    send = [[0, 5], [3, 1]][rank]  # rows this rank sends to rank 0, 1 (rank 0 sends none to itself)
    recv = [send_j[rank] for send_j in ([0, 5], [3, 1])]
    rows = sum(send)
    x = (torch.randn(rows, DISPATCH_DIM, generator=g) * torch.logspace(-3, 3, DISPATCH_DIM)).to(torch.bfloat16)
    if rows >= 3:
        x[0] = 0                          # a zero row
        x[1, :8] = 1e-40                  # subnormal in fp32 (bf16 keeps some)
        x[2, 8:16] = 3e38                 # huge (near bf16 max)
    plain = all_to_all(x, recv, send, dist.group.WORLD)
    want = quantize_dispatch_rows(plain, ex.spec(plain.device))
    calls = len(A2A_CALLS)
    x_recv, (data, scale) = ex.dispatch_float8(x, recv, send, dist.group.WORLD)
    return {"want": [t.view(torch.uint8) if t.dtype != torch.float32 else t for t in want],
            "got": [t.view(torch.uint8) if t.dtype != torch.float32 else t for t in (data, scale)],
            "x_recv": x_recv, "plain": plain, "a2a_float8": A2A_CALLS[calls:]}


def main():
    out_dir, world, cases_json = sys.argv[1:]
    world = int(world)
    with open(cases_json) as f:
        cases = json.load(f)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _record_all_to_all()
    for case in cases:
        case_dir = os.path.join(out_dir, case["name"])
        os.makedirs(case_dir, exist_ok=True)
        A2A_CALLS.clear()  # every case sees only its own collectives
        try:
            with _force_route(case.get("force_route")):
                if case["scenario"] == "train":
                    result = train(rank, world, case_dir, case["args"], case.get("save_dcp", False))
                else:
                    recipe, granularity = case["args"][0], (case["args"][1] if len(case["args"]) > 1 else None)
                    result = dispatch(rank, world, recipe, granularity)
        except BaseException:
            # the test of this case shows this file; the other ranks are torn down by torchrun
            with open(os.path.join(case_dir, f"rank{rank}.error"), "w") as f:
                f.write(traceback.format_exc())
            raise
        torch.save(result, os.path.join(case_dir, f"rank{rank}.pt"))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
