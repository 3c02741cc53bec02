// MXFP8 W^T in 128 x 128 tiles, on the extension's side (bindings.cpp's dgrad-in-parts op), so a compiled graph
// quantizes and multiplies a part of the experts with no Python per call.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace titan_mx {

// w [G, N, K] bf16 (contiguous; N, K multiples of 128) -> wt [G, K, N] e4m3 bytes and s [G, K, N/32] E8M0 bytes: one
// scale per 128 (n) x 128 (k) tile of w, written into each of its 1x32 blocks along n. The bytes of
// kernels/grouped_gemm/quant_triton.py's column copy with col_block = col_tile = 128 (the hardware-cast path):
// e = clamp(ceil(log2(fl(amax / 448))), -127, 127) from the amax's bits, data = cvt.rn.satfinite.e4m3(x * 2^-e), a
// tile holding inf or NaN -> scale 255 and every byte 0x7F. Returns nullptr or an error message (static storage).
const char* quant_wt_tiles(const void* w, uint8_t* wt, uint8_t* s, int64_t G, int64_t N, int64_t K,
                           cudaStream_t stream);

}  // namespace titan_mx
