"""One launch of a Gluon mx32 kernel at a MoE shape, for ncu (warp stall reasons of that launch):

  ncu --clock-control none --section WarpStateStats --section SchedulerStats -k regex:_nt_grouped -c 1 \
      python benchmarks/gluon_ncu_one.py fprop m3 [dsv3_up] [even]

pass: fprop | dgrad | wgrad; config: a name from mxfp8_grouped_gemm_gluon.CONFIGS. Two warm-up launches first
(compile), so ncu should skip them (-s 2) or use -c with the kernel regex after the warm-up."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mxfp8_grouped_gemm import SHAPES, E, TPE, routings  # noqa: E402
from mxfp8_grouped_gemm_gluon import CONFIGS  # noqa: E402

from kernels.grouped_gemm.gluon_mx import launch_nt, launch_wgrad  # noqa: E402
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402


def main():
    p, cname = sys.argv[1], sys.argv[2]
    shape = sys.argv[3] if len(sys.argv) > 3 else "dsv3_up"
    rname = sys.argv[4] if len(sys.argv) > 4 else "even"
    cfg = CONFIGS[cname]
    ncfg, wcfg = cfg if cfg[0] is None or isinstance(cfg[0], tuple) else (cfg, cfg)
    K, N = SHAPES[shape]
    M = E * TPE
    offs = torch.tensor(routings(M)[rname], device="cuda").cumsum(0).to(torch.int32)
    torch.manual_seed(0)
    if p == "fprop":
        a = to_mxfp8_blocked(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), -1, 32, 1)
        w = to_mxfp8_blocked(torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02, -1, 32, 128)
        fn = lambda: launch_nt(a[0], a[1], w[0], w[1], offs, torch.bfloat16, ncfg)  # noqa: E731
    elif p == "dgrad":
        d = to_mxfp8_blocked(torch.randn(M, N, device="cuda", dtype=torch.bfloat16), -1, 32, 1)
        w = to_mxfp8_blocked(torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16) * 0.02, -1, 32, 128)
        fn = lambda: launch_nt(d[0], d[1], w[0], w[1], offs, torch.bfloat16, ncfg)  # noqa: E731
    else:
        dt = to_mxfp8_blocked(torch.randn(N, M, device="cuda", dtype=torch.bfloat16), -1, 32, 1)
        xt = to_mxfp8_blocked(torch.randn(K, M, device="cuda", dtype=torch.bfloat16), -1, 32, 128)
        fn = lambda: launch_wgrad(dt[0], dt[1], xt[0], xt[1], offs, torch.float32, wcfg)  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
