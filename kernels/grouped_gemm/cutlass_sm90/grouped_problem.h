// The call description shared by bindings.cpp (torch side) and the CUDA translation units (CUTLASS side).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace titan_mx {

enum GroupMode : int { kRows = 0, kRed = 1 };

// Everything a call needs, in elements (bytes for the fp8 / uint8 tensors, whose elements are bytes).
struct GroupedProblem {
  int mode = kRows;
  int groups = 0;          // E
  const int32_t* offs = nullptr;
  // kRows: A [M, R], out [M, C], B [E, C, R].  kRed: A [rows, T], B [C, T], out [E, rows, C] (T = tokens = M).
  int64_t M = 0;           // rows of A (kRows) / tokens (kRed)
  int64_t rows = 0;        // kRed: rows of A (= rows of each output)
  int64_t C = 0;           // columns of the output = rows of B
  int64_t R = 0;           // kRows: reduction length
  const void* a = nullptr; int64_t lda = 0;
  const void* b = nullptr; int64_t ldb = 0; int64_t b_group_stride = 0;
  // E8M0 scales, strided: kRows sa [M, R/32], sb [E, C, R/32]; kRed sa [rows, T/32], sb [C, T/32] (sb_s0 unused)
  const uint8_t* sa = nullptr; int64_t sa_s0 = 0, sa_s1 = 0;
  const uint8_t* sb = nullptr; int64_t sb_s0 = 0, sb_s1 = 0, sb_s2 = 0;
  void* out = nullptr; int64_t ldo = 0; int64_t out_group_stride = 0;
  // persistent tile scheduler: raster along M (0) or N (1) inside a group; tiles swizzled in runs of max_swizzle
  // (1, 2, 4 or 8) so a wave of CTAs shares more A rows / B columns in L2
  int raster_along_n = 0;
  int max_swizzle = 1;
  // kRows, a later part of the groups: offs points at this part's first group's END in the full offs, row_start
  // at the entry before it (this part's first row); null: the part starts at row 0. zero_tail: also zero the
  // output rows at or after offs[groups - 1] (the part that holds the last group).
  const int32_t* row_start = nullptr;
  int zero_tail = 1;
};

