"""launch/train.py with the routing forced at some steps and torch.compile's graph count recorded after every step
(tests/cpu/test_expert_parallel.py::test_train_py_ep2_trains_compiled). Same arguments as launch/train.py; an EP
group of 2 ranks, each holding half of the experts.

Training step s (1-based) routes by FORCED[s], other steps as the router chooses:
  "to_rank0"  every (token, slot) pair to EP rank 0's experts: rank 1 receives no rows, rank 0 sends it none
  "to_rank1"  the same towards rank 1
  "one_row"   every pair to the sender's own experts except one (splits of 1 and N*k - 1)
  "own_rank"  every pair to the sender's own experts (no row crosses)
The forcing runs outside torch.compile (torch.compiler.disable), so it changes tensor values only, never a guard.
Each rank writes <dump_folder>/compiles-rank<RANK>.json after every step: torch._dynamo's count of compiled graphs
(counters["stats"]["unique_graphs"]) at the end of steps 1, 2, ...
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "launch", "train.py")
FORCED = {3: "to_rank0", 4: "to_rank1", 5: "one_row", 6: "own_rank"}

GRAPHS: list[int] = []  # unique graphs after each finished step (its length: the steps done)


@torch.compiler.disable
def _force(experts: torch.Tensor, num_experts: int, training: bool) -> torch.Tensor:
    mode = FORCED.get(len(GRAPHS) + 1) if training else None
    if mode is None:
        return experts
    half = num_experts // 2  # experts [0, half) live on EP rank 0, [half, E) on rank 1
    rank = int(os.environ["RANK"])
    if mode == "to_rank0":
        return experts % half
    if mode == "to_rank1":
        return experts % half + half
    own = experts % half + half * rank
    if mode == "one_row":
        own[0, 0] = own[0, 0] % half + half * (1 - rank)
    return own


def _install() -> None:
    from titan_fp8.models import moe as moe_mod
    from torch._dynamo.utils import counters

    real = moe_mod.Router.forward

    def forward(self, x):
        weights, experts, scores = real(self, x)
        return weights, _force(experts, self.num_experts, self.training), scores

    moe_mod.Router.forward = forward
    dump = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--job.dump_folder="))
    out = os.path.join(dump, f"compiles-rank{os.environ['RANK']}.json")

    def after_step(optimizer, args, kwargs):
        GRAPHS.append(int(counters["stats"]["unique_graphs"]))
        os.makedirs(dump, exist_ok=True)
        with open(out, "w") as f:
            json.dump(GRAPHS, f)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(after_step)


if __name__ == "__main__":
    _install()
    sys.argv[0] = TRAIN
    runpy.run_path(TRAIN, run_name="__main__")
