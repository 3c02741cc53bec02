// One (output dtype, kernel) instantiation per translation unit, so the build compiles them in parallel.
#include "blockwise_grouped.cuh"

namespace titan_mx {
size_t scratch_bytes_bf16_coop1x1(const GroupedProblem& p, int sm_count) {
  return BlockwiseGrouped<cutlass::bfloat16_t, kCoop1x1>::scratch_bytes(p, sm_count);
}
const char* run_bf16_coop1x1(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s) {
  return BlockwiseGrouped<cutlass::bfloat16_t, kCoop1x1>::run(p, scratch, bytes, sm_count, s);
}
}  // namespace titan_mx
