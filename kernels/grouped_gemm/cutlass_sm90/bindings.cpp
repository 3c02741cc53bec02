// torch side of the CUTLASS mx128 grouped GEMM: tensors -> GroupedProblem, scratch from torch's caching
// allocator, launch on the current stream. Shape/dtype checks with names live in Python
// (kernels/grouped_gemm/cutlass_backend.py); the TORCH_CHECKs here only guard the raw-pointer contract.
#include <torch/extension.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "grouped_problem.h"

namespace {

int sm_count_of(int device) {
  static int cached[64] = {0};
  if (device < 64 && cached[device]) return cached[device];
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) cached[device] = n;
  return n;
}

using ScratchFn = size_t (*)(const titan_mx::GroupedProblem&, int);
using RunFn = const char* (*)(const titan_mx::GroupedProblem&, void*, size_t, int, cudaStream_t);
// [schedule][f32 output]
constexpr ScratchFn kScratch[titan_mx::kNumSchedules][2] = {
    {titan_mx::scratch_bytes_bf16_coop, titan_mx::scratch_bytes_f32_coop},
    {titan_mx::scratch_bytes_bf16_pp, titan_mx::scratch_bytes_f32_pp},
    {titan_mx::scratch_bytes_bf16_coop2x1, titan_mx::scratch_bytes_f32_coop2x1},
    {titan_mx::scratch_bytes_bf16_coop1x1, titan_mx::scratch_bytes_f32_coop1x1},
    {titan_mx::scratch_bytes_bf16_cooplpt, titan_mx::scratch_bytes_f32_cooplpt}};
constexpr RunFn kRun[titan_mx::kNumSchedules][2] = {
    {titan_mx::run_bf16_coop, titan_mx::run_f32_coop},
    {titan_mx::run_bf16_pp, titan_mx::run_f32_pp},
    {titan_mx::run_bf16_coop2x1, titan_mx::run_f32_coop2x1},
    {titan_mx::run_bf16_coop1x1, titan_mx::run_f32_coop1x1},
    {titan_mx::run_bf16_cooplpt, titan_mx::run_f32_cooplpt}};

// config (kernels/grouped_gemm/cutlass_backend.py packs it): bits 0-3 the Schedule, bit 4 raster along N,
// bits 8-11 log2 of the tile swizzle.
void launch(titan_mx::GroupedProblem& p, const torch::Tensor& like, bool f32, int64_t config) {
  int64_t sched = config & 15, swizzle_log2 = (config >> 8) & 15;
  TORCH_CHECK(sched < titan_mx::kNumSchedules && swizzle_log2 <= 3 && (config & ~int64_t(0xf1f)) == 0,
              "cutlass mx128: kernel config ", config, " unknown");
  p.raster_along_n = int((config >> 4) & 1);
  p.max_swizzle = 1 << swizzle_log2;
  // torch's SM carve-out (torch._C._set_sm_carveout_experimental, [comm] matmul_sm_carveout): like torch's own
  // persistent GEMMs, leave that many SMs free so NCCL's CTAs run beside this persistent kernel. The grid stays
  // a whole number of 2-CTA clusters (an odd count, or one SM, fails inside CUTLASS with "Error Internal").
  int sm = sm_count_of(like.get_device());
  if (auto carveout = at::globalContext()._SMCarveout_EXPERIMENTAL(); carveout.has_value()) {
    TORCH_CHECK(*carveout >= 0 && sm - *carveout >= 2, "cutlass mx128: an SM carve-out of ", *carveout,
                " leaves fewer than 2 of this GPU's ", sm, " SMs");
    sm = (sm - *carveout) / 2 * 2;
  }
  size_t bytes = kScratch[sched][f32](p, sm);
  auto scratch = torch::empty({int64_t(bytes)}, like.options().dtype(torch::kUInt8));
  auto stream = c10::cuda::getCurrentCUDAStream(like.get_device()).stream();
  const char* err = kRun[sched][f32](p, scratch.data_ptr(), bytes, sm, stream);
  TORCH_CHECK(err == nullptr, "titan_fp8 CUTLASS mx128 grouped GEMM: ", err ? err : "");
}

void check_common(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.is_cuda() && t.dim() == dim, "cutlass mx128: ", name, " must be a ", dim, "-D CUDA tensor");
}

}  // namespace

