// "mx128" MXFP8 grouped GEMM for sm_90a in CUDA C++ on CuTe: out[g] = A[g] @ B[e]^T (fprop / dgrad), the arithmetic
// of the CUTLASS backend's 128x192 kernels (cutlass_sm90/) in a mainloop of our own.
//
// Contract (that of mx32_grouped.cu, with A's scales constant over 128 of R): A [M, R] e4m3, sa [M, R/32] E8M0 bytes
// (1x128: the 4 bytes of a 128-block are equal; byte 0 is read), B [E, C, R] e4m3 with sb [E, C, R/32] constant over
// 128x128 tiles, offs [E] int32 cumulative group ends (any sizes incl. 0, no host sync); rows at or after offs[-1]
// come out as zeros. Per 128-block j of R the four k32 wgmmas accumulate a partial P_j on the tensor cores, and
// acc = fma(P_j, sa * sb, acc) in block order: the CUTLASS kernels' bits.
//
// Why: DeepGEMM's sm_90 kernel computes the same bits ~1.2x faster than CUTLASS's blockwise mainloop at the same
// tiles and L2 traffic (kernels/grouped_gemm/NOTES.md, "128x192 tiles"). Both wait for a stage's wgmmas and only
// then promote, so a warpgroup's tensor-core work and its promotion FFMAs take turns, and the overlap depends on the
// two warpgroups staying out of phase. A first version of this kernel with that loop ran at 62% tensor-pipe
// utilisation (ncu, session 22: the two warpgroups in phase). Here each warpgroup overlaps with itself: the 192
// columns are two halves of 96 (wgmma m64n96k32), and while the tensor cores run one half of stage s the warpgroup
// promotes the other half (of stage s or s-1):
//
//   stage s:  issue lo(s); wait for hi(s-1); release stage s-1; promote hi(s-1);
//             issue hi(s); wait for lo(s); promote lo(s)
//
// Registers: acc 96 + two partials of 48 = the 192 of the whole-N loop. Blocks of kBlockStages stages are unrolled
// and end with every wgmma done (no wgmma may be in flight across a loop's back edge while partials are read inside
// the loop: ptxas then serialises every wgmma, C7514). Scales: a second producer warp copies each stage's E8M0
// words (A: one per tile row; B: the two weight tiles') into shared memory with cp.async, arriving on the stage's
// barrier when they land, so the consumers read them with the stage. (A version whose consumers loaded their bytes
// from global memory two stages ahead stalled on those loads: ncu, session 22.)
//
// Outcome (H100, session 22, benchmarks/results/issue10_s22/NOTE.md): the CUTLASS kernels' bits, at 0.80-0.85x
// of their speed (fprop/dgrad 1.25-1.41x bf16 against 1.54-1.68x). The whole-N loop (MX128_SPLIT_N=0) with the same
// scales: 1.21-1.38x. Not behind any backend switch.
//
// CTA: 3 warpgroups; clusters of 2 CTAs along M. Warpgroup 0: one thread issues the TMA loads into a kStages ring
// (one stage = 128 of R: A 128x128 and the two 96x128 halves of B, 128-byte swizzle); CTA r loads half r of the B
// tile and multicasts it to both CTAs. Warpgroups 1 and 2 each own 64 rows of the 128x192 output tile, their scales
// and their epilogue (bf16 through shared memory and a TMA store). Persistent grid over (pair of m-tiles, n-tile) with
// the m-tiles numbered group after group, each group's count rounded up to even so that the two CTAs of a cluster
// always share the expert (and so the B tile); the odd group's last pair computes a tile past the group's rows and
// writes nothing.
#include "grouped_nt.h"
#include "mx_common.cuh"

#include <algorithm>

