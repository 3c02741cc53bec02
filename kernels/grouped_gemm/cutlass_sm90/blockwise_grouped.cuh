// MXFP8 "mx128" grouped GEMM on CUTLASS 4.2's sm_90a blockwise-scaled ptr-array GEMM (warp-specialized,
// cooperative, persistent over groups, device-side problem shapes).
//
// One kernel type serves fprop, dgrad and wgrad: out_g = A_g @ B_g^T with A_g [rows, red] and B_g [cols, red]
// (red contiguous in both), A scaled per 1 x 128 along red, B per 128 x 128 tile, fp32 accumulation with the
// promotion every 128 of red (CUTLASS's blockwise mainloop). Nothing here knows torch: bindings.cpp hands in raw
// pointers and strides, so the two GEMM translation units compile without torch's headers.
//
// Groups come from offs (int32 cumulative END rows / tokens) on the device: small kernels below turn offs into
// CUTLASS's per-group problem shapes, pointers, strides and fp32 block-scale arrays, so a call never syncs with the
// host (CUDA-graph and torch.compile friendly). Our scales are E8M0 bytes in kernels.mxfp8's layout (one byte per
// 1x32 block; "mx128" repeats the byte over each 1x128 block / 128x128 tile); CUTLASS 4.2's sm_90 mainloop reads
// fp32 scales in the layout Sm90BlockwiseScaleConfig::tile_atom_to_shape_SF{A,B}(M, N, K) builds from each group's
// problem shape (the per-group layout argument is not read by the grouped kernel): MN-major, packed per group,
// i.e. SFA_g[kb][m] at kb * M_g + m and SFB_g[kb][nb] at kb * ceil(N_g / 128) + nb.
//
// Two ways of grouping:
//   kRows (fprop, dgrad): groups split the rows of A and of the output; B is per expert. Any group sizes
//     (0 gives no tiles); output rows at or after offs[E-1] are written as zeros here. A call may run a later
//     part of the groups (GroupedProblem::row_start): it writes only its groups' rows (and the zero tail if
//     it holds the last group), so a caller can run the groups in parts into one output.
//   kRed (wgrad): groups split the reduction axis (tokens) of A [rows, T] and B [cols, T]; the output is per
//     expert [rows, cols]. Every group must start on a multiple of 128 tokens (the scale grid of both operands
//     is the global token grid; the Python side asserts it on the device). Empty groups get no tiles and their
//     output is zeroed here (CUTLASS's mainloop leaves the accumulator undefined for K = 0).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "grouped_problem.h"

#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/detail/blockwise_scale_layout.hpp"

#include "lpt_group_scheduler.h"

// The promotion of the 128x192 tiles (the wide kernels built with -DTITAN_MX_WIDE_N=192). With a row scale for A
// (1x128) and more than one column scale for B per tile, CUTLASS's mainloop promotes with accum += partial * sa * sb:
// an FMUL and an FFMA per accumulator, and a rounding order, (partial * sa) * sb, that differs from the 128x128
// kernels' partial * (sa * sb) where partial * sa leaves fp32's range. This specialization of its accumulator helper,
// for the 96 fp32 values a thread holds of a 128x192 tile (2 consumer warpgroups, m64n192 each), forms the products of
// the scales first: two rows x three column blocks = six FMULs a thread that the compiler shares over the 96 FFMAs, and
// the same bits as the 128x128 kernels. The mainloop calls only scale(sa, sb) when the promotion interval is one
// 128-deep block (our case; other members are left out on purpose, so any other use fails to compile).
namespace cutlass::gemm::collective {
template <class LayoutAccum>
struct GmmaFP8Accumulation<cute::ArrayEngine<float, 96>, LayoutAccum> {
  using TensorAccum = cute::Tensor<cute::ArrayEngine<float, 96>, LayoutAccum>;
  using ElementAccumulator = float;

 private:
  TensorAccum& accum_;
  TensorAccum accum_temp_;

 public:
  CUTLASS_DEVICE GmmaFP8Accumulation(TensorAccum& accum, uint32_t, uint32_t)
      : accum_(accum), accum_temp_(cute::make_fragment_like(accum)) {}

  CUTLASS_DEVICE TensorAccum& operator()() { return accum_temp_; }

  template <class EngineScaleA, class LayoutScaleA, class EngineScaleB, class LayoutScaleB>
  CUTLASS_DEVICE void scale(const cute::Tensor<EngineScaleA, LayoutScaleA>& sa,
                            const cute::Tensor<EngineScaleB, LayoutScaleB>& sb) {
    // the scales' shapes refine the accumulator's (SFB splits the 24 n8 chunks as (8, 3)), same linear order
    static_assert(cute::size(LayoutScaleA{}) == 96 && cute::size(LayoutScaleB{}) == 96,
                  "scales must cover the 96 accumulators");
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(accum_); ++i) accum_(i) += accum_temp_(i) * (sa(i) * sb(i));
  }
};
}  // namespace cutlass::gemm::collective

namespace titan_mx {

// CUTLASS 4.2's sm_90 blockwise consumer loop, per 128-deep k-block: issue the stage's wgmmas into a partial, wait
// for all of them (warpgroup_wait<0>), release the PREVIOUS k-block's stage, then promote. The current stage is done
// with at that wait too, yet it stays held until the next k-block's wait: each consumer warpgroup holds two of the
// 4-5 stages, so the producer has only 2-3 loads in flight ahead of the math (sessions 19 / 21: the consumers find
// about half the stages not yet loaded). ReleaseOnWaitMainloop is CUTLASS's collective with its own consumer loop
// that hands each stage back right after the wait that finishes it (its scales are already in registers), so every
// stage but the one being multiplied is the producer's. Everything else (loads, tensor maps, shared storage, the
// promotion arithmetic: same bits) is the base collective's. Only the one-promotion-per-k-block case that these
// kernels instantiate is written (A scaled per row; B per tile, or per 64 columns for the 128x192 tiles); the
// 128x256 tiles take mma_halves.
// -DTITAN_MX_RELEASE_LATE builds CUTLASS's own loop instead (benchmarks time the two side by side).
template <class Base>
struct ReleaseOnWaitMainloop : Base {
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using Params = typename Base::Params;
  using TiledMma = typename Base::TiledMma;
  using TileShape = typename Base::TileShape;
  using Scale = typename Base::ElementBlockScale;
  static_assert(Base::ScalePromotionInterval == 4, "written for one promotion per 128-deep k-block");
  static_assert(Base::ScaleMsPerTile > 1, "written for A scaled per row");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tiles,
                          int thread_idx, TensorStorage& shared, Params const&) {
    if constexpr (cute::size<1>(TileShape{}) == 256) {
      mma_halves(pipeline, read, accum, k_tiles, thread_idx, shared);
    } else {
      mma_whole(pipeline, read, accum, k_tiles, thread_idx, shared);
    }
  }

