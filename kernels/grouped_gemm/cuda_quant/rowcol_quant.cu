// One-read MXFP8 quantizer of a bf16 activation / gradient x [M, K] into the two copies the expert GEMMs read
// (kernels/grouped_gemm/quant_triton.py's to_mxfp8_blocked_rowcol with do_row and do_col, same bytes):
//   row copy  qr [M, K]  e4m3, sr [M, K/32]  one E8M0 byte per 1x32 block, shared by RB along K (RB = 32 or 128)
//   col copy  qc [K, MC] e4m3, sc [K, MC/32] x'^T quantized along tokens: CB tokens (32 or 128) x CT features
//             (1 or 128) per scale; x' = x with rows at or past *limit zeroed, MC = M rounded up to 32.
// The rule is kernels/mxfp8/triton.py's (exponent from the amax bits, hardware cvt.rn.satfinite.e4m3x2, a
// non-finite block gets scale 0xFF and NaN data 0x7F).
//
// Why this exists beside the Triton kernel (H100, benchmarks/quant_rowcol_cuda.py, issue10_s30/): 1.05-1.19x its
// speed in the expert op's four layouts (mx128 x at dsv3_up 0.870 vs 0.998 ms; a copy of x takes 0.618). A
// 256-thread CTA quantizes a 128 x 128 tile; a thread owns 8 consecutive tokens x 8 consecutive features, so
//   - amaxes are integer maxes on packed bf16 magnitude bits (max.u16x2: two elements per instruction), the row
//     blocks take 2 (RB 32) or 4 (RB 128) shuffle stages on two rows at once, column partials go through shared
//     memory once;
//   - every scale is computed once per CTA and read back from shared memory (2 x LDS.128 per thread);
//   - the column copy's conversions pair two TOKENS of one feature, so the transposed bytes come out of the cvt
//     already in token order: one 8-byte shared store per feature, then 16-byte coalesced global stores;
//   - one CTA per tile (session 44): 1.08-1.24x the persistent grid of 2 CTAs per SM (sessions 30-43, kept as
//     ctas_per_sm > 0), same bytes; see rowcol_persistent_kernel.
// ~14 SASS instructions per element against the Triton kernel's 22-32. The stores (sessions 30-31, ncu on the
// persistent grid, mx128 x dsv3_up: DRAM 66% busy, 0.30 instructions issued per scheduler cycle): without the
// copies' data stores it runs 0.30 ms on an H200, each copy's stores add ~0.18 (benchmark --diag). Sending them
// from shared memory with cp.async.bulk (session 31), staging both copies and storing them during the next tile's
// arithmetic, 3 ring stages, tile orders (session 44; -D switches in commit bf358e3), streaming stores and
// evict-first loads (session 40): all 0.9-1.02x, same bytes. What helped is letting the CTA exit: one CTA per
// tile, 0.56 ms at dsv3_up's x (H200; a copy 0.44). A kernel that only moves the same bytes in the same tiles
// (benchmarks/store_pattern_probe.py) takes 0.49 ms with ~8 CTAs per SM resident, 0.54 with 2.
#include <cstdint>
#include <algorithm>
#include <climits>

#ifndef ROWCOL_KERNEL_ONLY  // -DROWCOL_KERNEL_ONLY: the kernels alone, for SASS counts without torch's headers
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

constexpr int TM = 128;  // tokens per CTA
constexpr int TK = 128;  // features per CTA
// Measured and dropped (H200, session 40, benchmarks/results/issue10_s40/; the -D switches are in commit 3facba4):
// 3 CTAs per SM at 80 registers 0.94-0.99x this kernel, st.global.cs stores 0.97-1.00x, evict-first L2 hints on
// the loads 0.90-0.93x.
constexpr int NT = 256;  // threads: warp w owns tokens 16w..16w+15, half h of it 8 of them, lane q of the half
                         // features 8q..8q+7