#include <cute/tensor.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace titan_mx {
namespace {
using namespace cute;

constexpr int BM = 128, BN = 192, BK = 128;  // BK: one ring stage = one scale block of R
constexpr int BH = BN / 2;                     // the two column halves, one per CTA of a cluster (TMA) and per wgmma
constexpr int kCluster = 2;                    // CTAs along M sharing (multicasting) the B tile
#ifndef MX128_STAGES
#define MX128_STAGES 4
#endif
constexpr int kStages = MX128_STAGES;  // TMA ring depth (40 KB per stage)
#ifndef MX128_BLOCK_STAGES
#define MX128_BLOCK_STAGES 1
#endif
constexpr int kBlockStages = MX128_BLOCK_STAGES;  // stages per unrolled block (every wgmma done at its end)
#ifndef MX128_SPLIT_N
#define MX128_SPLIT_N 1
#endif
// 1: the two 96-column halves overlap each other's promotion (above); 0: one m64n192k32 wgmma group per stage,
// waited for, then promoted (the CUTLASS / DeepGEMM loop), for comparison
constexpr bool kSplitN = MX128_SPLIT_N;
constexpr int kMaxGroups = 256;
constexpr int kThreads = 384;
using Elem = cutlass::float_e4m3_t;
using SmemAtom = GMMA::Layout_K_SW128_Atom<Elem>;
using SmemLayoutA = decltype(tile_to_shape(SmemAtom{}, Shape<Int<BM>, Int<BK>, Int<kStages>>{}));
// B as (row in half, K, half, stage): the halves of a stage are adjacent, so (192, K, stage) views the same bytes
using SmemLayoutB = decltype(tile_to_shape(SmemAtom{}, Shape<Int<BH>, Int<BK>, _2, Int<kStages>>{}));
using SmemLayoutBWhole = decltype(tile_to_shape(SmemAtom{}, Shape<Int<BN>, Int<BK>, Int<kStages>>{}));
static_assert(cosize_v<SmemLayoutB> == cosize_v<SmemLayoutBWhole>);
// two warpgroups along M, each m64n96k32 per k32 slice and half (or m64n192k32 over both halves: kSplitN = 0)
using TiledMma = decltype(make_tiled_mma(SM90_64x96x32_F32E4M3E4M3_SS_TN<>{}, Layout<Shape<_2, _1, _1>>{}));
using TiledMmaWhole = decltype(make_tiled_mma(SM90_64x192x32_F32E4M3E4M3_SS_TN<>{}, Layout<Shape<_2, _1, _1>>{}));
using ClusterShape = Shape<Int<kCluster>, _1, _1>;
using Pipeline = cutlass::PipelineTmaAsync<kStages>;
using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Elem const*>(nullptr)),
                                        make_shape(int32_t(0), int32_t(0)), make_stride(int64_t(0), _1{})));
using TmaA = decltype(make_tma_copy(SM90_TMA_LOAD{}, std::declval<GmemTensor>(), SmemLayoutA{}(_, _, 0)));
using TmaB = decltype(make_tma_copy(SM90_TMA_LOAD_MULTICAST{}, std::declval<GmemTensor>(),
                                    SmemLayoutB{}(_, _, 0, 0), Int<1>{}));  // the whole half box, sent to both CTAs
using Bf16 = cutlass::bfloat16_t;
using SmemLayoutC = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{}, Shape<_64, Int<BN>>{}));
using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<Bf16*>(nullptr)), make_shape(int32_t(0), int32_t(0)),
                                     make_stride(int64_t(0), _1{})));
using TmaC = decltype(make_tma_copy(SM90_TMA_STORE{}, std::declval<GmemOut>(), SmemLayoutC{}));

struct SharedStorage {
  alignas(1024) Elem A[cosize_v<SmemLayoutA>];
  alignas(1024) Elem B[cosize_v<SmemLayoutB>];  // column halves [0, 96) and [96, 192) of the B tile per stage
  alignas(1024) Bf16 C[2][cosize_v<SmemLayoutC>];  // one 64x192 staging tile per consumer warpgroup (bf16 output)
  uint32_t sfa[kStages][BM];  // per stage: the aligned scale word of each tile row (byte 0 = the stage's scale)
  uint32_t sfb[kStages][2];   // per stage: the aligned words holding the weight tiles' scale bytes (n0, n0 + 191)
  typename Pipeline::SharedStorage pipe;
  int tile_start[kMaxGroups + 1];  // first m-tile of group e (even); [E] = the padding rows' first m-tile
  int row_start[kMaxGroups + 1];   // first row of group e (offs clamped to [previous end, M]); [E] = the last end
};