  // The stage ring's operands, (M, K, stages) and (N, K, stages), and each operand's scales as a tensor over the
  // output tile: broadcast over the other operand's mode, so they partition like the running sum.
  CUTLASS_DEVICE static auto smem_tensors(TensorStorage& shared) {
    using namespace cute;
    using LayoutSFA = typename Base::SmemLayoutSFA;  // (M scales, K blocks, stages)
    using LayoutSFB = typename Base::SmemLayoutSFB;  // (N scales, K blocks, stages)
    Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), typename Base::SmemLayoutB{});
    Tensor sSFA = make_tensor(make_smem_ptr(shared.smem_SFA.data()),
                              make_layout(make_shape(shape<0>(LayoutSFA{}), get<1>(TileShape{}),
                                                     make_shape(shape<1>(LayoutSFA{}), shape<2>(LayoutSFA{}))),
                                          make_stride(stride<0>(LayoutSFA{}), _0{},
                                                      make_stride(stride<1>(LayoutSFA{}), stride<2>(LayoutSFA{})))));
    Tensor sSFB = make_tensor(make_smem_ptr(shared.smem_SFB.data()),
                              make_layout(make_shape(get<0>(TileShape{}), shape<0>(LayoutSFB{}),
                                                     make_shape(shape<1>(LayoutSFB{}), shape<2>(LayoutSFB{}))),
                                          make_stride(_0{}, stride<0>(LayoutSFB{}),
                                                      make_stride(stride<1>(LayoutSFB{}), stride<2>(LayoutSFB{})))));
    return make_tuple(sA, sB, sSFA, sSFB);
  }

  // Wait until the stage at `read` is loaded and copy its scales into registers; returns the stage's index.
  template <class Token, class SmemSFA, class RegSFA, class SmemSFB, class RegSFB>
  CUTLASS_DEVICE static int wait_stage(MainloopPipeline& pipeline, PipelineState read, Token token,
                                       SmemSFA const& tCsSFA, RegSFA& tCrSFA, SmemSFB const& tCsSFB, RegSFB& tCrSFB) {
    using namespace cute;
    pipeline.consumer_wait(read, token);
    int stage = read.index();
    copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), tCrSFA);
    copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), tCrSFB);
    return stage;
  }

  // Tiles up to 128x192: one partial the width of the tile per k-block.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma_whole(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tiles,
                                int thread_idx, TensorStorage& shared) {
    using namespace cute;
    auto [sA, sB, sSFA, sSFB] = smem_tensors(shared);

    TiledMma tiled_mma;
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto wg_mma = tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor tCsSFA = thr_mma.partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (K blocks, stages))
    Tensor tCsSFB = thr_mma.partition_C(sSFB);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // smem descriptors (MMA, MMA_M, MMA_K, stages)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));
    Tensor tCrSFA = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));
    Tensor tCrSFB = make_tensor_like<Scale>(tCsSFB(_, _, _, _0{}));

    cutlass::gemm::collective::GmmaFP8Accumulation accumulation(accum, Base::ScalePromotionInterval,
                                                                 size<2>(tCrA));
    warpgroup_fence_operand(accumulation());
    auto token = pipeline.consumer_try_wait(read);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tiles > 0; --k_tiles) {
      int stage = wait_stage(pipeline, read, token, tCsSFA, tCrSFA, tCsSFB, tCrSFB);
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;  // the partial of this k-block starts from zero
      warpgroup_fence_operand(accumulation());
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accumulation());
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(accumulation());
      if constexpr (Base::ScaleNsPerTile == 1) {
        // one B scale per tile: fold it into A's row scales while the wgmmas run (partial * (sa * sb), as CUTLASS)
        Scale sb = tCrSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFA)); ++i) filter_zeros(tCrSFA)(i) = filter_zeros(tCrSFA)(i) * sb;
      }
      warpgroup_wait<0>();
      pipeline.consumer_release(read);  // this stage's wgmmas are done and its scales are in registers
      ++read;
      if (k_tiles > 1) token = pipeline.consumer_try_wait(read);
      if constexpr (Base::ScaleNsPerTile == 1) accumulation.scale(tCrSFA);
      else accumulation.scale(tCrSFA, tCrSFB);
    }
    warpgroup_fence_operand(accumulation());
  }

  // 128x256 tiles (the wide kernels' default): a warpgroup's 64x256 running sum is 128 fp32 registers a thread, and a
  // partial of the same width would need 128 more (CUTLASS's loop, and the reason its tiles stop at 192). Here the
  // partial of a k-block is formed one 128-column half at a time (m64n128 wgmmas into 64 registers, wait, promote into
  // that half of the sum), so the registers are those of the 128x192 tiles (128 + 64 = 96 + 96). Each half holds
  // exactly one 128x128 weight tile, so its B scale is one number; the promotion is partial * (sa * sb) as in the other
  // kernels (same bits). The wgmma C fragments of m64n256 and of two m64n128 list their values in the same order (value
  // pair, row half, 8-column chunk), so value i of half h's partial is value 64 h + i of the running sum.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma_halves(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tiles,
                                 int thread_idx, TensorStorage& shared) {
    using namespace cute;
    static_assert(Base::ScaleNsPerTile == 2, "B scaled per 128x128 tile: one scale per half");
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    static_assert(kWarpGroups == 2 && size<0>(TileShape{}) == 128, "two consumer warpgroups, 64 rows each");
    using HalfMma = decltype(make_tiled_mma(
        GMMA::ss_op_selector<typename Base::ElementA, typename Base::ElementB, float, Shape<_64, _128, _128>>(),
        Layout<Shape<Int<kWarpGroups>, _1, _1>>{}));
    static_assert(size(HalfMma{}) == size(TiledMma{}), "same threads as the kernel's MMA");

    auto [sA, sB, sSFA, sSFB] = smem_tensors(shared);

    TiledMma tiled_mma;  // the kernel's (m64n256) MMA: it lays out the running sum and the scales
    HalfMma half_mma;
    int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto wg_mma = half_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor tCsSFA = thr_mma.partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (K blocks, stages)), like the running sum
    Tensor tCsSFB = thr_mma.partition_C(sSFB);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, 1, MMA_K, stages)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, 2 halves, MMA_K, stages)
    Tensor tCrSFA = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));
    Tensor tCrSFB = make_tensor_like<Scale>(tCsSFB(_, _, _, _0{}));
    // a warpgroup's 64x128 partial: one m64n128 C fragment, 64 values a thread
    Tensor partial = make_fragment_like(partition_fragment_C(half_mma, Shape<_128, _128>{})(_, _0{}, _0{}));
    static_assert(decltype(size(partial))::value == 64 && decltype(size(accum))::value == 128,
                  "the running sum is the two halves' partials side by side");

    warpgroup_fence_operand(accum);
    auto token = pipeline.consumer_try_wait(read);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tiles > 0; --k_tiles) {
      int stage = wait_stage(pipeline, read, token, tCsSFA, tCrSFA, tCsSFB, tCrSFB);
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        half_mma.accumulate_ = GMMA::ScaleOut::Zero;  // each half's partial starts from zero
        warpgroup_fence_operand(partial);
        warpgroup_arrive();
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {
          cute::gemm(half_mma, tCrA(_, _0{}, kb, stage), tCrB(_, h, kb, stage), partial);
          half_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_fence_operand(partial);
        warpgroup_wait<0>();
        if (h == 1) {
          pipeline.consumer_release(read);  // both halves' wgmmas are done and the scales are in registers
          ++read;
          if (k_tiles > 1) token = pipeline.consumer_try_wait(read);
        }
        Scale sb = tCrSFB(64 * h);  // the half's one weight tile
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(partial); ++i) accum(64 * h + i) += partial(i) * (tCrSFA(64 * h + i) * sb);
      }
    }
    warpgroup_fence_operand(accum);
  }

  // mma() released every stage it read; the base's tail would release the last one a second time
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

