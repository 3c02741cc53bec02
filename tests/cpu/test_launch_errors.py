"""launch/train.py when one rank fails alone (tests/cpu/error_on_one_rank_train.py: rank 1 raises after step 2 while
rank 0 waits for it in step 3's collectives; destroy_process_group blocks, as NCCL's does then): the run ends at once,
non-zero, with rank 1's traceback. Before, the launcher destroyed the process group before Python printed the
traceback: the run stalled with no error (a 2xH200 EP run, 2026-11-23, stalled so for 5 minutes)."""

import os
import time

from _train_runs import HERE_TESTS, TINY, explain, run_train


def test_error_on_one_rank_ends_the_run_with_its_traceback(tmp_path):
    start = time.monotonic()
    proc = run_train(str(tmp_path / "run"), 2, [*TINY, "--training.local_batch_size=2", "--validation.enable=false"],
                     timeout=180, script=os.path.join(HERE_TESTS, "error_on_one_rank_train.py"))
    assert proc.returncode != 0, explain(proc)
    assert "RuntimeError: injected error on rank 1" in proc.stderr, explain(proc)
    assert time.monotonic() - start < 150