// Kernels (one per schedule and cluster shape; each instantiated for bf16 and fp32 output, one translation unit
// per pair, *_<kernel>.cu, so the build compiles them in parallel):
//   kCooperative  128x128x128 tiles, both consumer warpgroups on one tile, cluster 1x2 (A multicast; CUTLASS
//                 example 68's choice)
//   kPingpong     64x128x128 tiles, the two consumer warpgroups alternate tiles so one's epilogue overlaps the
//                 other's mainloop, cluster 1x2
//   kCoop2x1      cooperative, cluster 2x1 (B multicast: two M tiles of one group share each weight tile load)
//   kCoop1x1      cooperative, no cluster
//   kCoopLpt      cooperative, cluster 1x2, dynamic tile scheduler (lpt_group_scheduler.h): groups longest
//                 reduction first (kRed), tiles after the first wave from a global ticket counter; for wgrad,
//                 where a tile costs its group's token count
//   kCoopN256x2   cooperative, 128x256x128 tiles, cluster 2x1 (B multicast: one weight-tile load feeds two row
//                 tiles), 4 mainloop stages. CUTLASS's loop keeps two fp32 accumulators the width of the tile (the
//                 running sum and the partial of the current 128 of the reduction), so a 64x256 tile per
//                 warpgroup would need 256 registers a thread; our loop (blockwise_grouped.cuh mma_halves) forms
//                 the partial one 128-column half at a time (128 + 64 registers) and each half holds one 128x128
//                 weight tile (one B scale). Every expert width here is a multiple of 256 (2048, 2816, 4096, 7168:
//                 no padded column tiles, against 1.8-3.1% with 192) and each CTA reads 32 KB per 128-deep step for
//                 1.33x a 128x192 tile's FLOPs (28 KB). Same bits as the 128x128 and 128x192 kernels; 1.00-1.06x the
//                 128x192 tiles (session 33, benchmarks/results/issue10_s33/; -DTITAN_MX_WIDE_N=192 builds those for
//                 A/B: 128x192x128, 5 stages, B scales read per 64 columns as a tile straddles two weight tiles).
//                 Measured and dropped: 128x192 with A multicast (1x2), 0.92-1.06x the 128x128 kernel
//                 (benchmarks/results/issue10_n192_s19/)
//   kCoopLptN256x2 kCoopN256x2's tiles and 2x1 cluster with kCoopLpt's dynamic scheduler (the scheduler needs the
//                 two CTAs of a cluster on consecutive linear tile indices, which CUTLASS's grid gives for a 2x1
//                 cluster under both raster orders, as for 1x2); the default for every pass.
// Both 128x256 kernels store their output one consumer warpgroup at a time (blockwise_grouped.cuh
// WarpgroupStoreEpilogue: each warpgroup its own 64 rows through 64x32 bf16 / 64x16 fp32 sub-tiles, its own
// buffers and 128-thread barriers; session 36, +0.1 to +3.3% over CUTLASS's 128x32 sub-tiles shared by both
// warpgroups, same bits; session 37, three buffers and one barrier a sub-tile for bf16 output, fprop/dgrad +0.1 to
// +1.4% more). -DTITAN_MX_EPI_CUTLASS builds CUTLASS's epilogue instead: 128x32 sub-tiles, and for
// kCoopLptN256x2's fp32 output 128x16 ones (session 22, on the 128x192 tiles: the smaller buffer made room for a
// fifth stage, wgrad +0.6 to +3.9%; bf16 output with 128x16 ran 3-9% slower).
enum Schedule : int {
  kCooperative = 0, kPingpong = 1, kCoop2x1 = 2, kCoop1x1 = 3, kCoopLpt = 4, kCoopN256x2 = 5, kCoopLptN256x2 = 6
};
constexpr int kNumSchedules = 7;
// The wide kernels' output tile width. -DTITAN_MX_WIDE_N=192 builds the 128x192 tiles of sessions 19-32 instead
// (CUTLASS's own loop shape; benchmarks time the two side by side through cutlass_backend.load_variant).
#ifndef TITAN_MX_WIDE_N
#define TITAN_MX_WIDE_N 256
#endif
static_assert(TITAN_MX_WIDE_N == 256 || TITAN_MX_WIDE_N == 192, "TITAN_MX_WIDE_N: 256 or 192");
constexpr int kWideN = TITAN_MX_WIDE_N;
// the kernels whose output tiles are 256 columns wide, and those on lpt_group_scheduler.h's dynamic scheduler
constexpr bool is_wide(int s) { return s == kCoopN256x2 || s == kCoopLptN256x2; }
constexpr bool is_lpt(int s) { return s == kCoopLpt || s == kCoopLptN256x2; }

#define TITAN_MX_DECLARE(DT, SCHED)                                                                   \
  size_t scratch_bytes_##DT##_##SCHED(const GroupedProblem& p, int sm_count);                         \
  const char* run_##DT##_##SCHED(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count,  \
                                 cudaStream_t s);
TITAN_MX_DECLARE(bf16, coop) TITAN_MX_DECLARE(f32, coop)
TITAN_MX_DECLARE(bf16, pp) TITAN_MX_DECLARE(f32, pp)
TITAN_MX_DECLARE(bf16, coop2x1) TITAN_MX_DECLARE(f32, coop2x1)
TITAN_MX_DECLARE(bf16, coop1x1) TITAN_MX_DECLARE(f32, coop1x1)
TITAN_MX_DECLARE(bf16, cooplpt) TITAN_MX_DECLARE(f32, cooplpt)
TITAN_MX_DECLARE(bf16, coopn256x2) TITAN_MX_DECLARE(f32, coopn256x2)
TITAN_MX_DECLARE(bf16, cooplptn256x2) TITAN_MX_DECLARE(f32, cooplptn256x2)
#undef TITAN_MX_DECLARE

}  // namespace titan_mx
