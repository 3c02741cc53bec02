"""Three launches of one x / dO quantizer at an expert-op shape (E = 8 x 8192 tokens), for ncu to profile the third:
the CUDA rowcol quantizer (kernels/grouped_gemm/quant_cuda.py, optionally with diag store probes), the Triton one,
or a copy of the operand by an elementwise kernel (x * 1: the bandwidth reference).

  ncu --section SpeedOfLight --section WarpStateStats ... -k regex:"rowcol|_blocked_rowcol|elementwise" -s 2 -c 1 \
      python benchmarks/quant_rowcol_ncu_one.py VARIANT LAYOUT SHAPE
  VARIANT: cuda | cuda_diagN (N: 1 no column-copy data stores, 2 no row-copy data stores, 3 neither) | triton | copy
  LAYOUT: mx128_x | mx128_dO | mx32_x | mx32_dO;  SHAPE: dsv3_up | dsv3_down | llama_up
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAYOUTS = {"mx128_x": (128, 128, 128), "mx128_dO": (128, 128, 1), "mx32_x": (32, 32, 128), "mx32_dO": (32, 32, 1)}
SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}


def main():
    variant, layout, shape = sys.argv[1:4]
    from kernels.grouped_gemm import quant_cuda, quant_triton
    rb, cb, ct = LAYOUTS[layout]
    K, N = SHAPES[shape]
    M = 8 * 8192
    x = torch.randn(M, K if layout.endswith("_x") else N, device="cuda", dtype=torch.bfloat16)
    lim = torch.tensor([M - 100], device="cuda", dtype=torch.int32)
    if variant == "copy":
        # an elementwise kernel (x.clone() of a contiguous tensor is a cudaMemcpyAsync, which ncu does not profile)
        fn = lambda: x * 1  # noqa: E731
    elif variant == "triton":
        bm, bk, _ = quant_triton.rowcol_launch(1, cb, ct, True, True)
        fn = lambda: quant_triton._run(x.unsqueeze(0), lim, rb, 1, cb, ct, True, True, tile=(bm, bk))  # noqa: E731
    elif variant.startswith("cuda"):
        diag = int(variant[len("cuda_diag"):]) if variant.startswith("cuda_diag") else 0
        fn = lambda: quant_cuda.rowcol(x, rb, cb, ct, lim, diag=diag)  # noqa: E731
    else:
        raise SystemExit(f"quant_rowcol_ncu_one: variant {variant!r} unknown; allowed: cuda, cuda_diagN, triton, copy")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    print("ran", variant, layout, shape)


if __name__ == "__main__":
    main()
