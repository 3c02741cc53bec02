"""Which errors thrown from a C++ torch op kernel reach Python, and which crash the process (one GPU).

  python benchmarks/op_error_probe.py

Session 16 found that a ValueError thrown from the CUTLASS extension (kernels/grouped_gemm/cutlass_sm90/bindings.cpp)
for an SM carve-out leaving fewer than 2 SMs segfaulted the process on the GPU image (torch 2.11) in every path (op
eager, op compiled, pybind), while other errors thrown from the same op kernel (a bad pass name) reached Python. The
extension now runs such a call on one 2-CTA cluster instead (the Python wrappers raise the ValueError first), so the
carve-out cases print "no exception" and whether the result equals the full grid's. Each case below runs in its own
subprocess (a crash ends only that case) and prints the exception type it got, or the signal that ended it:
  inline_*     a tiny extension built here (load_inline): an op kernel registered for CUDA or CPU throwing
               TORCH_CHECK_VALUE / TORCH_CHECK, eagerly;
  cutlass_*    the real extension: the rows op eagerly with the carve-out at SMs - 1, with a bad pass name, with a
               1-D operand (an internal TORCH_CHECK), compiled with the carve-out at SMs - 1, and the pybind
               grouped_rows with the carve-out.
Prints a table; writes op_error_probe-<date>.json under --out (default benchmarks/results/).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INLINE = r'''
import torch
from torch.utils.cpp_extension import load_inline
lib = torch.library.Library("op_error_probe", "FRAGMENT")
lib.define("raise_value(Tensor a) -> Tensor")
lib.define("raise_runtime(Tensor a) -> Tensor")
src = """
#include <torch/extension.h>
#include <torch/library.h>
namespace {
at::Tensor raise_value(const at::Tensor& a) { TORCH_CHECK_VALUE(a.numel() < 0, "probe value error"); return a; }
at::Tensor raise_runtime(const at::Tensor& a) { TORCH_CHECK(a.numel() < 0, "probe runtime error"); return a; }
}
TORCH_LIBRARY_IMPL(op_error_probe, CUDA, m) {
  m.impl("raise_value", &raise_value); m.impl("raise_runtime", &raise_runtime);
}
TORCH_LIBRARY_IMPL(op_error_probe, CPU, m) {
  m.impl("raise_value", &raise_value); m.impl("raise_runtime", &raise_runtime);
}
"""
load_inline("op_error_probe_ext", cpp_sources=[src], functions=[], extra_cflags=["-O3"])
'''

CUTLASS = r'''
import torch
from kernels.grouped_gemm import cutlass_backend as cb
from kernels.grouped_gemm.quant import to_mxfp8_blocked
ext = cb.load()
E, rows, R, C = 2, 128, 256, 256
a, sa = to_mxfp8_blocked(torch.randn(E * rows, R, device="cuda"), -1, 128, 1)
b, sb = to_mxfp8_blocked(torch.randn(E, C, R, device="cuda"), -1, 128, 128)
offs = torch.tensor([rows, 2 * rows], device="cuda", dtype=torch.int32)
op = torch.ops.titan_fp8.mx128_grouped_mm_rows_cutlass.default
sms = torch.cuda.get_device_properties(0).multi_processor_count
'''

CASES = {
    "inline_cuda_value": INLINE + "torch.ops.op_error_probe.raise_value(torch.zeros(2, device='cuda'))",
    "inline_cuda_runtime": INLINE + "torch.ops.op_error_probe.raise_runtime(torch.zeros(2, device='cuda'))",
    "inline_cpu_value": INLINE + "torch.ops.op_error_probe.raise_value(torch.zeros(2))",
    "cutlass_op_carveout_eager": CUTLASS + textwrap.dedent("""
        ref = op(a, sa, b, sb, offs, 'fprop')
        torch._C._set_sm_carveout_experimental(sms - 1)
        got = op(a, sa, b, sb, offs, 'fprop')
        print("ran on one cluster, equal:", torch.equal(got, ref))"""),
    "cutlass_op_bad_pass_eager": CUTLASS + "op(a, sa, b, sb, offs, 'xprop')",
    "cutlass_op_1d_operand_eager": CUTLASS + "op(a.reshape(-1), sa, b, sb, offs, 'fprop')",
    "cutlass_op_carveout_compiled": CUTLASS + textwrap.dedent("""
        f = torch.compile(lambda a: op(a, sa, b, sb, offs, 'fprop'), fullgraph=True)
        ref = f(a)
        torch._C._set_sm_carveout_experimental(sms - 1)
        print("ran on one cluster, equal:", torch.equal(f(a), ref))"""),
    "cutlass_pybind_carveout": CUTLASS + textwrap.dedent("""
        out = torch.empty(E * rows, C, device='cuda', dtype=torch.bfloat16)
        torch._C._set_sm_carveout_experimental(sms - 1)
        ext.grouped_rows(a.view(torch.uint8), sa, b.view(torch.uint8), sb, offs, out, 0, 0)
        print("ran on one cluster, equal:", torch.equal(out, op(a, sa, b, sb, offs, 'fprop')))"""),
}

WRAP = r'''
import sys
try:
{body}
    print("RESULT no exception")
except BaseException as e:
    print("RESULT", type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()
    rows = []
    for name, body in CASES.items():
        code = WRAP.format(body=textwrap.indent(body.strip("\n"), "    "))
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])))
        got = [ln[7:] for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        res = got[-1] if got else f"no result (returncode {p.returncode}: {p.stderr.strip().splitlines()[-1:]})"
        rows.append({"case": name, "returncode": p.returncode, "result": res})
        print(f"{name:<30} rc={p.returncode:<5} {res[:150]}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"op_error_probe-{datetime.date.today()}.json")
    import torch
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                   "date": str(datetime.date.today()), "versions": {"torch": torch.__version__},
                   "command": " ".join(sys.argv), "cases": rows}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
