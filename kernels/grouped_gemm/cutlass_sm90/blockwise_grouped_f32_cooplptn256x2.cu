// fp32 output, the cooperative_lpt_n256_2x1 kernel (grouped_problem.h); one pair per translation unit.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(f32, float, cooplptn256x2, titan_mx::kCoopLptN256x2)