__device__ __forceinline__ uint32_t vmax2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// four fp32 -> four e4m3 bytes (a in the low byte), round to nearest even, saturating; NaN -> 0x7F
__device__ __forceinline__ uint32_t cvt4(float a, float b, float c, float d) {
  uint32_t r;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

__device__ __forceinline__ float lo_f(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi_f(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// magnitude bits of a bf16 block amax (>= 0x7F80: inf / NaN in the block) -> factor 2^-e (NaN for a non-finite
// block, so its elements convert to 0x7F) and the E8M0 byte: e = clamp(ceil(log2(fl(amax / 448))), -127, 127)
__device__ __forceinline__ void scale_of(uint32_t amax16, float& mult, uint32_t& byte) {
  const uint32_t a = amax16 << 16;
  const int ea = int(a >> 23);
  const uint32_t man = a & 0x7FFFFFu;
  int e = ea - 135 + int(man > 0x600000u);
  if (ea == 8 && man == 0x600001u) e = -127;  // the one amax whose amax/448 rounds down to 2^-127 (not a bf16)
  e = min(max(e, -127), 127);
  const bool nonfinite = a >= 0x7F800000u;
  mult = nonfinite ? __uint_as_float(0x7FC00000u) : __uint_as_float(uint32_t(127 - e) << 23);
  byte = nonfinite ? 255u : uint32_t(e + 127);
}

__device__ __forceinline__ uint32_t lo16(uint32_t v) { return v & 0xFFFFu; }
__device__ __forceinline__ uint32_t hi16(uint32_t v) { return v >> 16; }
__device__ __forceinline__ uint32_t fold(uint32_t v) { return max(lo16(v), hi16(v)); }

// col: the column copy [feature][token] (TK * TM bytes), 8-byte chunks XOR-swizzled by q; the one-tile kernels
// keep it beside Smem, the persistent one in the ring slot the tile was loaded from
struct Smem {
  alignas(16) uint32_t part[8][16][4];   // per warp: column partial amaxes (packed u16x2, features 8q + 2j + s)
  alignas(16) float rmult[4][TM];        // row factors [row block][token]
  alignas(16) float cmult[4][TK];        // column factors [token block][feature] (CT 128: [b][0] only)
  uint32_t tile[8];                      // per warp: tile amax partial (CT 128)
};

template <int RB, int CB, int CT, bool MASK>
__device__ __forceinline__ void tile_body(Smem& sm, uint8_t* __restrict__ col, const uint4 (&v)[8], int m0, int k0, int M, int K, int MC,
                                          int lim, uint8_t* __restrict__ qr, uint8_t* __restrict__ sr,
                                          uint8_t* __restrict__ qc, uint8_t* __restrict__ sc, int diag = 0) {
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, h = lane >> 4, q = lane & 15;
  const int r0 = 16 * w + 8 * h;  // this thread's first token in the tile
  const int KB = K / 32, MB = MC / 32;
  // magnitude bits; under MASK the column path sees rows at or past lim as zeros
  uint32_t mag[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t* vi = reinterpret_cast<const uint32_t*>(&v[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) mag[i][j] = vi[j] & 0x7FFF7FFFu;
  }
  bool keep[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) keep[i] = !MASK || (m0 + r0 + i < lim);

  // ---- row amax: pack rows (2p, 2p+1) into one word, reduce over the RB / 8 lanes of the block
  uint32_t rp[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uint32_t a = vmax2(vmax2(mag[2 * p][0], mag[2 * p][1]), vmax2(mag[2 * p][2], mag[2 * p][3]));
    uint32_t b = vmax2(vmax2(mag[2 * p + 1][0], mag[2 * p + 1][1]), vmax2(mag[2 * p + 1][2], mag[2 * p + 1][3]));
    rp[p] = vmax2(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
#pragma unroll
    for (int s = 1; s < RB / 8; s <<= 1) rp[p] = vmax2(rp[p], __shfl_xor_sync(0xFFFFFFFFu, rp[p], s));
  }
  // ---- column partial amax over this thread's 8 tokens, then the other half of the warp (16 tokens)
  uint32_t cm[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = vmax2(m, keep[i] ? mag[i][j] : 0u);
    cm[j] = vmax2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 16));
  }
  // ---- row scales: each (row, row block) once; bytes straight to sr
  {
    const int kb0 = k0 / 32;
    if (RB == 128) {
      if (q < 8) {  // lane q: row r0 + q
        const int sel = q >> 1;  // a select chain: the loop form put rp in local memory (a 16-byte stack frame)
        const uint32_t pk = sel == 0 ? rp[0] : sel == 1 ? rp[1] : sel == 2 ? rp[2] : rp[3];
        float f;
        uint32_t byte;
        scale_of((q & 1) ? hi16(pk) : lo16(pk), f, byte);
        sm.rmult[0][r0 + q] = f;
        const int row = m0 + r0 + q;
        if (row < M) {
          uint8_t* dst = sr + size_t(row) * KB + kb0;
          if ((KB & 3) == 0 && kb0 + 4 <= KB) *reinterpret_cast<uint32_t*>(dst) = byte * 0x01010101u;
          else for (int b = 0; b < 4 && kb0 + b < KB; ++b) dst[b] = uint8_t(byte);
        }
      }
    } else {  // RB 32: the 4 lanes of a block (q / 4) take two rows each
      const int kb = q >> 2, s = q & 3;
      const uint32_t pk = s == 0 ? rp[0] : s == 1 ? rp[1] : s == 2 ? rp[2] : rp[3];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        float f;
        uint32_t byte;
        scale_of(t ? hi16(pk) : lo16(pk), f, byte);
        const int r = r0 + 2 * s + t;
        sm.rmult[kb][r] = f;
        if (m0 + r < M && kb0 + kb < KB) sr[size_t(m0 + r) * KB + kb0 + kb] = uint8_t(byte);
      }
    }
  }
  // ---- column scales
  if (CT == 1) {
    if (h == 0) *reinterpret_cast<uint4*>(&sm.part[w][q][0]) = make_uint4(cm[0], cm[1], cm[2], cm[3]);
    __syncthreads();
    if (CB == 32) {  // token block b = w / 2: warps w and w ^ 1; the 4 threads of (q, b) take one word j each
      const uint4 o = *reinterpret_cast<const uint4*>(&sm.part[w ^ 1][q][0]);
      const int j = 2 * (w & 1) + h, b = w >> 1;
      uint32_t m = j == 0 ? cm[0] : j == 1 ? cm[1] : j == 2 ? cm[2] : cm[3];
      m = vmax2(m, j == 0 ? o.x : j == 1 ? o.y : j == 2 ? o.z : o.w);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        float f;
        uint32_t byte;
        scale_of(t ? hi16(m) : lo16(m), f, byte);
        const int feat = 8 * q + 2 * j + t;
        sm.cmult[b][feat] = f;
        if (k0 + feat < K && m0 / 32 + b < MB) sc[size_t(k0 + feat) * MB + m0 / 32 + b] = uint8_t(byte);
      }
    } else {  // CB 128: threads 0..63 take word (q, j) over the 8 warps
      if (tid < 64) {
        const int qq = tid >> 2, j = tid & 3;
        uint32_t m = 0;
#pragma unroll
        for (int ww = 0; ww < 8; ++ww) m = vmax2(m, sm.part[ww][qq][j]);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          float f;
          uint32_t byte;
          scale_of(t ? hi16(m) : lo16(m), f, byte);
          const int feat = 8 * qq + 2 * j + t;
          sm.cmult[0][feat] = f;
          if (k0 + feat < K) {
            uint8_t* dst = sc + size_t(k0 + feat) * MB + m0 / 32;
            if ((MB & 3) == 0 && m0 / 32 + 4 <= MB) *reinterpret_cast<uint32_t*>(dst) = byte * 0x01010101u;
            else for (int b = 0; b < 4 && m0 / 32 + b < MB; ++b) dst[b] = uint8_t(byte);
          }
        }
      }
    }
  } else {  // CT 128: one scale per CB tokens x 128 features
    uint32_t m = fold(vmax2(vmax2(cm[0], cm[1]), vmax2(cm[2], cm[3])));
#pragma unroll
    for (int s = 1; s < 16; s <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
    if (lane == 0) sm.tile[w] = m;
    __syncthreads();
    if (tid < TK) {  // feature tid: its CB-token blocks' bytes
      uint32_t bytes = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        uint32_t a = 0;
        if (CB == 32) a = max(sm.tile[2 * b], sm.tile[2 * b + 1]);
        else {
#pragma unroll
          for (int ww = 0; ww < 8; ++ww) a = max(a, sm.tile[ww]);
        }
        float f;
        uint32_t byte;
        scale_of(a, f, byte);
        if (tid == 0) sm.cmult[b][0] = f;
        bytes |= byte << (8 * b);
      }
      if (k0 + tid < K) {
        uint8_t* dst = sc + size_t(k0 + tid) * MB + m0 / 32;
        if ((MB & 3) == 0 && m0 / 32 + 4 <= MB) *reinterpret_cast<uint32_t*>(dst) = bytes;
        else for (int b = 0; b < 4 && m0 / 32 + b < MB; ++b) dst[b] = uint8_t(bytes >> (8 * b));
      }
    }
  }
  __syncthreads();
  // ---- factors for this thread's rows and features
  float rm[8], cmf[8];
  {
    const int kb = RB == 32 ? (q >> 2) : 0;
    const float4 a = *reinterpret_cast<const float4*>(&sm.rmult[kb][r0]);
    const float4 b = *reinterpret_cast<const float4*>(&sm.rmult[kb][r0 + 4]);
    rm[0] = a.x; rm[1] = a.y; rm[2] = a.z; rm[3] = a.w; rm[4] = b.x; rm[5] = b.y; rm[6] = b.z; rm[7] = b.w;
    const int tb = CB == 32 ? (w >> 1) : 0;
    if (CT == 1) {
      const float4 c = *reinterpret_cast<const float4*>(&sm.cmult[tb][8 * q]);
      const float4 d = *reinterpret_cast<const float4*>(&sm.cmult[tb][8 * q + 4]);
      cmf[0] = c.x; cmf[1] = c.y; cmf[2] = c.z; cmf[3] = c.w; cmf[4] = d.x; cmf[5] = d.y; cmf[6] = d.z; cmf[7] = d.w;
    } else {
      const float c = sm.cmult[tb][0];
#pragma unroll
      for (int t = 0; t < 8; ++t) cmf[t] = c;
    }
  }
  // ---- encode: row copy straight to global (8 bytes per row), column copy transposed into shared memory
  uint32_t rw[8][2];
  const int chunk = ((2 * w + h) ^ q) * 8;
#pragma unroll
  for (int j2 = 0; j2 < 2; ++j2) {  // features 4*j2 .. 4*j2+3 of the thread's 8
    float cy[4][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t* vi = reinterpret_cast<const uint32_t*>(&v[i]);
      const uint32_t u0 = vi[2 * j2], u1 = vi[2 * j2 + 1];
      const float x0 = lo_f(u0), x1 = hi_f(u0), x2 = lo_f(u1), x3 = hi_f(u1);
      rw[i][j2] = cvt4(x0 * rm[i], x1 * rm[i], x2 * rm[i], x3 * rm[i]);
      cy[0][i] = keep[i] ? x0 * cmf[4 * j2] : 0.f;
      cy[1][i] = keep[i] ? x1 * cmf[4 * j2 + 1] : 0.f;
      cy[2][i] = keep[i] ? x2 * cmf[4 * j2 + 2] : 0.f;
      cy[3][i] = keep[i] ? x3 * cmf[4 * j2 + 3] : 0.f;
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int feat = 8 * q + 4 * j2 + t;
      const uint2 c = make_uint2(cvt4(cy[t][0], cy[t][1], cy[t][2], cy[t][3]),
                                 cvt4(cy[t][4], cy[t][5], cy[t][6], cy[t][7]));
      *reinterpret_cast<uint2*>(&col[feat * TM + chunk]) = c;
    }
  }
  const bool kin = k0 + 8 * q < K;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = m0 + r0 + i;
    if (row < M && kin && !(diag & 2))
      *reinterpret_cast<uint2*>(qr + size_t(row) * K + k0 + 8 * q) = make_uint2(rw[i][0], rw[i][1]);
  }
  __syncthreads();
  // ---- column copy out: feature rows of 128 tokens, 16 bytes per thread and step
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int piece = tid + NT * s, feat = piece >> 3, m = piece & 7;
    const int sw = (feat >> 3) & 15;  // the q that wrote this feature
    uint4 d = *reinterpret_cast<const uint4*>(&col[feat * TM + ((m ^ (sw >> 1)) * 16)]);
    if (sw & 1) d = make_uint4(d.z, d.w, d.x, d.y);
    if (k0 + feat < K && m0 + 16 * m < MC && !(diag & 1))
      *reinterpret_cast<uint4*>(qc + size_t(k0 + feat) * MC + m0 + 16 * m) = d;
  }
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