// The wide kernels' epilogue: each consumer warpgroup stores its own 64 rows (session 36). CUTLASS's cooperative
// epilogue stores 128x32 sub-tiles that hold rows of both warpgroups: every sub-tile costs two barriers over all 256
// consumer threads, so the two warpgroups leave the tensor cores together and come back together, a pause per tile
// that weighs most where a tile has few k-blocks (session 33's ncu: tensor pipe 72% busy at 16 k-blocks a tile, 82%
// at 56). Here a warpgroup converts its rows into 64xEN buffers of its own (EN = 32 bf16 / 16 fp32 columns; the TMA box
// is the EpilogueTile, built as 64xEN) and syncs only its own 128 threads, so one warpgroup can go on to the next
// tile's wgmmas while the other still stores. Same values and conversion as CUTLASS's (round to nearest; its
// LinearCombination with alpha 1, beta 0): same bits. fprop/dgrad 0.98-1.04x over three H100s (faster in 34 of 36
// cells, most where the reduction is 2048 deep), wgrad (64 k-blocks a tile) 0.99-1.02x
// (benchmarks/results/issue10_s36/).
// Session 37: three buffers a warpgroup instead of two, used in turn across tiles, and one barrier a sub-tile instead
// of two. With two, the issuer had to wait for the store it issued one sub-tile earlier to have read its buffer (a TMA
// round trip per sub-tile) and a second barrier told the others; with three, the store it waits for was issued two
// sub-tiles back, and the wait goes before the sub-tile's only barrier. 8 KB more shared memory (4 stages still fit). bf16
// output: fprop/dgrad +0.1 to +1.4% (faster in 35 of 36 cells over three H100s), wgrad neutral; fp32 output (wgrad
// only, 16 sub-tiles a tile) 0.99-1.00x, so it keeps two (benchmarks/results/issue10_s37/). One barrier with two
// buffers (the wait then on the store just issued, -DTITAN_MX_EPI_ONEBAR) measured 0.99-1.01x: the round trip is what
// cost.
// Measured and dropped: warpgroup 1 held 600 or 1500 cycles behind warpgroup 0 at each tile start (15-20% slower: the
// laggard holds stages the other needs). -DTITAN_MX_EPI_CUTLASS builds CUTLASS's epilogue instead,
// -DTITAN_MX_EPI_BUFS=2 session 36's two buffers (benchmarks time them side by side).
template <class Base>
struct WarpgroupStoreEpilogue : Base {
  using Params = typename Base::Params;
  using EpilogueTile = typename Base::EpilogueTile;
  using CtaTileMNK = typename Base::CtaTileMNK;
  using SmemElementD = typename Base::ElementD;
  using LoadPipeline = typename Base::LoadPipeline;
  using LoadPipelineState = typename Base::LoadPipelineState;
  using StorePipeline = typename Base::StorePipeline;
  using StorePipelineState = typename Base::StorePipelineState;
  using TensorMapStorage = typename Base::TensorMapStorage;
  using Policy = typename Base::DispatchPolicy;
  static constexpr int kEpiN = cute::size<1>(EpilogueTile{});
  static constexpr int kBufs = Policy::StagesD;  // a warpgroup's output buffers
  // the base's (private) output buffers: its swizzle atom tiled over (64, EN, buffers), as the TMA box expects
  using SmemLayoutD = decltype(cute::tile_to_shape(typename Base::SmemLayoutAtomD{},
                                                   cute::make_shape(cute::_64{}, cute::Int<kEpiN>{}, cute::Int<kBufs>{}),
                                                   cute::Step<cute::_1, cute::_2, cute::_3>{}));
  static constexpr size_t kSmemAlignD = cutlass::detail::alignment_for_swizzle(SmemLayoutD{});
  static_assert(cute::size<0>(EpilogueTile{}) == 64 && cute::size<0>(CtaTileMNK{}) == 128,
                "a warpgroup stores its 64 rows of a 128-row tile");
  static_assert(kBufs >= 2 && !Policy::ReuseSmemC && !Policy::DelayTmaStore &&
                    cute::is_void_v<typename Base::ElementC>,
                "written for two or more output buffers and no source operand");
#ifdef TITAN_MX_EPI_ONEBAR
  static constexpr bool kOneBarrier = true;
#else
  static constexpr bool kOneBarrier = kBufs > 2;
#endif
  static_assert(kEpiN % 8 == 0 && cute::size<1>(CtaTileMNK{}) % kEpiN == 0, "sub-tiles of whole 8-column chunks");
  static constexpr int kSubTiles = cute::size<1>(CtaTileMNK{}) / kEpiN;
  static_assert(kOneBarrier || kSubTiles % 2 == 0, "each tile ends on the second buffer");
  // a buffer is the next one's offset away: the swizzle's period (at most 1 KB) divides a buffer
  static constexpr int kBufElems = 64 * kEpiN;
  static_assert(cute::cosize_v<SmemLayoutD> == kBufs * kBufElems && kBufElems * sizeof(SmemElementD) % 1024 == 0,
                "buffers side by side, whole swizzle periods");
  static_assert(sizeof(typename Base::TensorStorage) >= sizeof(SmemElementD) * cute::cosize_v<SmemLayoutD>,
                "the base's buffers are warpgroup 0's");