struct Params : NtFields {
  TmaA tma_a;
  TmaB tma_b;
  TmaC tma_c;
  int num_pairs, num_tiles;
};

// cluster tile pid -> this CTA's tile (rank 0 / 1: the even / odd m-tile of the pair)
__device__ __forceinline__ Tile tile_of(int pid, int rank, Params const& p, const int* tile_start,
                                        const int* row_start) {
  int num_n = (p.C + BN - 1) / BN;
  int width = p.group_m * num_n;
  int first = (pid / width) * p.group_m;
  int gsz = min(p.num_pairs - first, p.group_m);
  int mt = 2 * (first + (pid % width) % gsz) + rank;  // (the odd group's extra tile: row0 >= hi, nothing written)
  return tile_at(mt, ((pid % width) / gsz) * BN, p.R / BK, BM, p.E, p.M, tile_start, row_start);
}

// acc += part * f for one 96-column half, f per (row, column block): accumulator register i of m64nNk32 holds row +8
// when bit 1 of i is set and columns 8 * (i / 4) + {0, 1} + 2 * (lane % 4); column blocks of 8 below kSplit take
// the factor fA of their row, the others fB (the caller puts the weight tiles' factors there). Grouped by row (the
// order mx32_grouped.cu found free of register-bank conflicts).
template <int kSplit, class Acc>
__device__ __forceinline__ void promote(Acc& acc, Acc const& part, float f0A, float f0B, float f1A, float f1B) {
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    CUTE_UNROLL
    for (int q = 0; q < size(acc) / 2; ++q) {
      const int i = (q >> 1) * 4 + 2 * h + (q & 1);
      const bool a_side = i / 4 < kSplit;
      acc(i) = fmaf(part(i), h ? (a_side ? f1A : f1B) : (a_side ? f0A : f0B), acc(i));
    }
  }
}

// The decoded scales of one stage: A's of the thread's two rows, B's of the weight tiles of columns n0 (lo) and
// n0 + 191 (hi), which meet at tile column 128 (n0 % 128 == 0) or 64 (lo64). Half 0 (columns 0-95): blocks 0-7
// take lo, blocks 8-11 hi if lo64 else lo. Half 1 (96-191): blocks 0-3 (columns 96-127) hi if lo64 else lo, blocks
// 4-11 hi. The factor is sa * sb, as in the CUTLASS kernels.
struct Scales {
  float a0, a1, blo, bhi;
};

// the whole 192 columns (kSplitN = 0): blocks 0-7 lo, 8-15 lo64 ? hi : lo, 16-23 hi
template <class Acc>
__device__ __forceinline__ void promote_whole(Acc& acc, Acc const& part, Scales const& f, bool lo64) {
  const float bmid = lo64 ? f.bhi : f.blo;
  const float g[2][3] = {{f.a0 * f.blo, f.a0 * bmid, f.a0 * f.bhi}, {f.a1 * f.blo, f.a1 * bmid, f.a1 * f.bhi}};
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    CUTE_UNROLL
    for (int q = 0; q < size(acc) / 2; ++q) {
      const int i = (q >> 1) * 4 + 2 * h + (q & 1);
      acc(i) = fmaf(part(i), g[h][i / 32], acc(i));
    }
  }
}

template <int kHalf, class Acc>
__device__ __forceinline__ void promote_half(Acc& acc, Acc const& part, Scales const& f, bool lo64) {
  const float bmid = lo64 ? f.bhi : f.blo;
  if constexpr (kHalf == 0) promote<8>(acc, part, f.a0 * f.blo, f.a0 * bmid, f.a1 * f.blo, f.a1 * bmid);
  else promote<4>(acc, part, f.a0 * bmid, f.a0 * f.bhi, f.a1 * bmid, f.a1 * f.bhi);
}

