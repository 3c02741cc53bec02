"""Diagnostic: what the memory system gives the expert op's x / dO quantizer's traffic pattern, with no arithmetic.

The CUDA quantizer (kernels/grouped_gemm/cuda_quant/rowcol_quant.cu) reads bf16 x [M, K] and writes two e4m3 copies:
the row copy qr [M, K] and the token-major column copy qc [K, MC], one 128-token x 128-feature tile per CTA step.
It runs at ~2.7 TB/s (read + written) on an H200 against a copy's 4.2 (issue10_s40/); sessions 30-31 placed the
cost in its two store streams, "downstream of the SM". This probe moves the same bytes in the same tiles with
nothing else (each thread's stored words depend on its loads, so nothing is elided) and varies what could matter:
  - the tile (TM tokens x TK features): the column copy's pieces are TM bytes of a feature row, the row copy's TK
    bytes of a token row, the reads 2 TK bytes of a token row;
  - the column copy's row stride (MC + pad: at M = 65536, MC is 64 KiB, a power of two);
  - the tile order (along K first, or along M first);
  - the column copy laid out as contiguous tile blobs ("blob": the same bytes with no transpose stride), the bound
    for any tile order.
Beside them, in the same rounds: the real quantizer (mx128 x layout; its default grid, one CTA per tile since
session 44, and with --set occupancy also its earlier persistent grid) and a plain copy of x's bytes.

    python benchmarks/store_pattern_probe.py [--shapes dsv3_up,llama_up] [--rounds 20] [--set patterns|occupancy]
"""
import argparse
import datetime
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.cuda_timing import interleaved_ms  # noqa: E402
from benchmarks.results_json import write_results  # noqa: E402

SHAPES = {"dsv3_up": 7168, "llama_up": 4096, "dsv3_down": 2048}  # x [65536, K]
M_TOKENS = 65536

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

// flags: 1 read x, 2 row stores, 4 column stores, 8 column copy as contiguous tile blobs, 16 row stores of 8 bytes
// a thread (the quantizer's) instead of 16; order 0: along K first.
template <int TM, int TK>
__device__ __forceinline__ void move_tile(const uint4* __restrict__ x, uint4* __restrict__ qr,
                                          uint8_t* __restrict__ qc, int M, int K, long ldc, int order, int flags,
                                          int t) {
  const int nm = M / TM, nk = K / TK, tid = threadIdx.x;
  const int mt = order == 0 ? t / nk : t % nm, kt = order == 0 ? t % nk : t / nm;
  const long m0 = long(mt) * TM, k0 = long(kt) * TK;
  uint4 a = make_uint4(tid, t, 0, 0);
  if (flags & 1) {
    constexpr int RP = TK * 2 / 16, NL = TM * RP / 256;  // uint4 per x row piece, loads per thread
#pragma unroll
    for (int s = 0; s < NL; ++s) {
      const int i = tid + 256 * s, r = i / RP, c = i % RP;
      const uint4 v = x[((m0 + r) * K + k0) / 8 + c];
      a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
  }
  if ((flags & 2) && (flags & 16)) {
    constexpr int RP = TK / 8, NS = TM * RP / 256;
    uint2* qr8 = reinterpret_cast<uint2*>(qr);
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int i = tid + 256 * s, r = i / RP, c = i % RP;
      qr8[((m0 + r) * K + k0) / 8 + c] = make_uint2(a.x ^ s, a.y ^ a.z);
    }
  } else if (flags & 2) {
    constexpr int RP = TK / 16, NS = TM * RP / 256;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int i = tid + 256 * s, r = i / RP, c = i % RP;
      qr[((m0 + r) * K + k0) / 16 + c] = make_uint4(a.x ^ s, a.y, a.z, a.w);
    }
  }
  if (flags & 4) {
    constexpr int CP = TM / 16, NS = TK * CP / 256;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int i = tid + 256 * s, f = i / CP, c = i % CP;
      uint8_t* dst = (flags & 8) ? qc + (long(t) * TM * TK + long(i) * 16) : qc + (k0 + f) * ldc + m0 + 16 * c;
      *reinterpret_cast<uint4*>(dst) = make_uint4(a.x, a.y ^ s, a.z, a.w);
    }
  }
}

// LOOP false: one CTA per tile (session 44's call 1); true: a smaller grid walks the tiles persistently (CTA b:
// tiles b, b + grid, ...). Call 2 ran every variant through the loop kernel (commit bf358e3), whose one-tile grid
// read 0.556 ms where call 1's kernel read 0.495 at dsv3_up.
template <int TM, int TK, bool LOOP>
__global__ void __launch_bounds__(256) move_tiles(const uint4* __restrict__ x, uint4* __restrict__ qr,
                                                  uint8_t* __restrict__ qc, int M, int K, long ldc, int order,
                                                  int flags) {
  if constexpr (LOOP) {
    for (int t = blockIdx.x; t < (M / TM) * (K / TK); t += gridDim.x)
      move_tile<TM, TK>(x, qr, qc, M, K, ldc, order, flags, t);
  } else {
    move_tile<TM, TK>(x, qr, qc, M, K, ldc, order, flags, blockIdx.x);
  }
}

