// Plain C++ interface of the CuTe grouped GEMMs out[g] = A[g] @ B[e]^T in this directory (mx32_grouped.cu,
// mx128_grouped.cu), so the torch bindings (bindings.cpp) and the CUDA code compile apart.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace titan_mx {

struct NtArgs {
  const void* a;        // [M, R] e4m3, rows a_m elements apart, R contiguous
  const void* b;        // [E, C, R] e4m3, contiguous
  const uint8_t* sa;    // [M, R/32] E8M0, steps contiguous, rows sa_m bytes apart (4-byte aligned)
  const uint8_t* sb;    // [E, C, R/32] E8M0, strides sb_e, sb_n, sb_k; constant over 128-row tiles of C
  const int* offs;      // [E] cumulative group ends
  void* out;            // [M, C] bf16 (out_f32 = false) or fp32, rows out_m elements apart
  int64_t M, R, E, C;
  int64_t a_m, sa_m, sb_e, sb_n, sb_k, out_m;
  int group_m;          // m-tiles (mx128: pairs of m-tiles) per run of the tile order
  int sms;              // persistent grid size
  bool out_f32;
};

// Launch on `stream`; nullptr, or what was wrong (a shape the kernel does not serve, a CUDA attribute call).
// mx32: sa holds true 1x32 scales. mx128: sa is constant over 128 steps of R (1x128), read once per 128.
const char* mx32_nt_launch(NtArgs const& args, cudaStream_t stream);
const char* mx128_nt_launch(NtArgs const& args, cudaStream_t stream);

}  // namespace titan_mx