// one 4-byte cp.async global -> shared (both 4-byte aligned)
__device__ __forceinline__ void cp_async_word(uint32_t* dst, const uint8_t* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src)
               : "memory");
}

template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) nt_kernel(const __grid_constant__ Params p) {
  extern __shared__ char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int rank = int(cute::block_rank_in_cluster());
  const int cluster_id = blockIdx.x / kCluster, num_clusters = gridDim.x / kCluster;

  if (threadIdx.x == 0) build_group_tables(p.offs, p.E, p.M, BM, 2, smem.tile_start, smem.row_start);

  typename Pipeline::Params pp;
  pp.transaction_bytes = (BM + BN) * BK * sizeof(Elem);  // A, and both halves of B (one from each CTA)
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = 256;
  pp.num_producers = 1 + 32;  // the TMA thread's arrive (with the byte count) and warp 1's 32 cp.async arrivals
  Pipeline pipe(smem.pipe, pp, ClusterShape{});
  cute::cluster_sync();  // barriers initialised in both CTAs before any multicast or remote arrive

  Tensor sA = make_tensor(make_smem_ptr(smem.A), SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem.B), SmemLayoutB{});
  Tensor sB0 = sB(_, _, 0, _);
  Tensor sB1 = sB(_, _, 1, _);

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      auto wr = cutlass::make_producer_start_state<Pipeline>();
      Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.M, p.R));
      Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.E * p.C, p.R));
      Tensor sBr = rank == 0 ? sB0 : sB1;  // this CTA's half of the B tile, multicast to both CTAs
      for (int pid = cluster_id; pid < p.num_tiles; pid += num_clusters) {
        Tile t = tile_of(pid, rank, p, smem.tile_start, smem.row_start);
        if (t.nk == 0) continue;  // (both CTAs of a pair agree: a pair never straddles the padding start)
        Tensor gA = local_tile(domain_offset(make_coord(t.row0, 0), mA), Shape<Int<BM>, Int<BK>>{}, make_coord(0, _));
        Tensor gB = local_tile(domain_offset(make_coord(t.expert * p.C + t.n0 + rank * BH, 0), mB),
                               Shape<Int<BH>, Int<BK>>{}, make_coord(0, _));
        auto [tAgA, tAsA] =
            tma_partition(p.tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
        auto [tBgB, tBsB] =
            tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sBr), group_modes<0, 2>(gB));
        for (int k = 0; k < t.nk; ++k) {
          pipe.producer_acquire(wr);
          auto* bar = pipe.producer_get_barrier(wr);
          copy(p.tma_a.with(*bar), tAgA(_, k), tAsA(_, wr.index()));
          copy(p.tma_b.with(*bar, uint16_t((1 << kCluster) - 1)), tBgB(_, k), tBsB(_, wr.index()));
          ++wr;
        }
      }
      pipe.producer_tail(wr);  // every stage released by both CTAs' consumers: no remote arrive after exit
    } else if (threadIdx.x / 32 == 1) {  // the scale words of each stage, through cp.async
      const int lane = threadIdx.x % 32;
      auto wr = cutlass::make_producer_start_state<Pipeline>();
      for (int pid = cluster_id; pid < p.num_tiles; pid += num_clusters) {
        Tile t = tile_of(pid, rank, p, smem.tile_start, smem.row_start);
        if (t.nk == 0) continue;
        const uint8_t* arow[BM / 32];
        CUTE_UNROLL
        for (int i = 0; i < BM / 32; ++i) arow[i] = p.sa + int64_t(min(t.row0 + lane + 32 * i, p.M - 1)) * p.sa_m;
        // lanes 0 / 1: the weight tile of column n0 / n0 + 191; the aligned word holding its byte
        const int64_t ob = int64_t(t.expert) * p.sb_e + int64_t(min(t.n0 + lane * (BN - 1), p.C - 1)) * p.sb_n;
        for (int k = 0; k < t.nk; ++k) {
          pipe.producer_acquire(wr);  // (not the leader: only waits until both CTAs' consumers freed the stage)
          const int s = wr.index();
          CUTE_UNROLL
          for (int i = 0; i < BM / 32; ++i) cp_async_word(&smem.sfa[s][lane + 32 * i], arow[i] + 4 * k);
          if (lane < 2) cp_async_word(&smem.sfb[s][lane], p.sb + ((ob + 4 * k * p.sb_k) & ~int64_t(3)));
          cutlass::arch::cpasync_barrier_arrive_noinc(reinterpret_cast<uint64_t const*>(pipe.producer_get_barrier(wr)));
          ++wr;
        }
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int ct = threadIdx.x - 128;
  constexpr int kPartN = kSplit ? BH : BN;  // the columns of one accumulator
  cute::conditional_t<kSplit, TiledMma, TiledMmaWhole> mma;
  auto thr = mma.get_slice(ct);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, 4, kStages) descriptors
  auto tCrB0 = [&] {  // half 0 (split) or both halves (whole)
    if constexpr (kSplit) return thr.make_fragment_B(thr.partition_B(sB0));
    else return thr.make_fragment_B(thr.partition_B(make_tensor(make_smem_ptr(smem.B), SmemLayoutBWhole{})));
  }();
  auto tCrB1 = [&] {
    if constexpr (kSplit) return thr.make_fragment_B(thr.partition_B(sB1));
    else return 0;
  }();
  Tensor acc0 = partition_fragment_C(mma, Shape<Int<BM>, Int<kPartN>>{});  // columns [0, kPartN) of the tile
  Tensor part0 = make_fragment_like(acc0);
  auto acc1 = [&] {  // columns [96, 192) (split only)
    if constexpr (kSplit) return make_fragment_like(acc0);
    else return make_tensor<float>(Shape<_0>{});
  }();
  auto part1 = make_fragment_like(acc1);
  Tensor tCcC = thr.partition_C(make_identity_tensor(Shape<Int<BM>, Int<kPartN>>{}));
  const int row_a = get<0>(tCcC(0)), row_b = get<0>(tCcC(2));  // this thread's two rows of the tile
  cutlass::PipelineState<kStages> rd;

  // one half's (or the whole tile's) 4 wgmmas (128 of R) on stage s into a fresh partial, committed as one group
  auto issue = [&](auto& part, auto const& tCrB, int s) {
    warpgroup_fence_operand(part);
    warpgroup_arrive();
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) {
      gemm(mma, tCrA(_, _, j, s), tCrB(_, _, j, s), part);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };

  for (int pid = cluster_id; pid < p.num_tiles; pid += num_clusters) {
    Tile t = tile_of(pid, rank, p, smem.tile_start, smem.row_start);
    if (t.nk == 0 && t.base >= t.hi) continue;  // past the padding rows: nothing to load or write
    clear(acc0);
    if constexpr (kSplit) clear(acc1);
    if (t.nk > 0) {
      const int64_t ob_lo = int64_t(t.expert) * p.sb_e + int64_t(t.n0) * p.sb_n;
      const int64_t ob_hi = int64_t(t.expert) * p.sb_e + int64_t(min(t.n0 + BN - 1, p.C - 1)) * p.sb_n;
      const bool lo64 = t.n0 % 128 != 0;
      // stage k's scales from shared memory (the stage's barrier covers them); decoded after the wgmma issue
      auto scales = [&](int k, int s) {
        uint32_t a0 = smem.sfa[s][row_a], a1 = smem.sfa[s][row_b], wlo = smem.sfb[s][0], whi = smem.sfb[s][1];
        pin_after_issue(a0);
        pin_after_issue(a1);
        pin_after_issue(wlo);
        pin_after_issue(whi);
        const int shl = int((ob_lo + 4 * k * p.sb_k) & 3) * 8, shh = int((ob_hi + 4 * k * p.sb_k) & 3) * 8;
        return Scales{e8m0_f32(a0 & 0xFF), e8m0_f32(a1 & 0xFF), e8m0_f32((wlo >> shl) & 0xFF),
                      e8m0_f32((whi >> shh) & 0xFF)};
      };
      if constexpr (kSplit) {
        // NB stages from k0: lo(s) runs while hi(s-1) is promoted, hi(s) while lo(s) is promoted
        auto block = [&](int k0, auto nb) {
          constexpr int NB = decltype(nb)::value;
          Scales prev;
          auto prev_rd = rd;
          CUTE_UNROLL
          for (int j = 0; j < NB; ++j) {
            pipe.consumer_wait(rd);
            const int s = rd.index();
            issue(part0, tCrB0, s);
            const Scales f = scales(k0 + j, s);
            if (j > 0) {
              warpgroup_wait<1>();  // hi of the previous stage is done (lo was already): the stage can be refilled
              warpgroup_fence_operand(part1);
              pipe.consumer_release(prev_rd);
              promote_half<1>(acc1, part1, prev, lo64);
            }
            issue(part1, tCrB1, s);
            warpgroup_wait<1>();  // lo of this stage is done
            warpgroup_fence_operand(part0);
            promote_half<0>(acc0, part0, f, lo64);
            prev = f;
            prev_rd = rd;
            ++rd;
          }
          warpgroup_wait<0>();
          warpgroup_fence_operand(part1);
          pipe.consumer_release(prev_rd);
          promote_half<1>(acc1, part1, prev, lo64);
        };
        int k = 0;
        for (; k + kBlockStages <= t.nk; k += kBlockStages) block(k, cute::Int<kBlockStages>{});
        for (; k < t.nk; ++k) block(k, cute::Int<1>{});
      } else {
        for (int k = 0; k < t.nk; ++k) {
          pipe.consumer_wait(rd);
          const int s = rd.index();
          issue(part0, tCrB0, s);
          const Scales f = scales(k, s);
          warpgroup_wait<0>();
          warpgroup_fence_operand(part0);
          pipe.consumer_release(rd);  // this stage's wgmmas are done: the producers may refill it now
          ++rd;
          promote_whole(acc0, part0, f, lo64);
        }
      }
    }
    // (the tile again: its fields stay out of registers through the mainloop)
    t = tile_of(pid, rank, p, smem.tile_start, smem.row_start);
    // epilogue. This warpgroup's 64 rows go out by TMA when they all belong to the tile's group (TMA clips rows
    // past M and columns past C); a half that a group boundary cuts is stored thread by thread with masks.
    // (wg through an empty asm: else the compiler hoists the 48 staging addresses out of the tile loop and spills them)
    int wg = ct / 128;
    asm volatile("" : "+r"(wg));
    const int half0 = t.base + 64 * wg;
    if (half0 >= t.hi) continue;  // (the odd group's extra tile, the padding's last tile)
    const bool bulk = half0 >= t.lo && (half0 + 64 <= t.hi || t.hi == p.M) && !p.out_f32;
    const bool leader = ct % 128 == 0;
    if (bulk) {
      Tensor sC = make_tensor(make_smem_ptr(smem.C[wg]), SmemLayoutC{});
      if (leader) tma_store_wait<0>();  // the previous tile's store has read the staging buffer
      cutlass::arch::NamedBarrier::sync(128, wg);
      CUTE_UNROLL
      for (int i = 0; i < size(acc0); i += 2) {
        const int r = get<0>(tCcC(i)) - 64 * wg, c = get<1>(tCcC(i));
        *reinterpret_cast<__nv_bfloat162*>(&sC(r, c)) = __floats2bfloat162_rn(acc0(i), acc0(i + 1));
        if constexpr (kSplit)
          *reinterpret_cast<__nv_bfloat162*>(&sC(r, c + BH)) = __floats2bfloat162_rn(acc1(i), acc1(i + 1));
      }
      cutlass::arch::fence_view_async_shared();  // the generic-proxy writes, visible to the TMA unit
      cutlass::arch::NamedBarrier::sync(128, wg);
      if (leader) tma_store_tile<64, BN>(p.tma_c, sC, p.M, p.C, half0, t.n0);
    } else {
      auto store = [&](auto const& acc, int col0) {
        if (p.out_f32) store_rows<float>(acc, tCcC, t, col0, p.out, p.out_m, p.C);
        else store_rows<Bf16>(acc, tCcC, t, col0, p.out, p.out_m, p.C);
      };
      store(acc0, t.n0);
      if constexpr (kSplit) store(acc1, t.n0 + BH);
    }
  }
  if (ct % 128 == 0) tma_store_wait<0>();  // the last store has finished reading shared memory before exit
}

