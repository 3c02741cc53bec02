// torch side of the CuTe grouped GEMMs (mx32_grouped.cu, mx128_grouped.cu): tensors -> NtArgs, launch on the current
// stream. Checks with names live in Python (kernels/grouped_gemm/cuda_mx.py); the TORCH_CHECKs guard the raw-pointer
// contract.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "grouped_nt.h"

namespace {

// out [M, C] = grouped A [M, R] @ B [E, C, R]^T with 1x32 (block 32) or 1x128 (block 128) scales on A, 128x128-tiled
// scales on B. sms: the persistent grid's size (the caller's SM count).
void nt(torch::Tensor a, torch::Tensor sa, torch::Tensor b, torch::Tensor sb, torch::Tensor offs, torch::Tensor out,
        int64_t group_m, int64_t sms, int64_t block) {
  TORCH_CHECK(block == 32 || block == 128);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 3 && sa.dim() == 2 && sb.dim() == 3 && offs.dim() == 1 && out.dim() == 2);
  TORCH_CHECK(a.stride(1) == 1 && b.is_contiguous() && sa.stride(1) == 1 && out.stride(1) == 1);
  TORCH_CHECK(sa.stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(sa.data_ptr()) % 4 == 0);
  TORCH_CHECK(offs.scalar_type() == torch::kInt32 && offs.size(0) == b.size(0));
  TORCH_CHECK(a.size(0) == out.size(0) && b.size(1) == out.size(1) && a.size(1) == b.size(2));
  c10::cuda::CUDAGuard guard(a.device());
  titan_mx::NtArgs args;
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.sa = sa.data_ptr<uint8_t>();
  args.sb = sb.data_ptr<uint8_t>();
  args.offs = offs.data_ptr<int>();
  args.out = out.data_ptr();
  args.M = a.size(0);
  args.R = a.size(1);
  args.E = b.size(0);
  args.C = b.size(1);
  args.a_m = a.stride(0);
  args.sa_m = sa.stride(0);
  args.sb_e = sb.stride(0);
  args.sb_n = sb.stride(1);
  args.sb_k = sb.stride(2);
  args.out_m = out.stride(0);
  args.group_m = int(group_m);
  args.sms = int(sms);
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 || out.scalar_type() == torch::kBFloat16);
  args.out_f32 = out.scalar_type() == torch::kFloat32;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const char* err = block == 32 ? titan_mx::mx32_nt_launch(args, stream) : titan_mx::mx128_nt_launch(args, stream);
  TORCH_CHECK(err == nullptr, "grouped GEMM (cuda, block ", block, "): ", err ? err : "");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("nt", &nt, "MXFP8 grouped GEMM out = A @ B^T (sm_90a), block 32 or 128");
}