  struct TensorStorage {
    typename Base::TensorStorage base;  // the fusion's storage and warpgroup 0's two buffers
    alignas(kSmemAlignD) cute::ArrayEngine<SmemElementD, cute::cosize_v<SmemLayoutD>> smem_D1;
  };

  CUTLASS_HOST_DEVICE WarpgroupStoreEpilogue(Params const& params, TensorStorage& shared)
      : Base(params, shared.base), params_(params) {}

  // no source operand (ElementC void): the kernel's epilogue load warp never loads; this only has to compile
  template <class... Args>
  CUTLASS_DEVICE LoadPipelineState load(LoadPipeline, LoadPipelineState load_pipe_producer_state, Args&&...) {
    return load_pipe_producer_state;
  }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma, class TensorMapD>
  CUTLASS_DEVICE auto store(LoadPipeline, LoadPipelineState load_pipe_consumer_state, StorePipeline,
                            StorePipelineState store_pipe_producer_state, ProblemShapeMNKL problem_shape_mnkl,
                            TileShapeMNK, TileCoordMNKL tile_coord_mnkl, cute::Tensor<AccEngine, AccLayout> accumulators,
                            TiledMma, int thread_idx, TensorStorage& shared, TensorMapD const& store_tensormap,
                            int = -1) {
    using namespace cute;
    static_assert(size(TiledMma{}) == 256, "two consumer warpgroups");
    static_assert(decltype(size(accumulators))::value == cute::size<1>(CtaTileMNK{}) / 2,
                  "a thread's share of a 64-row slab: (value pair, row half, 8-column chunk)");
    auto [M, N, K, L] = problem_shape_mnkl;
    auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
    // the MMA's warpgroup (thread_idx is the kernel's mma_thread_idx): rows 64 wg .. 64 wg + 63 of the tile
    const int wg = thread_idx / cutlass::NumThreadsPerWarpGroup;
    const int t = thread_idx % cutlass::NumThreadsPerWarpGroup;
    Tensor mD = params_.tma_store_d.get_tma_tensor(append<3>(make_shape(M, N), Int<1>{}));  // (M, N, L)
    Tensor gD = local_tile(coalesce(mD, take<0, 2>(CtaTileMNK{})), take<0, 2>(CtaTileMNK{}),
                           append<3>(make_shape(m_coord, n_coord), Int<0>{}));  // (CTA_M, CTA_N)
    Tensor gD_epi = flat_divide(gD, EpilogueTile{});  // (64, EN, 2, CTA_N / EN)
    SmemElementD* buf = wg == 0 ? shared.base.collective.smem_D.begin() : shared.smem_D1.begin();
    // the swizzle in the layout (the buffers are aligned to its period), so sD.layout() gives element offsets
    Tensor sD = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(buf), SmemLayoutD{}));  // (64,EN,2)
    const uint32_t sD_addr = cast_smem_ptr_to_uint(buf);
    ThrCopy s2g = params_.tma_store_d.get_slice(Int<0>{});
    Tensor bSG_sD = s2g.partition_S(sD);
    Tensor bSG_gD = s2g.partition_D(gD_epi);
    const bool issuer = (t / cutlass::NumThreadsPerWarp) == 0 && cute::elect_one_sync();
    auto wg_sync = [&] { cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, wg); };
    // the m64nN accumulator fragment: value 4 j + 2 h + p is row r0 + 8 h, column 8 j + c0 + p
    const int lane = t % cutlass::NumThreadsPerWarp;
    const int r0 = 16 * (t / cutlass::NumThreadsPerWarp) + lane / 4;
    const int c0 = 2 * (lane % 4);
    constexpr int kChunks = kEpiN / 8;
    // one sub-tile's values into buffer b (the pair of a thread's values shares one 16-byte swizzle unit)
    auto write_buffer = [&](int s, int b) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kChunks; ++j) {
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int v = 4 * (s * kChunks + j) + 2 * h;
          const uint32_t dst = sD_addr + uint32_t(sizeof(SmemElementD)) *
                                             uint32_t(b * kBufElems + sD.layout()(r0 + 8 * h, 8 * j + c0, 0));
          if constexpr (cute::is_same_v<SmemElementD, float>) {
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dst), "f"(accumulators(v)), "f"(accumulators(v + 1)));
          } else {
            static_assert(cute::is_same_v<SmemElementD, cutlass::bfloat16_t>, "bf16 or fp32 output");
            __nv_bfloat162 pair = __floats2bfloat162_rn(accumulators(v), accumulators(v + 1));  // round to nearest
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(*reinterpret_cast<uint32_t*>(&pair)));
          }
        }
      }
      cutlass::arch::fence_view_async_shared();  // the writes, visible to the TMA unit
    };
    if constexpr (!kOneBarrier) {
      // two buffers, two barriers a sub-tile: the issuer waits for the other buffer's store after issuing this one's
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kSubTiles; ++s) {
        const int b = s % 2;
        write_buffer(s, b);
        wg_sync();
        if (issuer) {
          copy(params_.tma_store_d.with(store_tensormap), bSG_sD(_, _, _, b), bSG_gD(_, _, _, wg, s));
          tma_store_arrive();
          tma_store_wait<1>();  // the store from the other buffer has read it: it can be written again
        }
        wg_sync();
      }
    } else {
      // kBufs buffers in turn over the whole kernel (next_buf_ carries over tiles), one barrier a sub-tile: before it
      // the issuer waits until at most kBufs - 2 stores are unread, i.e. the store that last used the NEXT sub-tile's
      // buffer has read it, so after the barrier every thread may write that buffer. With three buffers that store
      // was issued two sub-tiles back (or a mainloop ago at a tile's start).
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kSubTiles; ++s) {
        const int b = next_buf_;
        next_buf_ = b + 1 == kBufs ? 0 : b + 1;
        write_buffer(s, b);
        if (issuer) tma_store_wait<kBufs - 2>();
        wg_sync();
        if (issuer) {
          copy(params_.tma_store_d.with(store_tensormap), bSG_sD(_, _, _, b), bSG_gD(_, _, _, wg, s));
          tma_store_arrive();
        }
      }
    }
    return cute::make_tuple(load_pipe_consumer_state, store_pipe_producer_state);
  }

 private:
  Params const& params_;  // the base keeps its own private
  int next_buf_ = 0;      // the buffer of this warpgroup's next sub-tile (kOneBarrier)
};

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