GmemTensor gmem_view(const void* ptr, int64_t rows, int64_t cols, int64_t row_stride) {
  return make_tensor(make_gmem_ptr(reinterpret_cast<Elem const*>(ptr)), make_shape(int32_t(rows), int32_t(cols)),
                     make_stride(row_stride, _1{}));
}

}  // namespace

const char* mx128_nt_launch(NtArgs const& a, cudaStream_t stream) {
  if (a.R % BK || a.R <= 0 || a.C % 8 || a.E > kMaxGroups || a.E < 1) return "unsupported shape";
  if (a.out_m % (16 / (a.out_f32 ? 4 : 2)) || reinterpret_cast<uintptr_t>(a.out) % 16)
    return "output rows not 16-byte aligned";
  Params p;
  static_cast<NtFields&>(p) = nt_fields(a);
  p.tma_a = make_tma_copy(SM90_TMA_LOAD{}, gmem_view(a.a, a.M, a.R, a.a_m), SmemLayoutA{}(_, _, 0));
  p.tma_b = make_tma_copy(SM90_TMA_LOAD_MULTICAST{}, gmem_view(a.b, a.E * a.C, a.R, a.R),
                          SmemLayoutB{}(_, _, 0, 0), Int<1>{});
  Tensor gC = make_tensor(make_gmem_ptr(reinterpret_cast<Bf16*>(a.out)), make_shape(int32_t(a.M), int32_t(a.C)),
                          make_stride(a.out_m, _1{}));
  p.tma_c = make_tma_copy(SM90_TMA_STORE{}, gC, SmemLayoutC{});  // (not used with fp32 output)
  // each group adds at most one partial and one extra (rounding to even) m-tile; then the padding rows, rounded up
  int num_m = int((a.M + BM - 1) / BM + 2 * a.E + 2);
  p.num_pairs = (num_m + 1) / 2;
  p.num_tiles = p.num_pairs * int((a.C + BN - 1) / BN);

  int smem = int(sizeof(SharedStorage));
  static bool attr_set = false;
  if (!attr_set) {
    if (cudaFuncSetAttribute(nt_kernel<kSplitN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
    attr_set = true;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // one cluster per SM pair (as many as fit at once, if fewer), never more than there are cluster tiles
  static int max_clusters = 0;
  if (max_clusters == 0) {
    cfg.gridDim = dim3(a.sms / kCluster * kCluster);
    if (cudaOccupancyMaxActiveClusters(&max_clusters, nt_kernel<kSplitN>, &cfg) != cudaSuccess || max_clusters < 1)
      return "cudaOccupancyMaxActiveClusters failed (a 2-CTA cluster with this shared memory does not fit)";
  }
  int clusters = std::min(std::min(max_clusters, a.sms / kCluster), p.num_tiles);
  cfg.gridDim = dim3(clusters * kCluster);
  if (cudaLaunchKernelEx(&cfg, nt_kernel<kSplitN>, p) != cudaSuccess) return "cudaLaunchKernelEx failed";
  return nullptr;
}

}  // namespace titan_mx
