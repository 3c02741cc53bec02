// bf16 output, the cooperative_n256_2x1 kernel (grouped_problem.h); one pair per translation unit.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(bf16, cutlass::bfloat16_t, coopn256x2, titan_mx::kCoopN256x2)