constexpr size_t RING_SLOT = size_t(8) * NT * sizeof(uint4);  // one tile: 32 KB
constexpr size_t pipe_smem(int stages) { return sizeof(Smem) + stages * RING_SLOT; }

// 256-thread CTAs, two per SM at 127 registers. Each walks tiles in tile_of's order (with a grid of one CTA per
// tile, the default: just its own) with STAGES - 1 tiles' loads in flight (cp.async into a per-thread slot of a
// shared-memory ring: a thread reads back only what it copied) while the current one is quantized; the column copy
// is transposed in the slot the tile came from (free once every thread holds its part in registers).
// Why one tile per CTA (session 44, H200, benchmarks/results/issue10_s44/): the persistent grid of 2 CTAs per SM
// ran 0.69 ms at dsv3_up's x, one CTA per tile 0.56 (a copy 0.44). A kernel that only moves the same bytes
// showed the same (benchmarks/store_pattern_probe.py: 0.64 ms looping at 2 CTAs per SM, 0.54 one tile per CTA at
// 2 resident). Likely reason, not profiled: a CTA that exits frees its slot for a new tile's loads while its
// stores drain; a looping CTA waits for them (its next loads queue behind its stores).
template <int RB, int CB, int CT, int STAGES>
__global__ void __launch_bounds__(NT, 2) rowcol_persistent_kernel(const uint16_t* __restrict__ x,
                                                                  uint8_t* __restrict__ qr, uint8_t* __restrict__ sr,
                                                                  uint8_t* __restrict__ qc, uint8_t* __restrict__ sc,
                                                                  const int* __restrict__ limit, int M, int K,
                                                                  int MC, int group_m, int diag) {
  extern __shared__ __align__(16) uint8_t dyn[];
  Smem& sm = *reinterpret_cast<Smem*>(dyn);
  uint8_t* ring_bytes = dyn + sizeof(Smem);
  uint4* ring = reinterpret_cast<uint4*>(ring_bytes);  // [stage][i][tid]
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, h = lane >> 4, q = lane & 15;
  const int r0 = 16 * w + 8 * h;
  const int nk = (K + TK - 1) / TK, nm = (MC + TM - 1) / TM, ntiles = nm * nk;
  // tile t -> (m-tile, k-tile): group_m 0 walks k first (row-major over x); else runs of group_m m-tiles, k-tile
  // by k-tile, so that the CTAs in flight read long runs of x's rows AND write long runs of the column copy's
  auto tile_of = [&](int t, int& m0, int& k0) {
    if (group_m == 0) {
      m0 = (t / nk) * TM;
      k0 = (t % nk) * TK;
    } else {
      const int g = t / (group_m * nk), first = g * group_m, rows = min(group_m, nm - first);
      const int idx = t - g * group_m * nk;
      m0 = (first + idx % rows) * TM;
      k0 = (idx / rows) * TK;
    }
  };
  auto issue = [&](int t, int s) {
    if (t < ntiles) {
      int m0, k0;
      tile_of(t, m0, k0);
      const bool kin = k0 + 8 * q < K;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = m0 + r0 + i;
        const bool p = row < M && kin;
        cp_async16(&ring[(s * 8 + i) * NT + tid], p ? x + size_t(row) * K + k0 + 8 * q : x, p);
      }
    }
    cp_async_commit();  // an empty group past the end keeps wait<STAGES - 2> meaning "this tile landed"
  };
  int t = blockIdx.x;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(t + s * int(gridDim.x), s);
  const int lim = limit ? *limit : INT_MAX;
  for (int n = 0; t < ntiles; ++n, t += gridDim.x) {
    const int s = n % STAGES;
    // refill the slot the previous tile was transposed in: the barrier at the end of the last tile_body let every
    // thread finish reading it
    issue(t + (STAGES - 1) * int(gridDim.x), (n + STAGES - 1) % STAGES);
    cp_async_wait<STAGES - 1>();
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = ring[(s * 8 + i) * NT + tid];
    int m0, k0;
    tile_of(t, m0, k0);
    uint8_t* col = ring_bytes + s * RING_SLOT;
    if (m0 + TM > lim) tile_body<RB, CB, CT, true>(sm, col, v, m0, k0, M, K, MC, lim, qr, sr, qc, sc, diag);
    else tile_body<RB, CB, CT, false>(sm, col, v, m0, k0, M, K, MC, lim, qr, sr, qc, sc, diag);
    __syncthreads();  // every thread is done with this slot's column copy before anyone refills it
  }
  cp_async_wait<0>();
}