// ------------------------------------------------------------------------------------------------ prep kernels
// (non-template kernels are static: this header is included by one translation unit per output dtype)
__device__ __forceinline__ float e8m0_to_float(uint8_t s) {
  // 2^(s-127); 255 is the format's NaN; 0 is 2^-127 (an fp32 subnormal)
  if (s == 255) return __int_as_float(0x7fc00000);
  if (s == 0) return __int_as_float(0x00400000);
  return __int_as_float(int(s) << 23);
}

// First row (kRows) / token (kRed) of group e: the previous group's end; group 0 starts at *row_start when the call
// runs a later part of the groups (see GroupedProblem::row_start), else at 0.
__device__ __forceinline__ int64_t group_start(const GroupedProblem& p, int e) {
  return e ? int64_t(p.offs[e - 1]) : (p.row_start ? int64_t(*p.row_start) : 0);
}

__device__ __forceinline__ int group_of(const int32_t* offs, int E, int64_t m) {
  // first e with offs[e] > m (m < offs[E-1])
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    int mid = (lo + hi) >> 1;
    if (int64_t(offs[mid]) > m) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// The prep work of a call is ONE launch (prep_kernel below): its blocks split into consecutive ranges, one per task,
// so a call costs two launches (prep + GEMM) rather than five (each launch is host time and a gap on the stream).
// Every task only reads offs, the E8M0 scales and the problem; none reads what another writes.

// kRows, A scales: thread per row; for each 128-block kb writes SFA_g[kb][m - start] (coalesced across rows)
static __device__ __forceinline__ void sfa_rows(const GroupedProblem& p, float* sfa, int64_t block) {
  int64_t m = block * blockDim.x + threadIdx.x;
  if (p.groups == 0 || m >= p.M || m >= p.offs[p.groups - 1] || m < group_start(p, 0)) return;
  int g = group_of(p.offs, p.groups, m);
  int64_t start = group_start(p, g);
  int64_t mg = p.offs[g] - start;
  int64_t rb = p.R / 128;
  float* dst = sfa + rb * start + (m - start);
  const uint8_t* src = p.sa + m * p.sa_s0;
  for (int64_t kb = 0; kb < rb; ++kb) dst[kb * mg] = e8m0_to_float(src[kb * 4 * p.sa_s1]);
}

// kRows, B scales: SFB_e[kb][cb] = sb[e, cb * gran, kb * 4] (gran: the kernel's column granularity of SFB, 128 or
// 64; the E8M0 byte of a 128x128 tile is repeated on each of its rows, so a 64-column block reads its tile's byte)
static __device__ __forceinline__ void sfb_rows(const GroupedProblem& p, float* sfb, int64_t cb_n, int64_t gran,
                                                int64_t block) {
  int64_t i = block * blockDim.x + threadIdx.x;
  int64_t rb = p.R / 128;
  if (i >= int64_t(p.groups) * rb * cb_n) return;
  int64_t cb = i % cb_n, kb = (i / cb_n) % rb, e = i / (cb_n * rb);
  sfb[i] = e8m0_to_float(p.sb[e * p.sb_s0 + cb * gran * p.sb_s1 + kb * 4 * p.sb_s2]);
}

// kRed, A scales: SFA[tb][r] = sa[r, tb * 4] for every 128-token block tb (group g reads from tb = start / 128)
static __device__ __forceinline__ void sfa_red(const GroupedProblem& p, float* sfa, int64_t tb_n, int64_t block) {
  int64_t i = block * blockDim.x + threadIdx.x;
  if (i >= tb_n * p.rows) return;
  int64_t r = i % p.rows, tb = i / p.rows;
  sfa[i] = e8m0_to_float(p.sa[r * p.sa_s0 + tb * 4 * p.sa_s1]);
}

// kRed, B scales (128 x 128 tiles): SFB[tb][cb] = sb[cb * gran, tb * 4]
static __device__ __forceinline__ void sfb_red(const GroupedProblem& p, float* sfb, int64_t tb_n, int64_t cb_n,
                                               int64_t gran, int64_t block) {
  int64_t i = block * blockDim.x + threadIdx.x;
  if (i >= tb_n * cb_n) return;
  int64_t cb = i % cb_n, tb = i / cb_n;
  sfb[i] = e8m0_to_float(p.sb[cb * gran * p.sb_s1 + tb * 4 * p.sb_s2]);
}

// The two zero-fill tasks below run on every call but have work only in rare cases (padding rows, empty
// experts), which the host cannot see without a sync. They therefore get few, fixed blocks (kZeroBlocks per
// group at most), each striding over its rows: a grid sized for the whole output was thousands of blocks that
// only read offs and exit (up to ~50 us a call inside a training step).
constexpr int64_t kZeroBlocks = 64;

// Output rows at or after offs[E-1] (kRows): zeros. Block b of n takes rows lim + b, lim + b + n, ...
template <class T>
__device__ __forceinline__ void zero_tail_rows(const GroupedProblem& p, int64_t block, int64_t n) {
  int64_t lim = p.groups ? p.offs[p.groups - 1] : 0;
  T* out = static_cast<T*>(p.out);
  for (int64_t r = lim + block; r < p.M; r += n)
    for (int64_t c = threadIdx.x; c < p.C; c += blockDim.x) out[r * p.ldo + c] = T(0);
}

// Empty groups (kRed): dW[e] = 0, chunk `chunk` of `chunks` blocks per group; non-empty groups return at once.
template <class T>
__device__ __forceinline__ void zero_empty_group(const GroupedProblem& p, int e, int64_t chunk, int64_t chunks) {
  int64_t start = group_start(p, e);
  if (p.offs[e] - start != 0) return;
  T* out = static_cast<T*>(p.out) + int64_t(e) * p.out_group_stride;
  for (int64_t r = chunk; r < p.rows; r += chunks)
    for (int64_t c = threadIdx.x; c < p.C; c += blockDim.x) out[r * p.ldo + c] = T(0);
}

// Per-group CUTLASS arguments: thread e of the task's blocks (n_threads in all) handles group e. With lpt (kernel
// "cooperative_lpt", kRed) group e's arguments go to slot rank(e) = the number of groups with more tokens (ties:
// lower index first), so CUTLASS walks the groups longest reduction first (lpt_group_scheduler.h); the same task
// zeroes that scheduler's workspace.
template <class Shape3, class EA, class EB, class ED, class SA, class SB, class SD>
struct GroupArgs {
  Shape3* shapes; const EA** pa; const EB** pb; ED** pd; const float** psfa; const float** psfb;
  SA* sta; SB* stb; SD* std_; unsigned long long* sched_ws; int64_t sched_ws_words; bool lpt;
};

template <class Shape3, class EA, class EB, class ED, class SA, class SB, class SD>
__device__ __forceinline__ void build_group_args(const GroupedProblem& p, const float* sfa, const float* sfb,
                                                 int64_t cb_n, const GroupArgs<Shape3, EA, EB, ED, SA, SB, SD>& g,
                                                 int64_t e64, int64_t n_threads) {
  for (int64_t i = e64; i < g.sched_ws_words; i += n_threads) g.sched_ws[i] = 0;
  if (e64 >= p.groups) return;
  int e = int(e64);
  auto len = [&](int k) {
    int64_t n = p.offs[k] - group_start(p, k);
    return n < 0 ? int64_t(0) : n;  // malformed offs: no work rather than a wild pointer (the caller validates offs)
  };
  int64_t start = group_start(p, e);
  int64_t n = len(e);
  int slot = e;
  if (g.lpt && p.mode == kRed) {
    slot = 0;
    for (int k = 0; k < p.groups; ++k) {
      int64_t nk = len(k);
      slot += (nk > n) || (nk == n && k < e);
    }
  }
  const EA* a = static_cast<const EA*>(p.a);
  const EB* b = static_cast<const EB*>(p.b);
  ED* out = static_cast<ED*>(p.out);
  if (p.mode == kRows) {
    int64_t rb = p.R / 128;
    g.shapes[slot] = cute::make_shape(int(n), int(p.C), int(p.R));
    g.pa[slot] = a + start * p.lda;
    g.pb[slot] = b + e * p.b_group_stride;
    g.pd[slot] = out + start * p.ldo;
    g.psfa[slot] = sfa + rb * start;
    g.psfb[slot] = sfb + int64_t(e) * rb * cb_n;
  } else {
    g.shapes[slot] = cute::make_shape(n > 0 ? int(p.rows) : 0, int(p.C), int(n));
    g.pa[slot] = a + start;
    g.pb[slot] = b + start;
    g.pd[slot] = out + e * p.out_group_stride;
    g.psfa[slot] = sfa + (start / 128) * p.rows;
    g.psfb[slot] = sfb + (start / 128) * cb_n;
  }
  g.sta[slot] = SA{};
  cute::get<0>(g.sta[slot]) = p.lda;
  g.stb[slot] = SB{};
  cute::get<0>(g.stb[slot]) = p.ldb;
  g.std_[slot] = SD{};
  cute::get<0>(g.std_[slot]) = p.ldo;
}

// Blocks per task of one prep launch, in launch order (zero_chunks: kRed's blocks per group in the zero task).
struct PrepGrid {
  int64_t sfa = 0, sfb = 0, zero = 0, zero_chunks = 0, args = 0;
  int64_t total() const { return sfa + sfb + zero + args; }
};

template <class Shape3, class EA, class EB, class ED, class SA, class SB, class SD>
__global__ void prep_kernel(GroupedProblem p, PrepGrid grid, float* sfa, float* sfb, int64_t cb_n, int64_t cb_gran,
                            int64_t tb_n, GroupArgs<Shape3, EA, EB, ED, SA, SB, SD> args) {
  int64_t b = blockIdx.x;  // uniform over the block: every thread of a block takes the same task
  if (b < grid.sfa) {
    if (p.mode == kRows) sfa_rows(p, sfa, b); else sfa_red(p, sfa, tb_n, b);
    return;
  }
  b -= grid.sfa;
  if (b < grid.sfb) {
    if (p.mode == kRows) sfb_rows(p, sfb, cb_n, cb_gran, b); else sfb_red(p, sfb, tb_n, cb_n, cb_gran, b);
    return;
  }
  b -= grid.sfb;
  if (b < grid.zero) {
    if (p.mode == kRows) zero_tail_rows<ED>(p, b, grid.zero);
    else zero_empty_group<ED>(p, int(b / grid.zero_chunks), b % grid.zero_chunks, grid.zero_chunks);
    return;
  }
  b -= grid.zero;
  build_group_args(p, sfa, sfb, cb_n, args, b * blockDim.x + threadIdx.x, grid.args * blockDim.x);
}

// ------------------------------------------------------------------------------------------------ the GEMM
// Sched: a Schedule of grouped_problem.h. All: fp32 accumulation promoted every 128 of the reduction.

template <class ElementD, int Sched>
struct BlockwiseGrouped {
  static constexpr bool kLpt = is_lpt(Sched);
  static constexpr bool kWide = is_wide(Sched);
  // LptGroupProblemShape selects lpt_group_scheduler.h's dynamic scheduler; it is a GroupProblemShape otherwise
  using ProblemShape = cute::conditional_t<kLpt, LptGroupProblemShape,
                                           cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>>;
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using LayoutA = cutlass::layout::RowMajor;     // A [rows, red], red contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B as [cols, red], red contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr bool kPP = Sched == kPingpong;
  using TileShape = cute::conditional_t<
      kPP, cute::Shape<cute::_64, cute::_128, cute::_128>,
      cute::conditional_t<kWide, cute::Shape<cute::_128, cute::Int<kWideN>, cute::_128>,
                          cute::Shape<cute::_128, cute::_128, cute::_128>>>;
  using EpiSchedule = cute::conditional_t<kPP, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                          cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using MainSchedule = cute::conditional_t<kPP, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>;
  using ClusterShape = cute::conditional_t<
      Sched == kCoop2x1 || kWide, cute::Shape<cute::_2, cute::_1, cute::_1>,
      cute::conditional_t<Sched == kCoop1x1, cute::Shape<cute::_1, cute::_1, cute::_1>,
                          cute::Shape<cute::_1, cute::_2, cute::_1>>>;
  // SFB's column granularity: 128 (one scale per 128x128 weight tile) where the tile is 128 or 256 wide; a 192-wide
  // tile straddles two weight tiles, so it reads the same scales at 64 columns (three per tile)
  static constexpr int kSfbGranN = kWide && kWideN == 192 ? 64 : 128;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kSfbGranN, 128>;  // MN-major SFA / SFB
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

#ifdef TITAN_MX_EPI_CUTLASS
  static constexpr bool kEpiWg = false;
#else
  static constexpr bool kEpiWg = kWide && kWideN == 256;  // WarpgroupStoreEpilogue: 64x32 (bf16) / 64x16 (fp32)
#endif
  static constexpr int kEpiWgN = cute::is_same_v<ElementD, float> ? 16 : 32;  // 4 KB sub-tiles either way
  // 4 KB output buffers a warpgroup (session 37): three for bf16 output (4 stages still fit, 225,792 of 232,448 bytes
  // of shared memory; fprop/dgrad +0.1 to +1.4%), two for fp32 (its 16 sub-tiles a tile: 0.99-1.00x with three);
  // -DTITAN_MX_EPI_BUFS=N builds N for both, for A/B timing
#ifdef TITAN_MX_EPI_BUFS
  static constexpr int kEpiWgBufs = TITAN_MX_EPI_BUFS;
#else
  static constexpr int kEpiWgBufs = cute::is_same_v<ElementD, float> ? 2 : 3;
#endif
  using EpiTile = cute::conditional_t<
      kEpiWg, cute::Shape<cute::_64, cute::Int<kEpiWgN>>,
      // (-DTITAN_MX_EPI_CUTLASS, or the 128x192 tiles: CUTLASS's epilogue; kCoopLptN256x2 with fp32 output on
      // 128x16 sub-tiles, which made room for a fifth mainloop stage on 128x192 tiles, session 22; grouped_problem.h)
      cute::conditional_t<Sched == kCoopLptN256x2 && cute::is_same_v<ElementD, float>,
                          cute::Shape<cute::_128, cute::_16>, cutlass::epilogue::collective::EpilogueTileAuto>>;
  using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>;
  // CUTLASS's builder takes 128-row sub-tiles only for cooperative kernels; the 64-row ones are built from its parts
  // with the policy it would pick (4 / 2 buffers, 256 threads share a sub-tile's fragment, no smem reuse, no delay)
  using EpiWgPolicy = cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<
      4, kEpiWgBufs, 64 * kEpiWgN / 256, false, false, EpiSchedule::NumEpilogueWarpGroups>;
  using CutlassEpilogue = typename cute::conditional_t<
      kEpiWg,
      cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<TileShape, EpiTile, float, float, void, LayoutD*,
                                                                kAlignD, ElementD, LayoutD*, kAlignD, Fusion,
                                                                EpiWgPolicy>,
      cutlass::epilogue::collective::CollectiveBuilder<
          cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpiTile, float, float, void,
          LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, EpiSchedule, Fusion>>::CollectiveOp;
  using CollectiveEpilogue =
      cute::conditional_t<kEpiWg, WarpgroupStoreEpilogue<CutlassEpilogue>, CutlassEpilogue>;

  using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CutlassEpilogue::SharedStorage) +
                           sizeof(typename CollectiveEpilogue::TensorStorage) -
                           sizeof(typename CutlassEpilogue::TensorStorage))>,
      MainSchedule>::CollectiveOp;
