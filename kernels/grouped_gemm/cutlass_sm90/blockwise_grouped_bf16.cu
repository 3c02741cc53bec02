// bf16 output (fprop, dgrad). One translation unit per output type so the two compile in parallel.
#include "blockwise_grouped.cuh"

namespace titan_mx {
size_t scratch_bytes_bf16(const GroupedProblem& p, int sm_count) {
  return BlockwiseGrouped<cutlass::bfloat16_t>::scratch_bytes(p, sm_count);
}
const char* run_bf16(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s) {
  return BlockwiseGrouped<cutlass::bfloat16_t>::run(p, scratch, bytes, sm_count, s);
}
}  // namespace titan_mx
