// titan_fp8::blockwise_scaled_mm's CUDA kernel in C++: the operand layouts of cublas_blockwise.py's
// blockwise_scaled_mm_args, then aten::_scaled_mm_v2 (cuBLAS's 1x128 x 128x128 / 1x128 x 1x128 fp8 GEMMs).
// Why C++: the mx128 Linears call this op ~170 times a llama_moe step; through a Python kernel each call cost
// ~40 us of host time (the op's Python, the layout checks, F.scaled_mm's wrapper), and the float8 steps at the
// shipped batch are host-paced (benchmarks/results/issue10_s34/NOTE.md). Host code only: no nvcc, no CUDA headers.
// The schema, the fake kernel and the CPU kernel (the Python twin) are in cublas_blockwise.py;
// titan_fp8::blockwise_scaled_mm_layouts exposes the layouts so CPU tests compare them with the Python twin.
#include <ATen/BlasBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_mm_v2.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/reciprocal.h>
#include <torch/library.h>

#include <tuple>

namespace {

constexpr int64_t kBlock = 128;

// 1x128 scale [rows, K/128] -> the same values with strides (1, rows): cuBLAS reads them outer-dim-major
at::Tensor outer_major(const at::Tensor& s) { return s.t().contiguous().t(); }

// 128x128 factors [N/128, kb] -> contiguous [N/128, round_up(kb, 4)], pad slots 1.0 (cublas_blockwise.pad_tile_factors)
at::Tensor pad_tile_factors(const at::Tensor& s) {
  const int64_t kb = s.size(1);
  return at::constant_pad_nd(s, {0, (kb + 3) / 4 * 4 - kb}, 1.0).contiguous();
}

using Layouts = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// (mat_a, mat_b, scale_a, scale_b) for a @ b.T; the rules and torch's checks are in blockwise_scaled_mm_args
Layouts layouts(const at::Tensor& a_q, const at::Tensor& a_s, const at::Tensor& b_q, const at::Tensor& b_s,
                bool b_is_tile, bool inverse) {
  TORCH_CHECK(a_q.dim() == 2 && b_q.dim() == 2 && a_s.dim() == 2 && b_s.dim() == 2,
              "titan_fp8::blockwise_scaled_mm: operands and scales must be 2-D, got a_q ", a_q.sizes(), ", a_s ",
              a_s.sizes(), ", b_q ", b_q.sizes(), ", b_s ", b_s.sizes());
  auto inv = [inverse](const at::Tensor& s) { return inverse ? s : at::reciprocal(s); };
  at::Tensor mat_a = a_q.contiguous();
  at::Tensor mat_b = b_q.contiguous().t();
  at::Tensor scale_a = outer_major(inv(a_s));
  at::Tensor scale_b;
  if (b_is_tile) {
    const int64_t kb = b_q.size(1) / kBlock;
    if (inverse && b_s.size(1) == (kb + 3) / 4 * 4) {
      scale_b = b_s.contiguous().t();  // the padded buffer the mx128 quantizers write
    } else {
      scale_b = pad_tile_factors(inv(b_s)).t();
    }
  } else {
    scale_b = outer_major(inv(b_s));
  }
  return {mat_a, mat_b, scale_a, scale_b};
}

at::Tensor blockwise_scaled_mm(const at::Tensor& a_q, const at::Tensor& a_s, const at::Tensor& b_q,
                               const at::Tensor& b_s, bool b_is_tile, bool inverse) {
  auto [mat_a, mat_b, scale_a, scale_b] = layouts(a_q, a_s, b_q, b_s, b_is_tile, inverse);
  const int64_t vec = static_cast<int64_t>(at::blas::ScalingType::BlockWise1x128);
  const int64_t tile = static_cast<int64_t>(at::blas::ScalingType::BlockWise128x128);
  return at::_scaled_mm_v2(mat_a, mat_b, {scale_a}, {vec}, {}, {scale_b}, {b_is_tile ? tile : vec}, {},
                           std::nullopt, at::kBFloat16, {}, false);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(titan_fp8, m) {
  m.def("blockwise_scaled_mm_layouts(Tensor a_q, Tensor a_s, Tensor b_q, Tensor b_s, bool b_is_tile, "
        "bool inverse=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("blockwise_scaled_mm_recipes() -> int[]");
}

TORCH_LIBRARY_IMPL(titan_fp8, CompositeExplicitAutograd, m) {
  m.impl("blockwise_scaled_mm_layouts", &layouts);
  m.impl("blockwise_scaled_mm_recipes", []() -> std::vector<int64_t> {
    return {static_cast<int64_t>(at::blas::ScalingType::BlockWise1x128),
            static_cast<int64_t>(at::blas::ScalingType::BlockWise128x128)};
  });
}

TORCH_LIBRARY_IMPL(titan_fp8, CUDA, m) { m.impl("blockwise_scaled_mm", &blockwise_scaled_mm); }