#ifdef TITAN_MX_RELEASE_LATE
  using CollectiveMainloop = CutlassMainloop;
#else
  using CollectiveMainloop = ReleaseOnWaitMainloop<CutlassMainloop>;
#endif

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

  // Scratch: fp32 scales, per-group argument arrays, CUTLASS's workspace (TMA descriptors per SM).
  struct Carve {
    size_t sfa, sfb, shapes, pa, pb, pd, psfa, psfb, sta, stb, std_, sched, ws, total;
    int64_t sfa_n, sfb_n, cb_n, tb_n, sched_words;
  };

  static Carve carve(const GroupedProblem& p, size_t ws_bytes, int sm_count) {
    Carve c{};
    int E = p.groups;
    c.cb_n = cdiv(p.C, kSfbGranN);
    if (p.mode == kRows) {
      c.sfa_n = p.M * (p.R / 128);
      c.sfb_n = int64_t(E) * (p.R / 128) * c.cb_n;
    } else {
      c.tb_n = cdiv(p.M, 128);
      c.sfa_n = c.tb_n * p.rows;
      c.sfb_n = c.tb_n * c.cb_n;
    }
    size_t o = 0;
    c.sfa = o; o = align_up(o + sizeof(float) * size_t(c.sfa_n));
    c.sfb = o; o = align_up(o + sizeof(float) * size_t(c.sfb_n));
    c.shapes = o; o = align_up(o + sizeof(Shape3) * E);
    c.pa = o; o = align_up(o + sizeof(void*) * E);
    c.pb = o; o = align_up(o + sizeof(void*) * E);
    c.pd = o; o = align_up(o + sizeof(void*) * E);
    c.psfa = o; o = align_up(o + sizeof(void*) * E);
    c.psfb = o; o = align_up(o + sizeof(void*) * E);
    c.sta = o; o = align_up(o + sizeof(StrideA) * E);
    c.stb = o; o = align_up(o + sizeof(StrideB) * E);
    c.std_ = o; o = align_up(o + sizeof(StrideD) * E);
    c.sched_words = kLpt ? int64_t(lpt_workspace_words(sm_count)) : 0;
    c.sched = o; o = align_up(o + sizeof(unsigned long long) * size_t(c.sched_words));
    c.ws = o; o = align_up(o + ws_bytes);
    c.total = o;
    return c;
  }

  static typename Gemm::Arguments arguments(const GroupedProblem& p, char* base, const Carve& c, int sm_count) {
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = sm_count;
    ProblemShape shapes;
    shapes.num_groups = p.groups;
    shapes.problem_shapes = reinterpret_cast<Shape3*>(base + c.shapes);
    shapes.host_problem_shapes = nullptr;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        shapes,
        {reinterpret_cast<const ElementA**>(base + c.pa), reinterpret_cast<StrideA*>(base + c.sta),
         reinterpret_cast<const ElementB**>(base + c.pb), reinterpret_cast<StrideB*>(base + c.stb),
         reinterpret_cast<const float**>(base + c.psfa), nullptr,
         reinterpret_cast<const float**>(base + c.psfb), nullptr},
        {{}, nullptr, nullptr, reinterpret_cast<ElementD**>(base + c.pd), reinterpret_cast<StrideD*>(base + c.std_)},
        hw};
    using RasterOrder = decltype(args.scheduler.raster_order);
    args.scheduler.raster_order = p.raster_along_n ? RasterOrder::AlongN : RasterOrder::AlongM;
    args.scheduler.max_swizzle_size = p.max_swizzle;
    if constexpr (kLpt) args.scheduler.workspace = reinterpret_cast<unsigned long long*>(base + c.sched);
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;
    fusion.beta = 0.0f;
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
    return args;
  }

  static size_t scratch_bytes(const GroupedProblem& p, int sm_count) {
    Carve c0 = carve(p, 0, sm_count);
    auto args = arguments(p, nullptr, c0, sm_count);
    size_t ws = Gemm::get_workspace_size(args);
    return carve(p, ws, sm_count).total;
  }

  // Returns nullptr on success, else a message (static storage).
  static const char* run(const GroupedProblem& p, void* scratch, size_t scratch_size, int sm_count,
                         cudaStream_t stream) {
    static thread_local char msg[256];
    if (p.groups <= 0) return nullptr;
    Carve c0 = carve(p, 0, sm_count);
    size_t ws = Gemm::get_workspace_size(arguments(p, nullptr, c0, sm_count));
    Carve c = carve(p, ws, sm_count);
    if (scratch_size < c.total) {
      snprintf(msg, sizeof msg, "scratch of %zu bytes < %zu needed", scratch_size, c.total);
      return msg;
    }
    char* base = static_cast<char*>(scratch);
    float* sfa = reinterpret_cast<float*>(base + c.sfa);
    float* sfb = reinterpret_cast<float*>(base + c.sfb);
    const int T = 256;
    PrepGrid grid;
    if (p.mode == kRows) {
      grid.sfa = p.M > 0 ? cdiv(p.M, T) : 0;
      grid.sfb = cdiv(c.sfb_n, T);
      grid.zero = (p.M > 0 && p.zero_tail) ? (p.M < kZeroBlocks ? p.M : kZeroBlocks) : 0;
    } else {
      grid.sfa = cdiv(c.sfa_n, T);
      grid.sfb = cdiv(c.sfb_n, T);
      grid.zero_chunks = p.rows < kZeroBlocks ? p.rows : kZeroBlocks;
      grid.zero = (grid.zero_chunks > 0 && p.C > 0) ? grid.zero_chunks * p.groups : 0;
    }
    grid.args = cdiv(p.groups, T);
    GroupArgs<Shape3, ElementA, ElementB, ElementD, StrideA, StrideB, StrideD> group_args{
        reinterpret_cast<Shape3*>(base + c.shapes), reinterpret_cast<const ElementA**>(base + c.pa),
        reinterpret_cast<const ElementB**>(base + c.pb), reinterpret_cast<ElementD**>(base + c.pd),
        reinterpret_cast<const float**>(base + c.psfa), reinterpret_cast<const float**>(base + c.psfb),
        reinterpret_cast<StrideA*>(base + c.sta), reinterpret_cast<StrideB*>(base + c.stb),
        reinterpret_cast<StrideD*>(base + c.std_), reinterpret_cast<unsigned long long*>(base + c.sched),
        c.sched_words, kLpt};
    prep_kernel<<<unsigned(grid.total()), T, 0, stream>>>(p, grid, sfa, sfb, c.cb_n, kSfbGranN, c.tb_n,
                                                          group_args);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      snprintf(msg, sizeof msg, "prep kernels: %s", cudaGetErrorString(err));
      return msg;
    }
    Gemm gemm;
    auto args = arguments(p, base, c, sm_count);
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess) {
      snprintf(msg, sizeof msg, "CUTLASS can_implement: %s", cutlass::cutlassGetStatusString(st));
      return msg;
    }
    st = gemm.initialize(args, base + c.ws, stream);
    if (st != cutlass::Status::kSuccess) {
      snprintf(msg, sizeof msg, "CUTLASS initialize: %s", cutlass::cutlassGetStatusString(st));
      return msg;
    }
    st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess) {
      err = cudaGetLastError();
      snprintf(msg, sizeof msg, "CUTLASS run: %s (%s)", cutlass::cutlassGetStatusString(st), cudaGetErrorString(err));
      return msg;
    }
    return nullptr;
  }
};

}  // namespace titan_mx