// out[M, C] (bf16) = per group: a[rows of g] @ b[g]^T. a [M, R] fp8 (R contiguous), sa [M, R/32] uint8 (strided),
// b [G, C, R] fp8 (R contiguous), sb [G, C, R/32] uint8 (strided): the G experts first_group .. first_group + G - 1
// of offs int32 [E]; only their rows of out are written (and the zero rows past offs[E-1] when the part holds the
// last group), so parts of the experts can run one after the other into one out; config: see launch.
void grouped_rows(torch::Tensor a, torch::Tensor sa, torch::Tensor b, torch::Tensor sb, torch::Tensor offs,
                  torch::Tensor out, int64_t config, int64_t first_group) {
  check_common(a, "a", 2); check_common(sa, "sa", 2); check_common(b, "b", 3); check_common(sb, "sb", 3);
  check_common(offs, "offs", 1); check_common(out, "out", 2);
  TORCH_CHECK(a.stride(1) == 1 && b.stride(2) == 1 && out.stride(1) == 1,
              "cutlass mx128: inner dims must be contiguous");
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16, "cutlass mx128: fprop/dgrad output must be bf16");
  c10::cuda::CUDAGuard guard(a.get_device());
  titan_mx::GroupedProblem p;
  p.mode = titan_mx::kRows;
  int64_t groups = b.size(0);
  TORCH_CHECK(first_group >= 0 && first_group + groups <= offs.size(0), "cutlass mx128: experts ", first_group,
              "..", first_group + groups - 1, " are not among offs' ", offs.size(0));
  p.groups = int(groups);
  p.offs = offs.data_ptr<int32_t>() + first_group;
  p.row_start = first_group > 0 ? offs.data_ptr<int32_t>() + first_group - 1 : nullptr;
  p.zero_tail = first_group + groups == offs.size(0);
  p.M = a.size(0); p.R = a.size(1); p.C = b.size(1);
  p.a = a.data_ptr(); p.lda = a.stride(0);
  p.b = b.data_ptr(); p.ldb = b.stride(1); p.b_group_stride = b.stride(0);
  p.sa = sa.data_ptr<uint8_t>(); p.sa_s0 = sa.stride(0); p.sa_s1 = sa.stride(1);
  p.sb = sb.data_ptr<uint8_t>(); p.sb_s0 = sb.stride(0); p.sb_s1 = sb.stride(1); p.sb_s2 = sb.stride(2);
  p.out = out.data_ptr(); p.ldo = out.stride(0);
  launch(p, a, false, config);
}

// out[E, N, C] (fp32 or bf16) = per group: x[:, tokens of g] @ y[:, tokens of g]^T. x [N, T] fp8, sx [N, T/32] uint8,
// y [C, T] fp8, sy [C, T/32] uint8 (tokens contiguous in x and y), offs int32 [E] (multiples of 128).
void grouped_red(torch::Tensor x, torch::Tensor sx, torch::Tensor y, torch::Tensor sy, torch::Tensor offs,
                 torch::Tensor out, int64_t config) {
  check_common(x, "x", 2); check_common(sx, "sx", 2); check_common(y, "y", 2); check_common(sy, "sy", 2);
  check_common(offs, "offs", 1); check_common(out, "out", 3);
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && out.stride(2) == 1,
              "cutlass mx128: inner dims must be contiguous");
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 || out.scalar_type() == torch::kBFloat16,
              "cutlass mx128: wgrad output must be fp32 or bf16");
  c10::cuda::CUDAGuard guard(x.get_device());
  titan_mx::GroupedProblem p;
  p.mode = titan_mx::kRed;
  p.groups = int(offs.size(0));
  p.offs = offs.data_ptr<int32_t>();
  p.M = x.size(1); p.rows = x.size(0); p.C = y.size(0);
  p.a = x.data_ptr(); p.lda = x.stride(0);
  p.b = y.data_ptr(); p.ldb = y.stride(0);
  p.sa = sx.data_ptr<uint8_t>(); p.sa_s0 = sx.stride(0); p.sa_s1 = sx.stride(1);
  p.sb = sy.data_ptr<uint8_t>(); p.sb_s1 = sy.stride(0); p.sb_s2 = sy.stride(1);
  p.out = out.data_ptr(); p.ldo = out.stride(1); p.out_group_stride = out.stride(0);
  launch(p, x, out.scalar_type() == torch::kFloat32, config);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("grouped_rows", &grouped_rows, "mx128 grouped GEMM, groups along rows (fprop/dgrad), bf16 out");
  m.def("grouped_red", &grouped_red, "mx128 grouped GEMM, groups along the reduction (wgrad), fp32 or bf16 out");
}
