"""One launch of the CUDA mx32 kernel (kernels/grouped_gemm/cuda_mx.py) at a MoE shape, for ncu:

  ncu --clock-control none --section WarpStateStats --section SchedulerStats -k regex:nt_kernel -s 2 -c 1 \
      python benchmarks/cuda_mx32_ncu_one.py fprop [dsv3_up] [even] [VARIANT]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mxfp8_grouped_gemm import SHAPES, E, TPE, routings  # noqa: E402

from kernels.grouped_gemm.cuda_mx import launch_nt  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402


def main():
    p = sys.argv[1]
    shape = sys.argv[2] if len(sys.argv) > 2 else "dsv3_up"
    rname = sys.argv[3] if len(sys.argv) > 3 else "even"
    variant = sys.argv[4] if len(sys.argv) > 4 else ""
    K, N = SHAPES[shape]
    if p == "dgrad":
        K, N = N, K
    M = E * TPE
    offs = torch.tensor(routings(M)[rname], device="cuda").cumsum(0).to(torch.int32)
    torch.manual_seed(0)
    a = to_mxfp8_blocked(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), -1, 32, 1)
    w = to_mxfp8_blocked(torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02, -1, 32, 128)
    for _ in range(3):
        launch_nt(a[0], a[1], w[0], w[1], offs, torch.bfloat16, variant=variant)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
