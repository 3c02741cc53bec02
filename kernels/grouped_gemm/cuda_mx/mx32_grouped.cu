// True-1x32 ("mx32") MXFP8 grouped GEMM for sm_90a in CUDA C++ on CuTe: out[g] = A[g] @ B[e]^T (fprop / dgrad).
//
// Contract (that of gluon_mx.launch_nt): A [M, R] e4m3 row-major, B [E, C, R] e4m3 (R contiguous), sa [M, R/32] and
// sb [E, C, R/32] E8M0 bytes, B's scale constant over 128-row tiles of C; offs [E] int32 cumulative group ends (any
// sizes incl. 0, no host sync). out [M, C]: rows at or after offs[-1] are written as zeros. The result is
// acc = sum_j P_j * f_j in fp32, promoted in step order j (P_j = the exact fp8 product of reduction block j of 32,
// f_j = e8m0(sa) * e8m0(sb) per row), the order of the Gluon kernels: both give the same bits.
//
// Why CUDA C++ beside the Gluon kernel: the promotion (one FFMA per accumulator element every 32 of K) costs as
// much issue as the MMA, so every other instruction of the mainloop counts, and Gluon 3.6 rebuilds both wgmma
// shared-memory descriptors from the slot address at every step. Here CuTe's descriptors step by a constant per
// 32-byte K slice:
//
//   step j: issue wgmma j into partial P[j % 2] (scale-out 0: no zeroing); wait until only wgmma j is in
//           flight; promote P[(j-1) % 2] into acc while wgmma j runs on the tensor cores.
//
// Outcome (H100, session 18): 10-15% slower than the Gluon kernel, with fewer instructions per step; the time goes
// to waiting on the previous wgmma (benchmarks/results/issue10_cuda_mx32_s18/NOTE.md). Not routed to by any
// backend switch.
//
// CTA: 3 warpgroups. Warpgroup 0: one thread issues the TMA loads into a kStages ring (one stage = 128 of K =
// 4 steps, A and B tiles 128x128, 128-byte swizzle). Warpgroups 1 and 2 each own 64 rows of the 128x128 output
// tile (wgmma m64n128k32), their scales and their epilogue. Persistent grid over (m-tile, n-tile) with the
// m-tiles numbered group after group (a group's last tile may be partial), grouped in runs of group_m m-tiles.
// Scales: one 32-bit word per row and stage (4 E8M0 bytes), loaded two stages ahead, decoded per stage with a
// SWAR pass and one byte permute per step (2^(b-127) exactly; 0 -> 2^-127, 255 -> NaN).
#include "grouped_nt.h"
#include "mx_common.cuh"

#include <cute/tensor.hpp>
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

constexpr int BM = 128, BN = 128, BK = 128;  // BK: one ring stage = 4 steps of 32
#ifndef MX32_STAGES
#define MX32_STAGES 5
#endif
constexpr int kStages = MX32_STAGES;  // TMA ring depth (32 KB per stage)
#ifndef MX32_BLOCK_STAGES
#define MX32_BLOCK_STAGES 1
#endif
constexpr int kBlockStages = MX32_BLOCK_STAGES;  // stages per unrolled block (wait(0) at its end)
constexpr int kMaxGroups = 256;
constexpr int kThreads = 384;
using Elem = cutlass::float_e4m3_t;
using SmemAtom = GMMA::Layout_K_SW128_Atom<Elem>;
using SmemLayoutA = decltype(tile_to_shape(SmemAtom{}, Shape<Int<BM>, Int<BK>, Int<kStages>>{}));
using SmemLayoutB = decltype(tile_to_shape(SmemAtom{}, Shape<Int<BN>, Int<BK>, Int<kStages>>{}));
// two warpgroups along M, each m64n128k32 per step
using TiledMma = decltype(make_tiled_mma(SM90_64x128x32_F32E4M3E4M3_SS_TN<>{}, Layout<Shape<_2, _1, _1>>{}));
using Pipeline = cutlass::PipelineTmaAsync<kStages>;
using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Elem const*>(nullptr)),
                                        make_shape(int32_t(0), int32_t(0)), make_stride(int64_t(0), _1{})));
