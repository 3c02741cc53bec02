// fp32 output, the cooperative_n256_2x1 kernel (grouped_problem.h); one pair per translation unit.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(f32, float, coopn256x2, titan_mx::kCoopN256x2)