// grid 0: one CTA per tile (the one-tile kernel), else the loop kernel on that grid; smem: dynamic shared memory
// per CTA (bytes), to hold the CTAs per SM down
void move(torch::Tensor x, torch::Tensor qr, torch::Tensor qc, int64_t ldc, int64_t tm, int64_t tk, int64_t order,
          int64_t flags, int64_t grid, int64_t smem) {
  const int M = x.size(0), K = x.size(1);
  auto s = c10::cuda::getCurrentCUDAStream().stream();
  const auto xp = reinterpret_cast<const uint4*>(x.data_ptr());
  const auto qrp = reinterpret_cast<uint4*>(qr.data_ptr());
  const auto qcp = qc.data_ptr<uint8_t>();
  const int tiles = grid > 0 ? int(grid) : (M / tm) * (K / tk);
#define L(A, B) if (tm == A && tk == B) { \
    auto kern = grid > 0 ? move_tiles<A, B, true> : move_tiles<A, B, false>; \
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); \
    kern<<<tiles, 256, smem, s>>>(xp, qrp, qcp, M, K, ldc, int(order), int(flags)); return; }
  L(128, 128) L(256, 128) L(512, 128) L(128, 256) L(64, 128) L(256, 64)
  TORCH_CHECK(false, "no tile ", tm, "x", tk);
}
"""
CPP_SRC = "void move(torch::Tensor x, torch::Tensor qr, torch::Tensor qc, int64_t ldc, int64_t tm, int64_t tk, " \
          "int64_t order, int64_t flags, int64_t grid, int64_t smem);"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="dsv3_up,llama_up")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--set", default="patterns", choices=["patterns", "occupancy"],
                    help="patterns: tiles, column-copy pads, tile orders, one stream at a time; occupancy: CTAs "
                         "per SM, persistent grids, 8-byte row stores, the real quantizer without its stores")
    args = ap.parse_args()
    from torch.utils.cpp_extension import load_inline
    ext = load_inline("store_pattern_probe", CPP_SRC, cuda_sources=CUDA_SRC, functions=["move"],
                      extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
    from kernels.grouped_gemm import quant_cuda
    rows = []
    for shape in args.shapes.split(","):
        K = SHAPES[shape]
        M = M_TOKENS
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        qr = torch.empty(M, K, dtype=torch.uint8, device="cuda")
        qc_buf = torch.empty(K * (M + 4096) + 4096, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        byts = x.numel() * 2 + 2 * x.numel()  # read bf16, write two e4m3 copies
        fns = {"copy x (same bytes read, 2x bytes written / 2)": [lambda: y.copy_(x)]}
        for diag, what in ((0, ""), (1, " diag 1: no col stores"), (2, " diag 2: no row stores"),
                           (3, " diag 3: no stores")):
            if diag == 0 or args.set == "occupancy":
                fns[f"quantizer mx128 x (real){what}"] = [lambda d=diag: quant_cuda.rowcol(x, 128, 128, 128, diag=d)]
        if args.set == "occupancy":  # the real quantizer on its pre-session-44 grid (the rows above: one CTA a tile)
            fns["quantizer mx128 x (real) persistent 2/SM"] = [
                lambda: quant_cuda.rowcol(x, 128, 128, 128, ctas_per_sm=2)]
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        variants = []  # (tm, tk, pad, order, flags, grid, smem)
        if args.set == "patterns":
            for tm, tk in ((128, 128), (256, 128), (512, 128), (128, 256), (64, 128), (256, 64)):
                for pad in (0, 128, 1040):
                    variants.append((tm, tk, pad, 0, 7, 0, 0))
            variants += [(128, 128, 0, 1, 7, 0, 0), (256, 128, 0, 1, 7, 0, 0), (128, 128, 0, 0, 15, 0, 0),
                         (256, 128, 0, 0, 15, 0, 0), (128, 128, 0, 0, 1, 0, 0), (128, 128, 0, 0, 3, 0, 0),
                         (128, 128, 0, 0, 5, 0, 0), (256, 128, 0, 0, 5, 0, 0), (128, 128, 0, 0, 6, 0, 0)]
        else:  # CTAs per SM (dynamic shared memory holds them down), persistent grids, 8-byte row stores
            kb = 1024
            for flags in (7, 23, 1):
                for grid, smem in ((0, 0), (0, 100 * kb), (0, 70 * kb), (0, 50 * kb), (2 * sms, 0), (3 * sms, 0),
                                   (4 * sms, 0), (8 * sms, 0)):
                    variants.append((128, 128, 0, 0, flags, grid, smem))
        for tm, tk, pad, order, flags, grid, smem in variants:
            name = f"tile {tm}x{tk} pad {pad} {'M-first' if order else 'K-first'} " + \
                   "+".join(n for b, n in ((1, "read"), (2, "rows"), (4, "cols"), (8, "blob"), (16, "rows8B"))
                            if flags & b)
            name += (f" grid {grid // sms}/SM" if grid else "") + (f" smem {smem // 1024}K" if smem else "")
            fns[name] = [lambda tm=tm, tk=tk, pad=pad, order=order, flags=flags, grid=grid, smem=smem:
                         ext.move(x, qr, qc_buf, M + pad, tm, tk, order, flags, grid, smem)]
        res = interleaved_ms(fns, args.rounds)
        print(f"\n{shape}: x [{M}, {K}] bf16; TB/s = (read bf16 + two e4m3 writes) / time for full patterns")
        print(f"{'variant':58s} {'ms':>8s} {'iqr':>6s} {'TB/s':>6s}")
        for name, (ms, iqr) in res.items():
            full = "real" in name or name.startswith("copy") or ("read+rows+cols" in name)
            tb = (byts if "copy" not in name else 2 * x.numel() * 2) / ms / 1e9
            print(f"{name:58s} {ms:8.3f} {iqr:6.3f} {tb if full else float('nan'):6.2f}")
            rows.append({"shape": shape, "M": M, "K": K, "variant": name, "ms": ms, "iqr": iqr})
        del x, qr, qc_buf, y
        torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "torch": torch.__version__, "command": " ".join(["python"] + sys.argv), "timing": "round-robin, median"}
    print(write_results("store_pattern_probe", meta, rows))


if __name__ == "__main__":
    main()
