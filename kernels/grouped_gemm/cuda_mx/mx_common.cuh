// Device helpers shared by the CuTe grouped GEMMs in this directory (mx32_grouped.cu, mx128_grouped.cu): the
// groups' tile tables, exact E8M0 -> fp32 decoding, scale loads that stay where they are written, masked stores.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/bfloat16.h>

#include "grouped_nt.h"

namespace titan_mx {

// The launch arguments both kernels read as NtArgs gives them (each kernel's Params adds its TMA descriptors and
// tile counts)
struct NtFields {
  const uint8_t* sa;
  const uint8_t* sb;
  void* out;
  const int* offs;
  int M, C, R, E, group_m;
  int64_t sa_m, sb_e, sb_n, sb_k, out_m;
  bool out_f32;
};

inline NtFields nt_fields(NtArgs const& a) {
  return NtFields{a.sa, a.sb, a.out, a.offs, int(a.M), int(a.C), int(a.R), int(a.E), a.group_m,
                  a.sa_m, a.sb_e, a.sb_n, a.sb_k, a.out_m, a.out_f32};
}

// One CTA's output tile of a grouped A[g] @ B[e]^T (m-tiles numbered group after group, a group's last one partial)
struct Tile {
  int expert;   // -1: past the last group
  int row0;     // first A row the mainloop reads
  int base;     // output row of tile row 0
  int lo, hi;   // output rows written: [lo, hi) within [base, base + BM)
  int n0;       // first output column
  int nk;       // mainloop steps (0: zeros)
};

// The groups' first rows and first m-tiles from offs (cumulative ends, clamped so that bad offs give wrong groups,
// never stray rows); each group's m-tile count rounded up to a multiple of `round` (2: the m-tile pairs of a 2-CTA
// cluster share a group). Entry [E]: the end of the last group / the first m-tile of the padding rows after it.
__device__ __forceinline__ void build_group_tables(const int* offs, int E, int M, int bm, int round, int* tile_start,
                                                   int* row_start) {
  int start = 0, tiles = 0;
  for (int e = 0; e < E; ++e) {
    row_start[e] = start;
    tile_start[e] = tiles;
    int end = min(max(offs[e], start), M);
    tiles += ((end - start + bm - 1) / bm + round - 1) / round * round;
    start = end;
  }
  row_start[E] = start;
  tile_start[E] = tiles;
}

// m-tile mt at column n0: its group (binary search: the last e with tile_start[e] <= mt), rows and nk mainloop
// steps; past the last group, the padding rows [row_start[E], M), written as zeros. A rounded-up group's extra tile
// has row0 >= hi: computed, nothing written.
__device__ __forceinline__ Tile tile_at(int mt, int n0, int nk, int bm, int E, int M, const int* tile_start,
                                        const int* row_start) {
  Tile t;
  t.n0 = n0;
  if (mt < tile_start[E]) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (tile_start[mid] <= mt) lo = mid; else hi = mid - 1;
    }
    t.expert = lo;
    t.row0 = row_start[lo] + (mt - tile_start[lo]) * bm;
    t.base = t.row0;
    t.lo = t.row0;
    t.hi = row_start[lo + 1];
    t.nk = nk;
  } else {
    t.expert = -1;
    t.row0 = 0;
    t.base = row_start[E] + (mt - tile_start[E]) * bm;
    t.lo = row_start[E];
    t.hi = M;
    t.nk = 0;
  }
  return t;
}

// The accumulator pairs of one thread (coordinates tCcC within the tile, column offset col0) to out [M, C] row by
// row, masked to the tile's rows [lo, hi) and columns < C: the epilogue where a group boundary cuts a warpgroup's
// rows, or the output is fp32.
template <class OutT, class Acc, class Coord>
__device__ __forceinline__ void store_rows(Acc const& acc, Coord const& tCcC, Tile const& t, int col0, void* out,
                                           int64_t out_m, int C) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc); i += 2) {
    int row = t.base + cute::get<0>(tCcC(i));
    int col = col0 + cute::get<1>(tCcC(i));
    if (row >= t.lo && row < t.hi && col < C) {
      OutT* dst = reinterpret_cast<OutT*>(out) + int64_t(row) * out_m + col;
      if constexpr (std::is_same_v<OutT, float>) {
        *reinterpret_cast<float2*>(dst) = make_float2(acc(i), acc(i + 1));
      } else {
        *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc(i), acc(i + 1));
      }
    }
  }
}

// E8M0 word (4 bytes = 4 steps) -> (hi, lo): step i's fp32 bits are the byte permute [hi_i, lo_i, 0, 0]
__device__ __forceinline__ void e8m0_prep(uint32_t u, uint32_t& hi, uint32_t& lo) {
  uint32_t s1 = u >> 1;
  hi = s1 & 0x7F7F7F7Fu;
  uint32_t y = (u ^ s1) & 0x7F7F7F7Fu;
  uint32_t sp = ~(y + 0x7F7F7F7Fu) & 0x80808080u;  // top bit of byte i <=> b_i in {0, 255}
  lo = ((u & 0x01010101u) << 7) | (sp >> 1);
}

template <int I>
__device__ __forceinline__ float e8m0_pick(uint32_t hi, uint32_t lo) {
  // bytes [hi_I, lo_I, 0, 0]: selector nibble 8 = byte 0 of hi with its (clear) sign bit replicated. Inline PTX
  // because __byte_perm ignores bit 3 of a nibble (it would copy hi's byte 0: factors off by up to 2^-8, found
  // by the GPU test against the Gluon kernel)
  uint32_t bits;  // volatile: stays after the wgmma issue it is written after
  asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(bits) : "r"(hi), "r"(lo), "n"((I << 12) | ((4 + I) << 8) | 0x88));
  return __uint_as_float(bits);
}

// One E8M0 byte b -> 2^(b-127) in fp32 exactly: b << 23, except 0 (2^-127: the subnormal 0x00400000) and 255 (NaN):
// bit 8 of (b-1)|(b+1) is set exactly for those two, and moved to bit 22 it is the subnormal / quiet-NaN bit
__device__ __forceinline__ float e8m0_f32(uint32_t b) {
  return __uint_as_float((b << 23) | ((((b - 1) | (b + 1)) & 0x100u) << 14));
}

// volatile: issued where written (stages ahead of its use), not sunk by the compiler next to the decode
__device__ __forceinline__ uint32_t word_at(const uint8_t* p) {
  uint32_t w;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(w) : "l"(p));
  return w;
}

// An empty volatile asm on v: code using v afterwards stays after the volatile asms written before it (wgmma issue).
__device__ __forceinline__ void pin_after_issue(uint32_t& v) { asm volatile("" : "+r"(v)); }

// One thread stores the warpgroup's kRows x kCols staging tile sC at (row0, col0) of out [M, C] by TMA (it clips rows
// past M and columns past C), asynchronously: tma_store_wait before sC is written again.
template <int kRows, int kCols, class TmaC, class SmemTensor>
__device__ __forceinline__ void tma_store_tile(TmaC const& tma_c, SmemTensor const& sC, int M, int C, int row0,
                                               int col0) {
  using namespace cute;
  Tensor mC = tma_c.get_tma_tensor(make_shape(M, C));
  Tensor gC = local_tile(domain_offset(make_coord(row0, col0), mC), Shape<Int<kRows>, Int<kCols>>{}, make_coord(0, 0));
  auto [tCgC, tCsC] = tma_partition(tma_c, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sC), group_modes<0, 2>(gC));
  copy(tma_c, tCsC, tCgC);
  tma_store_arrive();
}

}  // namespace titan_mx
