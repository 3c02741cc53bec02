// A dynamic tile scheduler for CUTLASS 4.2's sm_90 ptr-array grouped GEMM (kernel "cooperative_lpt").
//
// Why: the stock grouped scheduler is static; CTA (cluster) c takes tiles c, c + grid, c + 2 grid, ... That is
// balanced when every tile costs the same (fprop/dgrad: every tile reduces over K), but in wgrad a tile costs its
// group's token count. With one expert at 4x the mean its 704 output tiles (llama_up) each cost 4x the others',
// 704 = 5 x 132 + 44 on an H100, so 44 CTAs take a sixth long tile and, with the static stride, the same 44 also
// take the one tile more at the end: the busiest CTA carries ~6% over the mean (session 14, llama_up skewed wgrad
// 1.291x bf16 against 1.406x even).
//
// What: the groups come longest reduction first (the prep kernel sorts them, kRed), the first wave of tiles is
// the static one, and every later tile is handed out from one global ticket counter (atomicAdd) by whichever
// cluster asks first: longest-processing-time-first list scheduling, so no CTA ends more than about one short
// tile after the others.
//
// How it plugs in: the kernel's scheduler warp is the only caller of advance_to_next_work and pushes each work
// tile to the other warps through the scheduler pipeline, so a dynamic choice there stays consistent inside a
// CTA. The CTAs of a cluster must work on the same tile (A is multicast): rank 0 of each cluster takes the
// ticket and posts it, tagged with its sequence number, in a per-cluster mailbox in global memory that the
// other ranks poll. Rank 0 can run at most its scheduler pipeline's depth (plus the tile in flight) ahead of its
// own consumers, and those wait on the other ranks' multicast loads, so kMailboxSlots = 32 slots never wrap onto
// an unread ticket. The counter and mailboxes are zeroed by the prep kernel (blockwise_grouped.cuh) before every launch.
//
// The stock kernel takes its scheduler from detail::TileSchedulerSelector<GroupScheduler, Sm90, ..., ProblemShape>;
// a problem-shape type of our own (LptGroupProblemShape, a GroupProblemShape in every other respect) selects this
// scheduler through the partial specialization at the end of this file and leaves every other kernel untouched.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/sm90_tile_scheduler_group.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace titan_mx {

struct LptGroupProblemShape : cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>> {};

constexpr int kMailboxSlots = 32;

// Scheduler workspace: [0] the ticket counter, then kMailboxSlots 64-bit slots per cluster (tag << 40 | ticket).
inline size_t lpt_workspace_words(int sm_count) { return 1 + size_t(sm_count) * kMailboxSlots; }

template <int Stages>
class LptGroupScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<LptGroupProblemShape, Stages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<LptGroupProblemShape, Stages>;

 public:
  using typename Base::WorkTileInfo;
  using typename Base::SchedulerResponse;

  struct Arguments : Base::Arguments {
    unsigned long long* workspace = nullptr;  // lpt_workspace_words(sm_count) words, zeroed before the launch
  };
  struct Params : Base::Params {
    unsigned long long* workspace = nullptr;
  };

  template <class TileShape, class ClusterShape>
  static Params to_underlying_arguments(LptGroupProblemShape problem_shapes, TileShape tile_shape,
                                        ClusterShape cluster_shape, cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params params;
    static_cast<typename Base::Params&>(params) = Base::to_underlying_arguments(
        problem_shapes, tile_shape, cluster_shape, hw_info, arguments, workspace, epilogue_subtile,
        ktile_start_alignment_count);
    params.workspace = arguments.workspace;
    return params;
  }

  static bool can_implement(Arguments const& args) { return args.workspace != nullptr; }

  LptGroupScheduler() = default;

  CUTLASS_DEVICE LptGroupScheduler(Params const& params, SchedulerResponse* response_ptr)
      : Base(params, response_ptr), workspace_(params.workspace) {
#if defined(__CUDA_ARCH__)
    // the CTA's first (static) tile index, as the base class computes it: the CTAs of a cluster are consecutive
    uint64_t first = params.raster_order_ == Base::RasterOrder::AlongN
                         ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x)
                         : uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    cluster_size_ = uint32_t(params.cluster_shape_.m() * params.cluster_shape_.n());
    rank_ = uint32_t(first % cluster_size_);
    cluster_ = uint32_t(first / cluster_size_);
    clusters_ = uint32_t(uint64_t(gridDim.x) * gridDim.y * gridDim.z / cluster_size_);
#endif
  }

  // Called by the scheduler warp only (all 32 lanes): the next tile of this CTA, pushed to the other warps.
  template <typename TileSchedulerPipeline, typename TileSchedulerPipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(TileSchedulerPipeline& scheduler_pipeline,
                                           TileSchedulerPipelineState scheduler_pipe_producer_state,
                                           uint32_t /*advance_count*/ = 1) {
    unsigned long long ticket = 0;
    if (cutlass::canonical_lane_idx() == 0) {
      volatile unsigned long long* slot = workspace_ + 1 + size_t(cluster_) * kMailboxSlots + seq_ % kMailboxSlots;
      unsigned long long tag = (unsigned long long)(seq_ + 1) << 40;
      if (rank_ == 0) {
        ticket = atomicAdd(workspace_, 1ull);
        if (cluster_size_ > 1) *slot = tag | ticket;
      } else {
        unsigned long long v;
        while (((v = *slot) >> 40) != (seq_ + 1)) __nanosleep(64);
        ticket = v & ((1ull << 40) - 1);
      }
    }
    ticket = __shfl_sync(0xffffffff, ticket, 0);
    ++seq_;
    // tickets number the tiles after the first wave; this CTA's share of cluster tile (clusters_ + ticket)
    uint64_t linear = (uint64_t(clusters_) + ticket) * cluster_size_ + rank_;
    auto work_tile = this->get_current_work_for_linear_idx(linear);
    scheduler_pipeline.producer_acquire(scheduler_pipe_producer_state);
    if (cute::elect_one_sync()) {
      this->response_ptr_[scheduler_pipe_producer_state.index()] = work_tile;
      cutlass::arch::fence_view_async_shared();
      scheduler_pipeline.producer_commit(scheduler_pipe_producer_state);
    }
    return cute::make_tuple(work_tile, true);
  }

 private:
  unsigned long long* workspace_ = nullptr;
  uint32_t cluster_size_ = 1, rank_ = 0, cluster_ = 0, clusters_ = 0;
  uint32_t seq_ = 0;
};

}  // namespace titan_mx

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, SchedulerPipelineStageCount,
                             titan_mx::LptGroupProblemShape> {
  using Scheduler = titan_mx::LptGroupScheduler<SchedulerPipelineStageCount>;
};

}  // namespace cutlass::gemm::kernel::detail
