// bf16 output, the coop1x1 kernel (grouped_problem.h); one pair per translation unit so the build runs them in parallel.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(bf16, cutlass::bfloat16_t, coop1x1, titan_mx::kCoop1x1)
