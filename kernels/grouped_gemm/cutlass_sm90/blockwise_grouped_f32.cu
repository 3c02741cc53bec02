// fp32 output (wgrad). One translation unit per output type so the two compile in parallel.
#include "blockwise_grouped.cuh"

namespace titan_mx {
size_t scratch_bytes_f32(const GroupedProblem& p, int sm_count) {
  return BlockwiseGrouped<float>::scratch_bytes(p, sm_count);
}
const char* run_f32(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s) {
  return BlockwiseGrouped<float>::run(p, scratch, bytes, sm_count, s);
}
}  // namespace titan_mx