using Tma = decltype(make_tma_copy(SM90_TMA_LOAD{}, std::declval<GmemTensor>(), SmemLayoutA{}(_, _, 0)));
// epilogue: each consumer warpgroup stages its 64x128 half of the output tile in shared memory (128-byte swizzle:
// the accumulator pairs of a warp land in distinct banks) and one thread stores it with TMA, asynchronously, while
// the warpgroup goes on to the next tile's mainloop
template <typename OutT>
using SmemLayoutC = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<OutT>{}, Shape<_64, Int<BN>>{}));
template <typename OutT>
using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<OutT*>(nullptr)), make_shape(int32_t(0), int32_t(0)),
                                     make_stride(int64_t(0), _1{})));
template <typename OutT>
using TmaC = decltype(make_tma_copy(SM90_TMA_STORE{}, std::declval<GmemOut<OutT>>(), SmemLayoutC<OutT>{}));

template <typename OutT>
struct SharedStorage {
  alignas(1024) Elem A[cosize_v<SmemLayoutA>];
  alignas(1024) Elem B[cosize_v<SmemLayoutB>];
  // (bf16 output only: an fp32 tile would leave room for fewer ring stages; fp32 goes out thread by thread)
  alignas(1024) cutlass::bfloat16_t C[2][cosize_v<SmemLayoutC<cutlass::bfloat16_t>>];
  typename Pipeline::SharedStorage pipe;
  int tile_start[kMaxGroups + 1];  // first m-tile of group e; [E] = m-tiles of all groups
  int row_start[kMaxGroups + 1];   // first row of group e (offs clamped to [previous end, M]); [E] = the last end
};

template <typename OutT>
struct Params : NtFields {
  Tma tma_a, tma_b;
  TmaC<OutT> tma_c;
  int num_m, num_tiles;
};

template <class P>
__device__ __forceinline__ Tile tile_of(int pid, P const& p, const int* tile_start, const int* row_start) {
  int num_n = (p.C + BN - 1) / BN;
  int width = p.group_m * num_n;
  int first_m = (pid / width) * p.group_m;
  int gsz = min(p.num_m - first_m, p.group_m);
  int mt = first_m + (pid % width) % gsz;
  return tile_at(mt, ((pid % width) / gsz) * BN, p.R / 32, BM, p.E, p.M, tile_start, row_start);
}

// the 4 scale bytes of a stage for the weight tile: one aligned word when the steps are contiguous (fprop), else
// four bytes `step` apart (dgrad reads W's scales through a transposed view); uniform over the CTA
template <bool kContiguous>
__device__ __forceinline__ uint32_t weight_word(const uint8_t* p, int step) {
  if constexpr (kContiguous) return word_at(p);
  // (strided: plain loads; the compiler may move them)
  return uint32_t(__ldg(p)) | (uint32_t(__ldg(p + step)) << 8) | (uint32_t(__ldg(p + 2 * step)) << 16) |
         (uint32_t(__ldg(p + 3 * step)) << 24);
}

// step j (unrolled: constant) of the word prepared by e8m0_prep
__device__ __forceinline__ float pick(uint32_t hi, uint32_t lo, int j) {
  return j == 0 ? e8m0_pick<0>(hi, lo) : j == 1 ? e8m0_pick<1>(hi, lo) : j == 2 ? e8m0_pick<2>(hi, lo)
                                                                         : e8m0_pick<3>(hi, lo);
}

template <class Acc>
__device__ __forceinline__ void promote(Acc& acc, Acc const& part, float fa, float fb) {
  // accumulator register i of m64nNk32 (fp32): row +8 when bit 1 of i is set, so rows alternate in pairs.
  // Grouped by row: the 32 registers of row +0 (bit 1 of i clear) with fa, then those of row +8 with fb. The factor
  // then comes from the operand reuse cache and ptxas gives acc and the partial registers opposite parities, so
  // an FFMA reads no two operands from one register bank (in pair order, acc(i) and part(i) shared a bank in 504
  // of 512 FFMAs: ncu's top dispatch stall; the Gluon kernel's FFMAs come out grouped this way)
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    CUTE_UNROLL
    for (int q = 0; q < size(acc) / 2; ++q) {
      const int i = (q >> 1) * 4 + 2 * h + (q & 1);
      acc(i) = fmaf(part(i), h ? fb : fa, acc(i));
    }
  }
}

