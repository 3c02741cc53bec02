"""Where does the trainer's HOST time go? cProfile of rank 0's Python over a few steps after warm-up.

At 2 GPUs the float8 recipes are host-bound (session 10's profile of llama_moe: GPU busy 67% of a
tensorwise + mx128-experts step, 95% of a bf16 step), and torch.profiler shows only aten ops and record_function
ranges: the Python inside FSDP2's hooks, our all-gather hooks and the launchers counts as the "self" time of the
enclosing range. This runs launch/train.py in this process (under torchrun too: only rank 0 is profiled) and
turns cProfile on for steps FIRST..LAST, so compilation and warm-up stay out of it.

    python benchmarks/host_profile.py --steps 8:11 --out prof.txt -- --config train_configs/llama_moe.toml \
        --float8.enable=true --float8.recipe_name=tensorwise ...
    torchrun --nproc_per_node=2 benchmarks/host_profile.py --steps 8:11 --out prof.txt -- --config ...

Writes OUT (functions by own time and by cumulative time, per profiled step) and OUT.pstats (pstats.Stats).
cProfile slows Python by about 1.5-2x; read the split, not the absolute times.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_steps(text: str) -> tuple[int, int]:
    try:
        first, last = (int(v) for v in text.split(":"))
    except ValueError:
        raise SystemExit(f"host_profile: --steps {text!r}: expected FIRST:LAST, e.g. 8:11")
    if not 1 <= first <= last:
        raise SystemExit(f"host_profile: --steps {text!r}: need 1 <= FIRST <= LAST")
    return first, last


def report(prof: cProfile.Profile, steps: int, rows: int) -> str:
    out = io.StringIO()
    out.write(f"cProfile of rank 0 over {steps} step(s); times are totals over those steps\n\n")
    for key in ("tottime", "cumulative"):
        stats = pstats.Stats(prof, stream=out)
        stats.strip_dirs().sort_stats(key).print_stats(rows)
    return out.getvalue()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("host_profile: give the trainer's arguments after --")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", default="8:11", help="FIRST:LAST step to profile (after compile and warm-up)")
    p.add_argument("--out", default="host_profile.txt")
    p.add_argument("--rows", type=int, default=70)
    args = p.parse_args(argv[:cut])
    first, last = parse_steps(args.steps)
    train_args = argv[cut + 1:]

    import launch.train as train
    from titan_fp8.train import trainer
    from titan_fp8.train.profiling import StepProfiler

    rank0 = os.environ.get("RANK", "0") == "0"
    prof = cProfile.Profile()

    class HostProfiler(StepProfiler):
        """The trainer's step profiler, plus cProfile from the start of step FIRST to the end of step LAST
        (those steps count as profiled: the trainer leaves them out of the throughput medians)."""

        def torch_profiled(self, step: int) -> bool:
            return super().wants(step)

        def wants(self, step: int) -> bool:
            return self.torch_profiled(step) or first <= step <= last

        def begin(self, step: int) -> None:
            if rank0 and step == first:
                prof.enable()
            if self.torch_profiled(step):
                super().begin(step)

        def end(self, step: int) -> None:
            super().end(step)  # a no-op unless torch.profiler runs this step
            if rank0 and step == last:
                prof.disable()
                with open(args.out, "w") as f:
                    f.write(report(prof, last - first + 1, args.rows))
                prof.dump_stats(args.out + ".pstats")
                print(f"host_profile: steps {first}-{last} -> {args.out}", flush=True)

    trainer.StepProfiler = HostProfiler
    return train.main(train_args)


if __name__ == "__main__":
    sys.exit(main())
