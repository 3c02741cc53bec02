// bf16 output, the cooperative_lpt kernel (grouped_problem.h, lpt_group_scheduler.h); one pair per translation unit.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(bf16, cutlass::bfloat16_t, cooplpt, titan_mx::kCoopLpt)
