// torch side of the CUTLASS mx128 grouped GEMM: tensors -> GroupedProblem, scratch from torch's caching
// allocator, launch on the current stream. Shape/dtype checks with names live in Python
// (kernels/grouped_gemm/cutlass_backend.py); the TORCH_CHECKs here only guard the raw-pointer contract.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "grouped_problem.h"
#include "wt_tile_quant.h"

namespace {

int sm_count_of(int device) {
  static int cached[64] = {0};
  if (device < 64 && cached[device]) return cached[device];
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) cached[device] = n;
  return n;
}

// SMs the persistent grid may use: all, less torch's SM carve-out (torch._C._set_sm_carveout_experimental, [comm]
// matmul_sm_carveout), which, like torch's own persistent GEMMs, leaves that many SMs free so NCCL's CTAs run beside
// this kernel; rounded down to whole 2-CTA clusters (an odd count, or one SM, fails inside CUTLASS with "Error
// Internal"), and never below one cluster. A carve-out leaving fewer than 2 SMs is an error the callers raise
// before they get here: [comm] matmul_sm_carveout is checked at start-up ([0, 64]) and cutlass_backend's wrappers
// raise ValueError for an eager call. Not thrown here: on the GPU image (torch 2.11) throwing that error from this
// function crashed the process, eager and compiled, op or pybind call alike, while other errors thrown from the same
// op kernels reached Python (benchmarks/op_error_probe.py, benchmarks/results/issue9_host_s16/call7_error_probe/;
// not understood). A compiled graph run under such a carve-out, set later through torch's private API, uses one
// cluster.
int grid_sms(int device) {
  int sm = sm_count_of(device);
  if (auto carveout = at::globalContext()._SMCarveout_EXPERIMENTAL(); carveout.has_value()) {
    int left = sm - std::max<int>(*carveout, 0);
    sm = left < 2 ? 2 : left / 2 * 2;
  }
  return sm;
}

using ScratchFn = size_t (*)(const titan_mx::GroupedProblem&, int);
using RunFn = const char* (*)(const titan_mx::GroupedProblem&, void*, size_t, int, cudaStream_t);
// [schedule][f32 output]
constexpr ScratchFn kScratch[titan_mx::kNumSchedules][2] = {
    {titan_mx::scratch_bytes_bf16_coop, titan_mx::scratch_bytes_f32_coop},
    {titan_mx::scratch_bytes_bf16_pp, titan_mx::scratch_bytes_f32_pp},
    {titan_mx::scratch_bytes_bf16_coop2x1, titan_mx::scratch_bytes_f32_coop2x1},
    {titan_mx::scratch_bytes_bf16_coop1x1, titan_mx::scratch_bytes_f32_coop1x1},
    {titan_mx::scratch_bytes_bf16_cooplpt, titan_mx::scratch_bytes_f32_cooplpt},
    {titan_mx::scratch_bytes_bf16_coopn256x2, titan_mx::scratch_bytes_f32_coopn256x2},
    {titan_mx::scratch_bytes_bf16_cooplptn256x2, titan_mx::scratch_bytes_f32_cooplptn256x2}};
constexpr RunFn kRun[titan_mx::kNumSchedules][2] = {
    {titan_mx::run_bf16_coop, titan_mx::run_f32_coop},
    {titan_mx::run_bf16_pp, titan_mx::run_f32_pp},
    {titan_mx::run_bf16_coop2x1, titan_mx::run_f32_coop2x1},
    {titan_mx::run_bf16_coop1x1, titan_mx::run_f32_coop1x1},
    {titan_mx::run_bf16_cooplpt, titan_mx::run_f32_cooplpt},
    {titan_mx::run_bf16_coopn256x2, titan_mx::run_f32_coopn256x2},
    {titan_mx::run_bf16_cooplptn256x2, titan_mx::run_f32_cooplptn256x2}};
