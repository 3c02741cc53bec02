// bf16 output, the pp kernel (grouped_problem.h); one pair per translation unit so the build runs them in parallel.
#include "blockwise_grouped.cuh"

TITAN_MX_INSTANTIATE(bf16, cutlass::bfloat16_t, pp, titan_mx::kPingpong)