#ifndef ROWCOL_KERNEL_ONLY
template <int RB, int CB, int CT, int STAGES>
void launch_persistent(const uint16_t* xp, uint8_t* qrp, uint8_t* srp, uint8_t* qcp, uint8_t* scp, const int* limit,
                       int M, int K, int MC, int group_m, int diag, int ctas_per_sm, dim3 grid,
                       cudaStream_t stream) {
  static bool attr_set = false;  // per instantiation (and process: one device kind per run)
  if (!attr_set) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(rowcol_persistent_kernel<RB, CB, CT, STAGES>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(pipe_smem(STAGES))));
    attr_set = true;
  }
  int dev = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int tiles = int(grid.x * grid.y);
  const int ctas = ctas_per_sm > 0 ? std::min(tiles, ctas_per_sm * sms) : tiles;  // 0: one CTA per tile
  rowcol_persistent_kernel<RB, CB, CT, STAGES><<<ctas, NT, pipe_smem(STAGES), stream>>>(
      xp, qrp, srp, qcp, scp, limit, M, K, MC, group_m, diag);
}

template <int RB, int CB, int CT>
void launch(const torch::Tensor& x, torch::Tensor& qr, torch::Tensor& sr, torch::Tensor& qc, torch::Tensor& sc,
            const int* limit, int group_m, int diag, int ctas_per_sm, cudaStream_t stream) {
  const int M = x.size(0), K = x.size(1), MC = qc.size(1);
  const dim3 grid((MC + TM - 1) / TM, (K + TK - 1) / TK);
  // 2 stages (one tile in flight while one is quantized): 3 measured the same (H100, issue10_s30/)
  launch_persistent<RB, CB, CT, 2>(reinterpret_cast<const uint16_t*>(x.data_ptr()), qr.data_ptr<uint8_t>(),
                                   sr.data_ptr<uint8_t>(), qc.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), limit, M,
                                   K, MC, group_m, diag, ctas_per_sm, grid, stream);
}

