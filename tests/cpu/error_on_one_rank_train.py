"""launch/train.py where one rank fails alone: rank 1 raises RuntimeError("injected error on rank 1") right after
its optimizer step 2, while rank 0 goes on into step 3's collectives. torch.distributed.destroy_process_group is
made to block (4 minutes, past the test's timeout), as NCCL's does while another rank waits in a collective
(torchtitan PR 1342), so a launcher that destroys the group before the traceback is out stalls silently
(tests/cpu/test_launch_errors.py). Same arguments as launch/train.py."""

from __future__ import annotations

import os
import runpy
import sys
import time

import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "launch", "train.py")
STEPS_DONE = [0]


def _after_step(optimizer, args, kwargs):
    STEPS_DONE[0] += 1
    if STEPS_DONE[0] == 2 and os.environ.get("RANK") == "1":
        raise RuntimeError("injected error on rank 1")


if __name__ == "__main__":
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_step)
    dist.destroy_process_group = lambda *a, **k: time.sleep(240)
    sys.argv[0] = TRAIN
    runpy.run_path(TRAIN, run_name="__main__")
