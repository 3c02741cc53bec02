"""Three launches of one CUTLASS mx128 grouped GEMM pass at an expert-op shape (E = 8 x 8192 tokens, even routing),
for ncu to profile the third: the default build (cutlass_backend.load()) or another build of the same sources
(cutlass_backend.load_variant(TAG, DEFINES)), launched as the backends benchmark's variant rows launch it.

  ncu --clock-control none --section SpeedOfLight ... -k regex:GemmUniversal -s 2 -c 1 \
      python benchmarks/cutlass_ncu_one.py BUILD PASS SHAPE
  BUILD: default | TAG=-DNAME[,-DNAME...];  PASS: fprop | dgrad | wgrad;  SHAPE: dsv3_up | dsv3_down | llama_up
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    build, pass_, shape = sys.argv[1:4]
    import mxfp8_grouped_gemm_backends as bb
    from kernels.grouped_gemm import cutlass_backend as cb
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    if pass_ not in bb.PASSES or shape not in bb.SHAPES:
        raise SystemExit(f"cutlass_ncu_one: pass {pass_!r} / shape {shape!r} unknown; allowed {bb.PASSES} / "
                         f"{sorted(bb.SHAPES)}")
    ext = cb.load() if build == "default" else cb.load_variant(build.split("=")[0],
                                                               tuple(build.split("=", 1)[1].split(",")))
    K, N = bb.SHAPES[shape]
    M = bb.E * bb.TPE
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    dO = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(bb.E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    offs = torch.tensor([bb.TPE] * bb.E, device="cuda").cumsum(0).to(torch.int32)
    wq = to_mxfp8_blocked(w, -1, 128, 128)
    wqt = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, 128, 128)
    q = (to_mxfp8_blocked(x, -1, 128, 1), to_mxfp8_blocked(dO, -1, 128, 1), to_mxfp8_blocked(dO.t(), -1, 128, 1),
         to_mxfp8_blocked(x.t(), -1, 128, 128))
    fn = bb.cutlass_variant_call(ext, pass_, q, wq, wqt, offs, torch.bfloat16)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    print("ran", build, pass_, shape)


if __name__ == "__main__":
    main()
