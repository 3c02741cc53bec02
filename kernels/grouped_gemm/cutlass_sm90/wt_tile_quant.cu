// See wt_tile_quant.h. One block of 256 threads per 128 x 128 tile of w:
//   load    each thread reads 2 x 4 rows (n) x 8 columns (k) of bf16 (16-byte loads: a warp reads two whole rows),
//           keeping them in registers, and the max magnitude bits of its 64 values;
//   amax    warp shuffles, then the 8 warps' maxima through shared memory: the tile's one scale;
//   encode  each thread packs, per k, its 4 consecutive n into one word of a shared [128 k][132] byte tile (the
//           transpose);
//   store   each thread writes 16 bytes of a W^T row (a warp: 4 rows x 128 bytes, coalesced) and threads 0-127 the
//           tile's 4 scale bytes of one row k.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdio>

#include "wt_tile_quant.h"

namespace titan_mx {
namespace {

constexpr int kTile = 128;
constexpr int kPitch = 132;  // bytes per row of the transposed tile: 4-byte aligned rows, conflict-free row reads

__device__ __forceinline__ int exponent_from_amax_bits(int a) {
  // kernels/mxfp8/triton.py _exponent_from_amax_bits: ceil(log2(fl(amax / 448))) on the bits, clamped
  int ea = a >> 23, man = a & 0x7FFFFF;
  int e = ea - 135 + (man > 0x600000 ? 1 : 0);
  if (ea == 8 && man == 0x600001) e = -127;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// 4 fp32 -> their e4m3 bytes, y[0] in the low byte: cvt.rn.satfinite.e4m3x2.f32 (RNE, +-448 saturation, NaN ->
// 0x7F), the instruction Triton's fp32 -> float8e4nv lowers to on sm_90; the pair's first element lands in the
// low byte of each 16-bit result
__device__ __forceinline__ uint32_t encode4(const float* y) {
  uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(y[0], y[1]), __NV_SATFINITE, __NV_E4M3);
  uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(y[2], y[3]), __NV_SATFINITE, __NV_E4M3);
  return (lo & 0xFFFFu) | ((hi & 0xFFFFu) << 16);
}

__global__ void __launch_bounds__(256) quant_wt_tiles_kernel(const __nv_bfloat16* __restrict__ w,
                                                             uint8_t* __restrict__ wt, uint8_t* __restrict__ s,
                                                             int64_t N, int64_t K) {
  __shared__ uint8_t tile_t[kTile * kPitch];
  __shared__ int warp_max[8];
  const int t = threadIdx.x;
  const int64_t g = blockIdx.z, n0 = int64_t(blockIdx.y) * kTile, k0 = int64_t(blockIdx.x) * kTile;
  const __nv_bfloat16* src = w + (g * N + n0) * K + k0;
  const int kc = (t % 16) * 8;  // this thread's 8 columns (k)
  uint16_t raw[2][4][8];
  int amax = 0;
#pragma unroll
  for (int p = 0; p < 2; ++p) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = 4 * (t / 16 + 16 * p) + r;
      uint4 v = *reinterpret_cast<const uint4*>(src + int64_t(n) * K + kc);
      const uint16_t* h = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        raw[p][r][j] = h[j];
        int mag = (int(h[j]) << 16) & 0x7FFFFFFF;  // fp32 magnitude bits; NaN's exceed inf's, so the max keeps it
        amax = mag > amax ? mag : amax;
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    int o = __shfl_xor_sync(0xffffffffu, amax, off);
    amax = o > amax ? o : amax;
  }
  if (t % 32 == 0) warp_max[t / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) amax = warp_max[i] > amax ? warp_max[i] : amax;
  const bool nonfinite = amax >= 0x7F800000;
  const int e = exponent_from_amax_bits(amax);
  // 2^-e (never subnormal for a finite tile); a non-finite tile multiplies by NaN, so every byte becomes 0x7F
  const float m = nonfinite ? __int_as_float(0x7FC00000) : __int_as_float((127 - e) << 23);
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int nb = 4 * (t / 16 + 16 * p);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float y[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) y[r] = __int_as_float(int(raw[p][r][j]) << 16) * m;
      *reinterpret_cast<uint32_t*>(&tile_t[(kc + j) * kPitch + nb]) = encode4(y);
    }
  }
  __syncthreads();
  uint8_t* dst = wt + (g * K + k0) * N + n0;
  const int c = t % 8;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int k = t / 8 + 32 * p;
    const uint32_t* row = reinterpret_cast<const uint32_t*>(&tile_t[k * kPitch + c * 16]);
    uint4 out = make_uint4(row[0], row[1], row[2], row[3]);
    *reinterpret_cast<uint4*>(dst + int64_t(k) * N + c * 16) = out;
  }
  if (t < kTile) {
    const uint32_t sb = nonfinite ? 255u : uint32_t(e + 127);
    *reinterpret_cast<uint32_t*>(s + (g * K + k0 + t) * (N / 32) + n0 / 32) = sb * 0x01010101u;
  }
}

}  // namespace

const char* quant_wt_tiles(const void* w, uint8_t* wt, uint8_t* s, int64_t G, int64_t N, int64_t K,
                           cudaStream_t stream) {
  static thread_local char msg[160];
  if (G == 0 || N == 0 || K == 0) return nullptr;
  if (N % kTile || K % kTile) {
    snprintf(msg, sizeof msg, "quant_wt_tiles: N=%lld and K=%lld must be multiples of 128", (long long)N,
             (long long)K);
    return msg;
  }
  dim3 grid(unsigned(K / kTile), unsigned(N / kTile), unsigned(G));
  quant_wt_tiles_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(w), wt, s, N, K);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    snprintf(msg, sizeof msg, "quant_wt_tiles: %s", cudaGetErrorString(err));
    return msg;
  }
  return nullptr;
}

}  // namespace titan_mx
