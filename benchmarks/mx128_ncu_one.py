"""Three launches of one mx128 fprop/dgrad kernel at a MoE shape (even routing), for ncu to profile the third:
ours (the CUTLASS kernels, optionally under a $TITAN_FP8_CUTLASS_SCHEDULE value), our CuTe kernel
(kernels/grouped_gemm/cuda_mx.py, block=128) or DeepGEMM's sm_90 1D2D kernel on the same operands
(benchmarks/deepgemm_anchor.py's layouts).

  ncu --clock-control none --section SpeedOfLight ... -k regex:"device_kernel|sm90_fp8_gemm_1d2d" -s 2 -c 1 \
      python benchmarks/mx128_ncu_one.py VARIANT PASS SHAPE
  VARIANT: ours | ours@SCHEDULE | cuda[:NAME=V,...][@GROUP_M] | deepgemm;  PASS: fprop | dgrad;  SHAPE: dsv3_up | dsv3_down | llama_up
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.deepgemm_anchor import E, M, SHAPES, TPE, dg_calls, fp32_scales, import_deep_gemm, mn_major  # noqa


def main():
    variant, p, shape = sys.argv[1:4]
    from kernels.grouped_gemm import mxfp8_grouped_mm_fprop
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    K, N = SHAPES[shape]
    if p == "dgrad":  # dx [M, K] = dO [M, N] @ W: reduction over N, W^T [E, K, N] read K-major
        K, N = N, K
    elif p != "fprop":
        raise SystemExit(f"mx128_ncu_one: pass {p!r} unknown; allowed: fprop, dgrad")
    torch.manual_seed(0)
    a = to_mxfp8_blocked(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), -1, 128, 1)
    w = to_mxfp8_blocked(torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02, -1, 128, 128)
    sizes = [TPE] * E
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    if variant == "cuda" or variant.startswith(("cuda@", "cuda:")):
        from kernels.grouped_gemm.cuda_mx import GROUP_M, launch_nt
        name, _, gm = variant.partition("@")
        cv = name.partition(":")[2]
        fn = lambda: launch_nt(*a, *w, offs, torch.bfloat16, group_m=int(gm or GROUP_M), variant=cv,  # noqa: E731
                               block=128)
    elif variant == "deepgemm":
        dg = import_deep_gemm()
        layout_m = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(TPE)
        fn, _ = dg_calls(dg, "fprop", (a[0], mn_major(fp32_scales(a[1], 1))), (w[0], fp32_scales(w[1], 128)),
                         sizes, layout_m, None)
    elif variant == "ours" or variant.startswith("ours@"):
        if variant.startswith("ours@"):
            os.environ["TITAN_FP8_CUTLASS_SCHEDULE"] = variant[5:]
        # dgrad runs the fprop kernel on [M, N] x W^T [E, K, N]: the same launch with K and N swapped
        fn = lambda: mxfp8_grouped_mm_fprop(*a, *w, offs, block=128, w_tile=128, backend="cutlass",  # noqa: E731
                                            validate=False)
    else:
        raise SystemExit(f"mx128_ncu_one: variant {variant!r} unknown; allowed: ours, ours@SCHEDULE, cuda[:NAME=V,...][@GROUP_M], deepgemm")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
