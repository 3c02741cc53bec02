"""Host time of the cuBLAS blockwise op (titan_fp8::blockwise_scaled_mm) per call, and of a compiled mx128 Linear
stack per step, with its C++ kernel against the Python one (one GPU).

  python benchmarks/blockwise_mm_host.py [--calls 400] [--steps 50]

Part 1, one process, tiny GEMMs (the GPU finishes each call before the host issues the next, so the loop time is
the host time): the session-34 op (a torch.library.custom_op around the Python kernel, rebuilt here as it was), the
Python kernel behind a plain Library op, the op with its C++ kernel, and F.scaled_mm on arguments laid out
beforehand (the floor). Outputs checked bit-equal.
Part 2, one subprocess per kernel (TITAN_FP8_BLOCKWISE_MM=python / cpp: a process picks once): 7 mx128 Float8Linears
of llama_moe's block (q, k, v, o, shared w1, w3, w2 at 1/16 of the widths), compiled, forward + backward; host
time per step (issue time, the GPU work being tiny) and the step's wall time, medians over --steps.
Prints a table; writes blockwise_mm_host-<device>-<date>.json (benchmarks/results_json.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.host_overhead_probe import host_us  # noqa: E402
from benchmarks.results_json import write_results  # noqa: E402


def per_call(calls):
    import torch.nn.functional as F

    from kernels.grouped_gemm import cublas_blockwise as cb
    picked = cb.load_backend()
    if picked != "cpp":
        raise SystemExit(f"the C++ kernel did not load (picked {picked}); part 1 compares it")

    @torch.library.custom_op("probe_s34::blockwise_scaled_mm", mutates_args=())
    def s34_op(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor, b_is_tile: bool,
               inverse: bool = False) -> torch.Tensor:
        return cb.cublas_blockwise_mm(a_q, a_s, b_q, b_s, b_is_tile, inverse)

    lib = torch.library.Library("probe_py", "DEF")
    lib.define("blockwise_scaled_mm(Tensor a_q, Tensor a_s, Tensor b_q, Tensor b_s, bool b_is_tile, "
               "bool inverse=False) -> Tensor")
    lib.impl("blockwise_scaled_mm", cb.cublas_blockwise_mm, "CUDA")
    M = K = N = 256
    g = torch.Generator(device="cuda").manual_seed(0)
    a_q = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b_q = torch.randn(N, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    a_s = torch.ones(K // 128, M, device="cuda").t()
    b_s = cb.pad_tile_factors(torch.ones(N // 128, K // 128, device="cuda"))
    ops = (a_q, a_s, b_q, b_s, True, True)
    laid = cb.blockwise_scaled_mm_args(*ops)
    cases = {
        "session 34: custom_op + Python kernel": lambda: s34_op(*ops),
        "Library op + Python kernel": lambda: torch.ops.probe_py.blockwise_scaled_mm(*ops),
        "titan_fp8::blockwise_scaled_mm (C++ kernel)": lambda: torch.ops.titan_fp8.blockwise_scaled_mm(*ops),
        "floor: F.scaled_mm on laid-out arguments": lambda: F.scaled_mm(*laid, output_dtype=torch.bfloat16),
    }
    ref = cases["floor: F.scaled_mm on laid-out arguments"]()
    rows = []
    for name, fn in cases.items():
        same = torch.equal(fn(), ref)
        h, w = host_us(fn, calls)
        rows.append({"part": "per_call", "case": name, "host_us": round(h, 1), "wall_us": round(w, 1),
                     "equal": same})
    return rows


def linear_steps(steps):
    """(in this process, under $TITAN_FP8_BLOCKWISE_MM) host ms and wall ms per compiled fwd+bwd step."""
    import torch.nn as nn

    from titan_fp8.float8 import Float8Config, convert_to_float8_training
    from titan_fp8.float8.linear import Float8Linear
    d, kv, ffn = 256, 128, 384  # about llama_moe / 16 (4096, 1024, 2816; dims multiples of 128)
    dims = [(d, d), (d, kv), (d, kv), (d, d), (d, ffn), (d, ffn), (ffn, d)]
    model = nn.Sequential(*[nn.Linear(i, o, bias=False) for i, o in dims[:6]])
    model = nn.ModuleDict({"up": model, "w2": nn.Linear(ffn, d, bias=False)}).cuda()
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity="mx128")
    convert_to_float8_training(model, config=cfg)
    for m in model.modules():
        if isinstance(m, Float8Linear):
            m.prepare_backend("cuda")

    def fwd(x):
        u = model["up"]
        q, k, v, o = u[0](x), u[1](x), u[2](x), u[3](x)
        h = u[4](x) * u[5](x)
        return q.sum() + k.sum() + v.sum() + o.sum() + model["w2"](h).sum()
    f = torch.compile(fwd)
    x = torch.randn(256, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    host, wall = [], []
    for i in range(steps + 5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f(x).backward()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= 5:
            host.append((t1 - t0) * 1e3)
            wall.append((time.perf_counter() - t0) * 1e3)
    from kernels.grouped_gemm import cublas_blockwise as cb
    return {"kernel": cb._STATE["backend"], "host_ms": statistics.median(host), "wall_ms": statistics.median(wall)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--child-steps", type=int, help=argparse.SUPPRESS)  # part 2's subprocess
    args = ap.parse_args()
    if args.child_steps:
        print(json.dumps(linear_steps(args.child_steps)))
        return
    rows = per_call(args.calls)
    for kernel in ("python", "cpp"):
        env = dict(os.environ, TITAN_FP8_BLOCKWISE_MM=kernel)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-steps", str(args.steps)],
                             env=env, capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            rows.append({"part": "linear_steps", "case": kernel, "error": out.stderr[-600:]})
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"part": "linear_steps", "case": f"7 mx128 Linears fwd+bwd, {got['kernel']} kernel",
                     "host_ms": round(got["host_ms"], 3), "wall_ms": round(got["wall_ms"], 3)})
    print(f"{'case':<50} {'host':>9} {'wall':>9}  equal")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<50} ERROR {r['error']}")
        elif r["part"] == "per_call":
            print(f"{r['case']:<50} {r['host_us']:7.1f}us {r['wall_us']:7.1f}us  {r['equal']}")
        else:
            print(f"{r['case']:<50} {r['host_ms']:7.3f}ms {r['wall_ms']:7.3f}ms")
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "versions": {"torch": torch.__version__}, "command": " ".join(sys.argv)}
    print("wrote", write_results("blockwise_mm_host", meta, rows))


if __name__ == "__main__":
    main()