// each row sits at its Schedule's index
static_assert(kRun[titan_mx::kCooperative][0] == titan_mx::run_bf16_coop && kRun[titan_mx::kPingpong][0] ==
              titan_mx::run_bf16_pp && kRun[titan_mx::kCoop2x1][0] == titan_mx::run_bf16_coop2x1 &&
              kRun[titan_mx::kCoop1x1][0] == titan_mx::run_bf16_coop1x1 && kRun[titan_mx::kCoopLpt][1] ==
              titan_mx::run_f32_cooplpt && kRun[titan_mx::kCoopN256x2][1] == titan_mx::run_f32_coopn256x2 &&
              kScratch[titan_mx::kCoopN256x2][0] == titan_mx::scratch_bytes_bf16_coopn256x2 &&
              kRun[titan_mx::kCoopLptN256x2][1] == titan_mx::run_f32_cooplptn256x2 &&
              kScratch[titan_mx::kCoopLptN256x2][0] == titan_mx::scratch_bytes_bf16_cooplptn256x2,
              "kScratch / kRun rows out of Schedule order");

// config (kernels/grouped_gemm/cutlass_backend.py packs it): bits 0-3 the Schedule, bit 4 raster along N,
// bits 8-11 log2 of the tile swizzle.
void launch(titan_mx::GroupedProblem& p, const torch::Tensor& like, bool f32, int64_t config) {
  int64_t sched = config & 15, swizzle_log2 = (config >> 8) & 15;
  TORCH_CHECK(sched < titan_mx::kNumSchedules && swizzle_log2 <= 3 && (config & ~int64_t(0xf1f)) == 0,
              "cutlass mx128: kernel config ", config, " unknown");
  p.raster_along_n = int((config >> 4) & 1);
  p.max_swizzle = 1 << swizzle_log2;
  int sm = grid_sms(like.get_device());
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

// ------------------------------------------------------------------------------------------ the torch ops
// CUDA kernels of the ops kernels/grouped_gemm/cutlass_backend.py defines (titan_fp8::mx128_grouped_mm_*_cutlass):
// a compiled graph calls them through the dispatcher straight into C++, with no Python per call. As Python custom ops
// they cost ~80 us of host time a call, ~40 of it the C++ below (then five launches a call, now two: ~27 us);
// as these ops ~30 us (benchmarks/results/issue9_host_s16/, NOTE.md).
// The kernel configuration is resolved per call, as the Python ops did: $TITAN_FP8_CUTLASS_SCHEDULE is read on each
// call, and whenever its value differs from the last one seen, the Python resolver cutlass_backend registered
// (set_schedule_resolver) turns it into (kernel/swizzle bits, raster) per pass; raster "auto" picks along N where a
// group's output has more row tiles than column tiles (cutlass_backend.config_id's rule).
namespace {

std::mutex g_schedule_mu;
bool g_schedule_ready = false;
std::string g_schedule_env;
int64_t g_schedule_bits[3] = {0, 0, 0};
int64_t g_schedule_raster[3] = {0, 0, 0};  // 0 auto, 1 along M, 2 along N
int64_t g_last_config = -1;
py::object* g_resolver = nullptr;  // never freed: no Python object is destroyed after the interpreter exits

int pass_index(c10::string_view pass) {
  if (pass == "fprop") return 0;
  if (pass == "dgrad") return 1;
  if (pass == "wgrad") return 2;
  TORCH_CHECK_VALUE(false, "cutlass mx128: pass '", std::string(pass), "' unknown; allowed: fprop, dgrad, wgrad");
  return -1;
}

int64_t call_config(c10::string_view pass, double m_tiles, double n_tiles) {
  int i = pass_index(pass);
  const char* e = std::getenv("TITAN_FP8_CUTLASS_SCHEDULE");
  std::string env = e ? e : "";
  int64_t bits = 0, raster = 0;
  bool hit = false;
  {
    std::lock_guard<std::mutex> lock(g_schedule_mu);
    if (g_schedule_ready && env == g_schedule_env) {
      bits = g_schedule_bits[i];
      raster = g_schedule_raster[i];
      hit = true;
    }
  }
  if (!hit) {
    int64_t b3[3], r3[3];
    {
      // the lock is not held here: a thread holding the GIL may be waiting for it (the ops hold the GIL already;
      // this keeps call_config safe for any caller)
      py::gil_scoped_acquire gil;
      TORCH_CHECK(g_resolver != nullptr, "cutlass mx128: no schedule resolver registered (cutlass_backend.load() "
                  "registers it)");
      try {
        py::tuple t = (*g_resolver)(env);
        for (int k = 0; k < 3; ++k) {
          py::tuple pr = t[k].cast<py::tuple>();
          b3[k] = pr[0].cast<int64_t>();
          r3[k] = pr[1].cast<int64_t>();
        }
      } catch (py::error_already_set& err) {
        std::string msg = err.what();
        TORCH_CHECK_VALUE(false, msg);
      }
    }
    std::lock_guard<std::mutex> lock(g_schedule_mu);
    std::copy(b3, b3 + 3, g_schedule_bits);
    std::copy(r3, r3 + 3, g_schedule_raster);
    g_schedule_env = env;
    g_schedule_ready = true;
    bits = b3[i];
    raster = r3[i];
  }
  int64_t sched = bits & 15;  // the callers count 128-column tiles; the wide kernels' tiles are kWideN wide
  if (titan_mx::is_wide(int(sched))) n_tiles *= 128.0 / titan_mx::kWideN;
  if (raster == 2 || (raster == 0 && m_tiles > n_tiles)) bits |= 16;
  g_last_config = bits;
  return bits;
}

// The op kernels hold the GIL (torch releases it around an op called from Python), as call_config needs it on a
// miss anyway and errors raised under it reach Python (benchmarks/op_error_probe.py); taking an uncontended GIL
// costs well under a microsecond of the ~25 us of host time these kernels take.
void rows_into_op(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                  const at::Tensor& offs, const at::Tensor& out, int64_t first_group, c10::string_view pass) {
  py::gil_scoped_acquire gil;
  if (out.numel() == 0) return;
  if (a.size(1) == 0 || offs.numel() == 0) {
    out.zero_();
    return;
  }
  int64_t config = call_config(pass, double(a.size(0)) / double(std::max<int64_t>(offs.size(0), 1)) / 128.0,
                               double(b.size(1)) / 128.0);
  grouped_rows(a, sa, b, sb, offs, out, config, first_group);
}

at::Tensor rows_op(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b, const at::Tensor& sb,
                   const at::Tensor& offs, c10::string_view pass) {
  py::gil_scoped_acquire gil;
  auto out = at::empty({a.size(0), b.size(1)}, a.options().dtype(at::kBFloat16));
  rows_into_op(a, sa, b, sb, offs, out, 0, pass);
  return out;
}

at::Tensor red_op(const at::Tensor& x, const at::Tensor& sx, const at::Tensor& y, const at::Tensor& sy,
                  const at::Tensor& offs, at::ScalarType out_dtype, c10::string_view pass) {
  py::gil_scoped_acquire gil;
  auto out = at::empty({offs.size(0), x.size(0), y.size(0)}, x.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  if (x.size(1) == 0) return out.zero_();
  grouped_red(x, sx, y, sy, offs, out, call_config(pass, double(x.size(0)) / 128.0, double(y.size(0)) / 128.0));
  return out;
}

// W^T tiles of w [G, N, K] bf16 -> (wt [G, K, N] e4m3 as uint8, s [G, K, N/32] E8M0): wt_tile_quant.h.
std::tuple<at::Tensor, at::Tensor> wt_tiles_into(const at::Tensor& w, int64_t g0, int64_t g1) {
  int64_t N = w.size(1), K = w.size(2);
  auto wt = at::empty({g1 - g0, K, N}, w.options().dtype(at::kByte));
  auto s = at::empty({g1 - g0, K, N / 32}, w.options().dtype(at::kByte));
  const char* err = titan_mx::quant_wt_tiles(static_cast<const at::BFloat16*>(w.data_ptr()) + g0 * N * K,
                                             wt.data_ptr<uint8_t>(), s.data_ptr<uint8_t>(), g1 - g0, N, K,
                                             c10::cuda::getCurrentCUDAStream(w.get_device()).stream());
  TORCH_CHECK(err == nullptr, "titan_fp8 CUTLASS mx128: ", err ? err : "");
  return {wt, s};
}

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.is_cuda() && w.dim() == 3 && w.scalar_type() == at::kBFloat16 && w.is_contiguous() &&
                  w.size(1) % 128 == 0 && w.size(2) % 128 == 0,
              "cutlass mx128: w must be a contiguous bf16 CUDA [E, N, K] with N, K multiples of 128, got ",
              w.sizes(), " ", w.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> wt_tiles(const at::Tensor& w) {
  check_weight(w);
  c10::cuda::CUDAGuard guard(w.get_device());
  return wt_tiles_into(w, 0, w.size(0));
}

// dx = dq @ W[e] per group, over the experts in `parts` launches into one output, each part's float8 W^T quantized
// (wt_tile_quant.h) right before its GEMM and freed after it (the caching allocator hands the next part the same
// memory): cutlass_backend.dgrad_in_parts.
at::Tensor dgrad_in_parts_op(const at::Tensor& dq, const at::Tensor& ds, const at::Tensor& w, const at::Tensor& offs,
                             int64_t parts) {
  py::gil_scoped_acquire gil;
  check_weight(w);
  TORCH_CHECK(parts >= 1, "cutlass mx128: parts must be >= 1, got ", parts);
  int64_t E = w.size(0), N = w.size(1), K = w.size(2);
  auto out = at::empty({dq.size(0), K}, dq.options().dtype(at::kBFloat16));
  if (out.numel() == 0) return out;
  if (N == 0 || offs.numel() == 0) return out.zero_();
  c10::cuda::CUDAGuard guard(w.get_device());
  int64_t config = call_config("dgrad", double(dq.size(0)) / double(std::max<int64_t>(offs.size(0), 1)) / 128.0,
                               double(K) / 128.0);
  for (int64_t i = 0; i < parts; ++i) {
    int64_t g0 = E * i / parts, g1 = E * (i + 1) / parts;
    if (g1 == g0) continue;
    auto [wt, s] = wt_tiles_into(w, g0, g1);
    grouped_rows(dq, ds, wt, s, offs, out, config, g0);
  }
  return out;
}

void set_schedule_resolver(py::object fn) {
  {
    std::lock_guard<std::mutex> lock(g_schedule_mu);
    g_schedule_ready = false;
  }
  if (g_resolver == nullptr) g_resolver = new py::object();
  *g_resolver = std::move(fn);
}

}  // namespace

// A build with -DTITAN_MX_NO_OPS (cutlass_backend.load_variant: another revision of the kernels, timed beside the
// default build in one process) registers no op kernels: the default build's own are already there.
#ifndef TITAN_MX_NO_OPS
TORCH_LIBRARY_IMPL(titan_fp8, CUDA, m) {
  m.impl("mx128_grouped_mm_rows_cutlass", &rows_op);
  m.impl("mx128_grouped_mm_rows_into_cutlass", &rows_into_op);
  m.impl("mx128_grouped_mm_wgrad_cutlass", &red_op);
  m.impl("mx128_dgrad_in_parts_cutlass", &dgrad_in_parts_op);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("grouped_rows", &grouped_rows, "mx128 grouped GEMM, groups along rows (fprop/dgrad), bf16 out");
  m.def("grouped_red", &grouped_red, "mx128 grouped GEMM, groups along the reduction (wgrad), fp32 or bf16 out");
  m.def("set_schedule_resolver", &set_schedule_resolver,
        "fn(env: str) -> ((bits, raster) for fprop, dgrad, wgrad): resolves $TITAN_FP8_CUTLASS_SCHEDULE for the ops");
  m.def("last_config", [] { return g_last_config; }, "the configuration int the last op call launched with (tests)");
  m.def("wt_tiles", &wt_tiles, "w [G, N, K] bf16 -> (W^T [G, K, N] e4m3 as uint8, E8M0 [G, K, N/32]), 128x128 tiles");
}
