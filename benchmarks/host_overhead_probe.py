"""Host time per call of the pieces a compiled float8 MoE step launches through (one GPU).

  python benchmarks/host_overhead_probe.py [--calls 400]

Tiny problems (8 groups x 128 rows, 256 x 256), so the GPU finishes each call before the host issues the next and
the loop time is the host time. Rows: the CUTLASS mx128 rows / wgrad GEMM through the C++ extension alone, through
the Python launch helper, and through the op inductor's generated code calls (a Python custom op until session 16,
a C++ op kernel since); the dgrad-in-parts op (W^T quantized by the extension, then the GEMM, per part); the Triton
MXFP8 weight quantizer (kernels/grouped_gemm/quant_triton.py) autotuned, with fixed warps, as the custom op and as a
traced triton op inside a compiled function; a do-nothing custom op against a plain function (the dispatcher's own
cost). Then the GPU time of the weight quantizer at llama_moe's weight shapes with 8 and 16 warps (and, for W^T,
the extension's), timed round-robin (benchmarks/cuda_timing.interleaved_ms; session 16's first calls timed 20
back-to-back calls), and which of the two the autotuner takes. Prints a table; writes
host_overhead_probe-<device>-<date>.json under --out (default benchmarks/results/).
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from kernels.grouped_gemm import cutlass_backend as cb  # noqa: E402
from kernels.grouped_gemm import quant_triton as qt  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402


@torch.library.custom_op("probe::noop", mutates_args=())
def _noop(a: torch.Tensor, b: torch.Tensor, n: int, s: str) -> torch.Tensor:
    return a.new_empty(2)


@_noop.register_fake
def _(a, b, n, s):
    return a.new_empty(2)


def host_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / calls * 1e6
    return host, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()
    dev = "cuda"
    E, rows, R, C = 8, 128, 256, 256
    M = E * rows
    x = torch.randn(M, R, device=dev, dtype=torch.bfloat16)
    w = torch.randn(E, C, R, device=dev, dtype=torch.bfloat16)
    a, sa = to_mxfp8_blocked(x, -1, 128, 1)
    b, sb = to_mxfp8_blocked(w, -1, 128, 128)
    offs = (torch.arange(1, E + 1, device=dev) * rows).to(torch.int32)
    out = torch.empty(M, C, device=dev, dtype=torch.bfloat16)
    xt, sxt = to_mxfp8_blocked(torch.randn(M, R, device=dev, dtype=torch.bfloat16).t().contiguous(), -1, 128, 1)
    yt, syt = to_mxfp8_blocked(torch.randn(M, C, device=dev, dtype=torch.bfloat16).t().contiguous(), -1, 128, 128)
    xt, yt = xt.contiguous(), yt.contiguous()
    ext = cb.load()
    cfg = cb.schedule_id("fprop", rows / 128, C / 128)
    wcfg = cb.schedule_id("wgrad", R / 128, C / 128)
    dw = torch.empty(E, R, C, device=dev, dtype=torch.bfloat16)
    u8 = torch.uint8
    rows_op = torch.ops.titan_fp8.mx128_grouped_mm_rows_cutlass.default
    red_op = torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default
    w3 = torch.randn(E, C, R, device=dev, dtype=torch.bfloat16)
    wd = torch.randn(E, R, C, device=dev, dtype=torch.bfloat16)  # [E, N, K]: dgrad reduces over N = R
    qop = torch.ops.titan_fp8.mxfp8_blocked_rowcol.default

    def traced_quant(t):
        return qt._blockwise_triton_op(t, True, True, True, False, None)
    cq = torch.compile(traced_quant)
    w2d = w3.reshape(-1, R)
    cases = {
        "cutlass rows: C++ extension only": lambda: ext.grouped_rows(a.view(u8), sa, b.view(u8), sb, offs, out, cfg, 0),
        "cutlass rows: _launch_rows (Python + C++)": lambda: cb._launch_rows(a, sa, b, sb, offs, out, 0, "fprop"),
        "cutlass rows: custom op (torch.ops)": lambda: rows_op(a, sa, b, sb, offs, "fprop"),
        "cutlass wgrad: C++ extension only": lambda: ext.grouped_red(xt.view(u8), sxt, yt.view(u8), syt, offs, dw,
                                                                     wcfg),
        "cutlass wgrad: custom op (torch.ops)": lambda: red_op(xt, sxt, yt, syt, offs, torch.bfloat16, "wgrad"),
        "dgrad in 2 parts (W^T quantized + GEMM): C++ op": lambda: cb.dgrad_in_parts(a, sa, wd, offs, 2),
        "quant w rows: _run autotuned": lambda: qt._run(w3, None, 128, 128, 128, 1, True, False),
        "quant w rows: _run 8 warps": lambda: qt._run(w3, None, 128, 128, 128, 1, True, False, None, 8),
        "quant w rows: custom op (torch.ops)": lambda: qop(w3, None, 128, 128, 128, 1, True, False),
        "quant 2-D blockwise: traced triton op, compiled": lambda: cq(w2d),
        "noop: plain function": lambda: a.new_empty(2),
        "noop: custom op (torch.ops)": lambda: torch.ops.probe.noop.default(a, b, 1, "x"),
        "empty: torch.empty x4": lambda: [torch.empty(64, device=dev) for _ in range(4)],
    }
    rows_out = []
    print(f"{'case':<52} {'host us':>8} {'wall us':>8}")
    for name, fn in cases.items():
        try:
            h, wl = host_us(fn, args.calls)
            rows_out.append({"case": name, "host_us": round(h, 1), "wall_us": round(wl, 1)})
            print(f"{name:<52} {h:8.1f} {wl:8.1f}", flush=True)
        except Exception as e:  # one case failing leaves the others
            rows_out.append({"case": name, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"{name:<52} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
    # GPU time of the weight quantizer at llama_moe weight shapes, 8 vs 16 warps, and what the autotuner took
    gpu = []
    for label, shape, kw in (("w13 fwd rows [8,5632,4096]", (8, 5632, 4096), dict(row_block=128, row_tile=128,
                                                                                  do_col=False)),
                             ("w13 W^T cols [8,5632,4096]", (8, 5632, 4096), dict(col_block=128, col_tile=128,
                                                                                  do_row=False)),
                             ("w2 fwd rows [8,4096,2816]", (8, 4096, 2816), dict(row_block=128, row_tile=128,
                                                                                do_col=False))):
        t = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        rb, rt = kw.get("row_block", 128), kw.get("row_tile", 1)
        cbk, ct = kw.get("col_block", 128), kw.get("col_tile", 1)
        dr, dc = kw.get("do_row", True), kw.get("do_col", True)
        rec = {"case": label}
        fns = {f"{w}w": [lambda w=w: qt._run(t, None, rb, rt, cbk, ct, dr, dc, None, w)] for w in (8, 16)}
        if not dr:  # the W^T copy: also the extension's quantizer (cutlass_sm90/wt_tile_quant.cu)
            fns["cxx"] = [lambda: ext.wt_tiles(t)]
        for variant, (ms, _) in interleaved_ms(fns, rounds=20).items():
            rec[f"gpu_us_{variant}"] = round(ms * 1e3, 1)
        qt._run(t, None, rb, rt, cbk, ct, dr, dc)
        tuned = qt._tuned_kernel
        rec["autotuned"] = str(getattr(tuned, "best_config", None))
        gpu.append(rec)
        print(rec, flush=True)
    name = torch.cuda.get_device_name().replace(" ", "_")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"host_overhead_probe-{name}-{datetime.date.today()}.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                   "versions": {"torch": torch.__version__}, "command": " ".join(sys.argv),
                   "host": rows_out, "quant_gpu": gpu}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