// -DTITAN_MX_ONLY_DEFAULT_KERNEL (variant builds for A/B timing, cutlass_backend.load_variant): only the default
// kernel (cooperative_lpt_n256_2x1) is instantiated; the others' entry points return an error and compile in seconds.
#ifdef TITAN_MX_ONLY_DEFAULT_KERNEL
constexpr bool kBuildAllKernels = false;
#else
constexpr bool kBuildAllKernels = true;
#endif
namespace titan_mx {
template <class Element, int Sched>
size_t scratch_bytes_entry(const GroupedProblem& p, int sm_count) {
  if constexpr (kBuildAllKernels || Sched == kCoopLptN256x2) return BlockwiseGrouped<Element, Sched>::scratch_bytes(p, sm_count);
  else return 0;
}
template <class Element, int Sched>
const char* run_entry(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s) {
  if constexpr (kBuildAllKernels || Sched == kCoopLptN256x2) return BlockwiseGrouped<Element, Sched>::run(p, scratch, bytes, sm_count, s);
  else return "this kernel is not built in a -DTITAN_MX_ONLY_DEFAULT_KERNEL variant";
}
}  // namespace titan_mx

// One (output dtype, kernel) pair per translation unit (blockwise_grouped_<DT>_<TU>.cu), so the build compiles
// them in parallel; these are the entry points grouped_problem.h declares.
#define TITAN_MX_INSTANTIATE(DT, ELEMENT, TU, SCHED)                                                        \
  namespace titan_mx {                                                                                       \
  size_t scratch_bytes_##DT##_##TU(const GroupedProblem& p, int sm_count) {                                  \
    return scratch_bytes_entry<ELEMENT, SCHED>(p, sm_count);                                                 \
  }                                                                                                          \
  const char* run_##DT##_##TU(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count,            \
                              cudaStream_t s) {                                                              \
    return run_entry<ELEMENT, SCHED>(p, scratch, bytes, sm_count, s);                                        \
  }                                                                                                          \
  }
