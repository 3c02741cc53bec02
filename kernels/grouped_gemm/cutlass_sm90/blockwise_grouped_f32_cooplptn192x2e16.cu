// fp32 output, the cooperative_lpt_n192_2x1_epi16 kernel (grouped_problem.h); one pair per translation unit.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(f32, float, cooplptn192x2e16, titan_mx::kCoopLptN192x2E16)
