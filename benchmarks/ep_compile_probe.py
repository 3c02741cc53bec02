"""launch/train.py under a probe for expert parallelism + torch.compile: per rank and step, a timestamp, the step
time, the number of graphs torch.compile has made so far, and the rows every MoE layer sent to / received from
each EP rank; a rank that makes no progress for EP_PROBE_STALL_S seconds (default 120; 600 for the first step,
which compiles) prints the Python stack of every thread, again every EP_PROBE_STALL_S seconds.

Same arguments as launch/train.py (torchrun target). TORCH_LOGS defaults to "recompiles" (every recompile and the
guard that failed, per rank). On 2 GPUs, e.g. the run that stalled at step 12 on 2xH200 (2026-11-23):

  python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/ep_compile_probe.py \
    --config train_configs/llama_moe.toml --training.steps=25 --checkpoint.enable=false \
    --float8.enable=true --float8.recipe_name=tensorwise --float8.enable_fsdp_float8_all_gather=true \
    --float8.precompute_float8_dynamic_scale_for_fsdp=true --float8.moe_recipe_name=fp8_rowwise \
    --parallelism.expert_parallel_degree=2 --job.dump_folder=$OUT/ep_probe 2>&1 | tee $OUT/ep_probe.log

Reading it: "graphs" must stay constant after step 1 (no rank recompiles on its own routing); "recv" per layer
shows the expert load of each EP rank (a step takes as long as the most loaded rank: compare the ranks' sums);
a stall prints each rank's stack (inside torch._dynamo / torch._inductor: compiling; in exchange_counts'
tolist or a collective: waiting for the other rank). Each rank also writes <dump_folder>/ep_probe-rank<R>.json
(one record per step) after every step.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import sys
import time

os.environ.setdefault("TORCH_LOGS", "recompiles")

import torch  # noqa: E402  (after TORCH_LOGS)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(HERE), "launch", "train.py")
STALL_S = float(os.environ.get("EP_PROBE_STALL_S", "120"))

RECORDS: list[dict] = []
LAYER_ROWS: list[dict] = []  # this step's exchanges, one per MoE layer forward (recomputes included)


def _install() -> None:
    from torch._dynamo.utils import counters
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from titan_fp8.models import expert_parallel as ep_mod

    rank = int(os.environ.get("RANK", "0"))
    dump = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--job.dump_folder=")), ".")
    out = os.path.join(dump, f"ep_probe-rank{rank}.json")
    real_exchange = ep_mod.exchange_counts

    @torch.compiler.disable
    def exchange_counts(counts, ep):
        received, send, recv = real_exchange(counts, ep)
        LAYER_ROWS.append({"send": list(send), "recv": list(recv)})
        return received, send, recv

    ep_mod.exchange_counts = exchange_counts  # looked up in the module at every call
    last = [time.time()]

    def after_step(optimizer, args, kwargs):
        now = time.time()
        rec = {"rank": rank, "step": len(RECORDS) + 1, "time": now, "step_s": round(now - last[0], 4),
               "graphs": int(counters["stats"]["unique_graphs"]), "graph_breaks": sum(counters["graph_break"].values()),
               "layers": list(LAYER_ROWS)}
        RECORDS.append(rec)
        LAYER_ROWS.clear()
        last[0] = now
        recv = [sum(x["recv"]) for x in rec["layers"]]
        zero = sum(1 for x in rec["layers"] for v in x["send"] + x["recv"] if v <= 1)
        grew = len(RECORDS) > 1 and rec["graphs"] > RECORDS[-2]["graphs"]
        print(f"[probe] {time.strftime('%H:%M:%S', time.gmtime(now))} rank {rank} step {rec['step']} "
              f"{rec['step_s']:.3f}s graphs {rec['graphs']}{' (NEW GRAPHS: recompiled)' if grew else ''} "
              f"recv rows/layer {recv} (sum {sum(recv)}) splits<=1: {zero}", file=sys.stderr, flush=True)
        os.makedirs(dump, exist_ok=True)
        with open(out, "w") as f:
            json.dump(RECORDS, f)
        faulthandler.dump_traceback_later(STALL_S, repeat=True)

    register_optimizer_step_post_hook(after_step)
    faulthandler.dump_traceback_later(max(STALL_S, 600.0), repeat=True)  # the first step compiles


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    _install()
    sys.argv[0] = TRAIN
    runpy.run_path(TRAIN, run_name="__main__")