// x bf16 [M, K] contiguous (K % 32 == 0); outputs preallocated uint8: qr [M, K], sr [M, K/32], qc [K, MC],
// sc [K, MC/32]; limit: int32 [1] on the device or None; ctas_per_sm 0: one CTA per tile, N > 0: a persistent grid
// of N CTAs per SM. The Python side (quant_cuda.py) checks with names.
void rowcol(torch::Tensor x, torch::Tensor qr, torch::Tensor sr, torch::Tensor qc, torch::Tensor sc,
            c10::optional<torch::Tensor> limit, int64_t rb, int64_t cb, int64_t ct, int64_t group_m,
            int64_t diag, int64_t ctas_per_sm) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kBFloat16);
  const int64_t M = x.size(0), K = x.size(1), MC = (M + 31) / 32 * 32;
  TORCH_CHECK(K % 32 == 0 && M * K < (int64_t(1) << 31) && K * MC < (int64_t(1) << 31));
  TORCH_CHECK(qr.is_contiguous() && qr.size(0) == M && qr.size(1) == K && qr.scalar_type() == torch::kUInt8);
  TORCH_CHECK(sr.is_contiguous() && sr.size(0) == M && sr.size(1) == K / 32 && sr.scalar_type() == torch::kUInt8);
  TORCH_CHECK(qc.is_contiguous() && qc.size(0) == K && qc.size(1) == MC && qc.scalar_type() == torch::kUInt8);
  TORCH_CHECK(sc.is_contiguous() && sc.size(0) == K && sc.size(1) == MC / 32 && sc.scalar_type() == torch::kUInt8);
  const int* lim = nullptr;
  if (limit.has_value()) {
    TORCH_CHECK(limit->scalar_type() == torch::kInt32 && limit->numel() == 1 && limit->is_cuda());
    lim = limit->data_ptr<int>();
  }
  if (M == 0 || K == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const int g = int(group_m), d = int(diag), c = int(ctas_per_sm);
  if (rb == 128 && cb == 128 && ct == 128) launch<128, 128, 128>(x, qr, sr, qc, sc, lim, g, d, c, stream);
  else if (rb == 128 && cb == 128 && ct == 1) launch<128, 128, 1>(x, qr, sr, qc, sc, lim, g, d, c, stream);
  else if (rb == 32 && cb == 32 && ct == 128) launch<32, 32, 128>(x, qr, sr, qc, sc, lim, g, d, c, stream);
  else if (rb == 32 && cb == 32 && ct == 1) launch<32, 32, 1>(x, qr, sr, qc, sc, lim, g, d, c, stream);
  else TORCH_CHECK(false, "rowcol quantizer (cuda): no kernel for row block ", rb, ", column block ", cb,
                   ", column tile ", ct);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#else
template __global__ void rowcol_persistent_kernel<128, 128, 128, 2>(const uint16_t*, uint8_t*, uint8_t*, uint8_t*,
    uint8_t*, const int*, int, int, int, int, int);
template __global__ void rowcol_persistent_kernel<128, 128, 1, 2>(const uint16_t*, uint8_t*, uint8_t*, uint8_t*,
    uint8_t*, const int*, int, int, int, int, int);
template __global__ void rowcol_persistent_kernel<32, 32, 128, 2>(const uint16_t*, uint8_t*, uint8_t*, uint8_t*,
    uint8_t*, const int*, int, int, int, int, int);
template __global__ void rowcol_persistent_kernel<32, 32, 1, 2>(const uint16_t*, uint8_t*, uint8_t*, uint8_t*,
    uint8_t*, const int*, int, int, int, int, int);
#endif
}  // namespace

#ifndef ROWCOL_KERNEL_ONLY
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rowcol", &rowcol, "MXFP8 row + token-major column copies of bf16 x [M, K] from one read (sm_90a)");
}
#endif
