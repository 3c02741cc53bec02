// bf16 output, the cooperative_n192_2x1 kernel (grouped_problem.h); one pair per translation unit.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(bf16, cutlass::bfloat16_t, coopn192x2, titan_mx::kCoopN192x2)
