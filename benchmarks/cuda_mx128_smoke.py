"""One small launch of the CuTe mx128 kernel (kernels/grouped_gemm/cuda_mx.py, block=128) against the float64
reference, for the device scripts to run under a short timeout first: a cluster or barrier hang must not eat the
call. Prints "smoke ok" (and the error) or exits non-zero.

  timeout 60 python benchmarks/cuda_mx128_smoke.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernels.grouped_gemm import grouped_mm_fprop_reference  # noqa: E402
from kernels.grouped_gemm.cuda_mx import launch_nt  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402


def main():
    torch.manual_seed(0)
    offs = torch.tensor([100, 100, 400, 1000], device="cuda", dtype=torch.int32)  # an empty group, 100 padding rows
    a, sa = to_mxfp8_blocked(torch.randn(1100, 512, device="cuda"), -1, 128, 1)
    b, sb = to_mxfp8_blocked(torch.randn(4, 384, 512, device="cuda") * 0.02, -1, 128, 128)
    out = launch_nt(a, sa, b, sb, offs, torch.bfloat16, block=128)
    torch.cuda.synchronize()
    ref = grouped_mm_fprop_reference(a, sa, b, sb, offs, out_dtype=torch.float64)
    r = ((out[:1000].double() - ref[:1000]).norm() / ref[:1000].norm()).item()
    zeros = bool((out[1000:] == 0).all())
    print(f"rel {r:.3g}, padding rows zero: {zeros}")
    if r > 3e-3 or not zeros:
        raise SystemExit("smoke FAILED")
    print("smoke ok")


if __name__ == "__main__":
    main()