template <typename OutT, bool kSbContiguous>
__global__ void __launch_bounds__(kThreads, 1) nt_kernel(const __grid_constant__ Params<OutT> p) {
  extern __shared__ char smem_raw[];
  SharedStorage<OutT>& smem = *reinterpret_cast<SharedStorage<OutT>*>(smem_raw);
  int warp_group = threadIdx.x / 128;

  if (threadIdx.x == 0) build_group_tables(p.offs, p.E, p.M, BM, 1, smem.tile_start, smem.row_start);

  typename Pipeline::Params pp;
  pp.transaction_bytes = (BM + BN) * BK * sizeof(Elem);
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = 256;
  Pipeline pipe(smem.pipe, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  Tensor sA = make_tensor(make_smem_ptr(smem.A), SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem.B), SmemLayoutB{});

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      auto wr = cutlass::make_producer_start_state<Pipeline>();
      Tensor mA = p.tma_a.get_tma_tensor(make_shape(p.M, p.R));
      Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.E * p.C, p.R));
      for (int pid = blockIdx.x; pid < p.num_tiles; pid += gridDim.x) {
        Tile t = tile_of(pid, p, smem.tile_start, smem.row_start);
        if (t.nk == 0) continue;
        Tensor gA = local_tile(domain_offset(make_coord(t.row0, 0), mA), Shape<Int<BM>, Int<BK>>{}, make_coord(0, _));
        Tensor gB = local_tile(domain_offset(make_coord(t.expert * p.C + t.n0, 0), mB), Shape<Int<BN>, Int<BK>>{},
                               make_coord(0, _));
        auto [tAgA, tAsA] =
            tma_partition(p.tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
        auto [tBgB, tBsB] =
            tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
        int n_stages = t.nk / 4;
        for (int k = 0; k < n_stages; ++k) {
          pipe.producer_acquire(wr);
          auto* bar = pipe.producer_get_barrier(wr);
          copy(p.tma_a.with(*bar), tAgA(_, k), tAsA(_, wr.index()));
          copy(p.tma_b.with(*bar), tBgB(_, k), tBsB(_, wr.index()));
          ++wr;
        }
      }
      pipe.producer_tail(wr);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  int ct = threadIdx.x - 128;
  TiledMma mma;
  mma.accumulate_ = GMMA::ScaleOut::Zero;  // every wgmma writes a fresh partial
  auto thr = mma.get_slice(ct);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, 4, kStages) descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
  Tensor part0 = make_fragment_like(acc);
  Tensor part1 = make_fragment_like(acc);
  Tensor tCcC = thr.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
  const int row_a = get<0>(tCcC(0)), row_b = get<0>(tCcC(2));  // this thread's two rows of the tile
  cutlass::PipelineState<kStages> rd;

  for (int pid = blockIdx.x; pid < p.num_tiles; pid += gridDim.x) {
    Tile t = tile_of(pid, p, smem.tile_start, smem.row_start);
    if (t.base >= t.hi) continue;  // past the padding rows: nothing to write
    clear(acc);
    if (t.nk > 0) {
      const int n_stages = t.nk / 4;
      const uint8_t* pa0 = p.sa + int64_t(min(t.row0 + row_a, p.M - 1)) * p.sa_m;
      const uint8_t* pa1 = p.sa + int64_t(min(t.row0 + row_b, p.M - 1)) * p.sa_m;
      const uint8_t* pb = p.sb + int64_t(t.expert) * p.sb_e + int64_t(t.n0) * p.sb_n;
      const int sb_k = int(p.sb_k);
      // scale words two stages ahead (one stage, ~1300 cycles, did not cover the loads' latency: ncu showed the
      // decode waiting on them): (wa0, wa1, wb) for this stage, (na0, na1, nb) for the next
      const int k1 = min(1, n_stages - 1);
      uint32_t wa0 = word_at(pa0), wa1 = word_at(pa1), wb = weight_word<kSbContiguous>(pb, sb_k);
      uint32_t na0 = word_at(pa0 + 4 * k1), na1 = word_at(pa1 + 4 * k1);
      uint32_t nb = weight_word<kSbContiguous>(pb + (kSbContiguous ? 4 * k1 : 4 * k1 * sb_k), sb_k);
      float fa_prev = 0.f, fb_prev = 0.f;
      // NSB stages (4 * NSB steps) unrolled: step j's wgmma is issued before step j-1's partial is promoted, and
      // the block ends with wait(0). No wgmma may be in flight across a loop's back edge while partials are read
      // inside the loop: ptxas then serialises every wgmma (C7514; found compiling this file).
      auto block = [&](int k0, auto nsb) {
        constexpr int NSB = decltype(nsb)::value;
        auto prev = rd;
        CUTE_UNROLL
        for (int ks = 0; ks < NSB; ++ks) {
          const int k = k0 + ks;
          pipe.consumer_wait(rd);
          const int s = rd.index();
          uint32_t ha0, la0, ha1, la1, hb, lb;
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j) {
            auto& cur = (j & 1) ? part1 : part0;
            auto& done = (j & 1) ? part0 : part1;
            warpgroup_fence_operand(cur);
            warpgroup_arrive();
            gemm(mma, tCrA(_, _, j, s), tCrB(_, _, j, s), cur);
            warpgroup_commit_batch();
            // everything below waits on the previous wgmma anyway: the scale work goes here, after the issue
            // (placed before it, by the compiler, it delayed every wgmma by ~20 instructions)
            if (j == 0) {
              pin_after_issue(wa0);
              pin_after_issue(wa1);
              pin_after_issue(wb);
              e8m0_prep(wa0, ha0, la0);
              e8m0_prep(wa1, ha1, la1);
              e8m0_prep(wb, hb, lb);
              const int kn = min(k + 2, n_stages - 1);  // the words of stage k + 2 (the last stages reload)
              wa0 = na0;
              wa1 = na1;
              wb = nb;
              na0 = word_at(pa0 + 4 * kn);
              na1 = word_at(pa1 + 4 * kn);
              nb = weight_word<kSbContiguous>(pb + (kSbContiguous ? 4 * kn : 4 * kn * sb_k), sb_k);
            }
            const float fbj = pick(hb, lb, j);
            const float fa = pick(ha0, la0, j) * fbj;
            const float fb = pick(ha1, la1, j) * fbj;
            if (ks > 0 || j > 0) {
              warpgroup_wait<1>();  // the previous step's wgmma is done
              warpgroup_fence_operand(done);
              if (j == 0) pipe.consumer_release(prev);  // so is every wgmma of the previous stage
              promote(acc, done, fa_prev, fb_prev);
            }
            fa_prev = fa;
            fb_prev = fb;
          }
          prev = rd;
          ++rd;
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(part1);  // the block's last step (4 per stage: odd) wrote part1
        pipe.consumer_release(prev);
        promote(acc, part1, fa_prev, fb_prev);
      };
      int k = 0;
      for (; k + kBlockStages <= n_stages; k += kBlockStages) block(k, cute::Int<kBlockStages>{});
      for (; k < n_stages; ++k) block(k, cute::Int<1>{});
    }
    // epilogue. This warpgroup's 64 rows go out by TMA when they all belong to the tile's group (TMA clips rows
    // past M and columns past C); a half that a group boundary cuts is stored thread by thread with masks.
    // (wg through an empty asm: else the compiler hoists the staging addresses out of the tile loop and spills them)
    int wg = ct / 128;
    asm volatile("" : "+r"(wg));
    const int half0 = t.base + 64 * wg;
    const bool bulk = half0 >= t.lo && (half0 + 64 <= t.hi || t.hi == p.M);
    const bool leader = ct % 128 == 0;
    if (bulk && !std::is_same_v<OutT, float>) {
      OutT* stage_c = reinterpret_cast<OutT*>(smem.C[wg]);
      Tensor sC = make_tensor(make_smem_ptr(stage_c), SmemLayoutC<OutT>{});
      if (leader) tma_store_wait<0>();  // the previous tile's store has read the staging buffer
      cutlass::arch::NamedBarrier::sync(128, wg);
      CUTE_UNROLL
      for (int i = 0; i < size(acc); i += 2) {
        const int r = get<0>(tCcC(i)) - 64 * wg, c = get<1>(tCcC(i));
        if constexpr (std::is_same_v<OutT, float>) {
          *reinterpret_cast<float2*>(&sC(r, c)) = make_float2(acc(i), acc(i + 1));
        } else {
          *reinterpret_cast<__nv_bfloat162*>(&sC(r, c)) = __floats2bfloat162_rn(acc(i), acc(i + 1));
        }
      }
      cutlass::arch::fence_view_async_shared();  // the generic-proxy writes, visible to the TMA unit
      cutlass::arch::NamedBarrier::sync(128, wg);
      if (leader) tma_store_tile<64, BN>(p.tma_c, sC, p.M, p.C, half0, t.n0);
    } else {
      store_rows<OutT>(acc, tCcC, t, t.n0, p.out, p.out_m, p.C);
    }
  }
  if (ct % 128 == 0) tma_store_wait<0>();  // the last store has finished reading shared memory before exit
}

