// The call description shared by bindings.cpp (torch side) and the CUDA translation units (CUTLASS side).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace titan_mx {

enum GroupMode : int { kRows = 0, kRed = 1 };

// Everything a call needs, in elements (bytes for the fp8 / uint8 tensors, whose elements are bytes).
struct GroupedProblem {
  int mode = kRows;
  int groups = 0;          // E
  const int32_t* offs = nullptr;
  // kRows: A [M, R], out [M, C], B [E, C, R].  kRed: A [rows, T], B [C, T], out [E, rows, C] (T = tokens = M).
  int64_t M = 0;           // rows of A (kRows) / tokens (kRed)
  int64_t rows = 0;        // kRed: rows of A (= rows of each output)
  int64_t C = 0;           // columns of the output = rows of B
  int64_t R = 0;           // kRows: reduction length
  const void* a = nullptr; int64_t lda = 0;
  const void* b = nullptr; int64_t ldb = 0; int64_t b_group_stride = 0;
  // E8M0 scales, strided: kRows sa [M, R/32], sb [E, C, R/32]; kRed sa [rows, T/32], sb [C, T/32] (sb_s0 unused)
  const uint8_t* sa = nullptr; int64_t sa_s0 = 0, sa_s1 = 0;
  const uint8_t* sb = nullptr; int64_t sb_s0 = 0, sb_s1 = 0, sb_s2 = 0;
  void* out = nullptr; int64_t ldo = 0; int64_t out_group_stride = 0;
};

// Schedules: kCooperative = 128x128x128 tiles, both consumer warpgroups on one tile (CUTLASS example 68's choice);
// kPingpong = 64x128x128 tiles, the two consumer warpgroups alternate tiles so one's epilogue overlaps the other's
// mainloop. One translation unit per (output dtype, schedule): *_coop / *_pp; nullptr on success, else a message.
enum Schedule : int { kCooperative = 0, kPingpong = 1 };
size_t scratch_bytes_bf16_coop(const GroupedProblem& p, int sm_count);
size_t scratch_bytes_f32_coop(const GroupedProblem& p, int sm_count);
size_t scratch_bytes_bf16_pp(const GroupedProblem& p, int sm_count);
size_t scratch_bytes_f32_pp(const GroupedProblem& p, int sm_count);
const char* run_bf16_coop(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s);
const char* run_f32_coop(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s);
const char* run_bf16_pp(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s);
const char* run_f32_pp(const GroupedProblem& p, void* scratch, size_t bytes, int sm_count, cudaStream_t s);

}  // namespace titan_mx