template <typename OutT, bool kSbContiguous>
const char* launch_typed(Params<OutT> const& p, int grid, cudaStream_t stream) {
  auto kernel = nt_kernel<OutT, kSbContiguous>;
  int smem = int(sizeof(SharedStorage<OutT>));
  static bool attr_set = false;
  if (!attr_set) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
    attr_set = true;
  }
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return nullptr;
}

Tma make_tma(const void* ptr, int64_t rows, int64_t cols, int64_t row_stride) {
  Tensor g = make_tensor(make_gmem_ptr(reinterpret_cast<Elem const*>(ptr)), make_shape(int32_t(rows), int32_t(cols)),
                         make_stride(row_stride, _1{}));
  return make_tma_copy(SM90_TMA_LOAD{}, g, SmemLayoutA{}(_, _, 0));
}

template <typename OutT>
TmaC<OutT> make_tma_out(void* ptr, int64_t rows, int64_t cols, int64_t row_stride) {
  Tensor g = make_tensor(make_gmem_ptr(reinterpret_cast<OutT*>(ptr)), make_shape(int32_t(rows), int32_t(cols)),
                         make_stride(row_stride, _1{}));
  return make_tma_copy(SM90_TMA_STORE{}, g, SmemLayoutC<OutT>{});
}

template <typename OutT>
const char* launch(NtArgs const& a, cudaStream_t stream) {
  Params<OutT> p;
  static_cast<NtFields&>(p) = nt_fields(a);
  p.tma_a = make_tma(a.a, a.M, a.R, a.a_m);
  p.tma_c = make_tma_out<OutT>(a.out, a.M, a.C, a.out_m);
  p.tma_b = make_tma(a.b, a.E * a.C, a.R, a.R);
  p.num_m = int((a.M + BM - 1) / BM + a.E + 1);  // each group adds at most one partial tile; then the padding rows
  p.num_tiles = p.num_m * int((a.C + BN - 1) / BN);
  int grid = p.num_tiles < a.sms ? p.num_tiles : a.sms;
  return a.sb_k == 1 ? launch_typed<OutT, true>(p, grid, stream) : launch_typed<OutT, false>(p, grid, stream);
}

}  // namespace

const char* mx32_nt_launch(NtArgs const& a, cudaStream_t stream) {
  if (a.R % BK || a.R <= 0 || a.C % 8 || a.E > kMaxGroups || a.E < 1) return "unsupported shape";
  if (a.out_m % (16 / (a.out_f32 ? 4 : 2)) || reinterpret_cast<uintptr_t>(a.out) % 16)
    return "output rows not 16-byte aligned";
  return a.out_f32 ? launch<float>(a, stream) : launch<cutlass::bfloat16_t>(a, stream);
}

}  // namespace titan_mx
