"""Roofline behind filter_fqns = ["auto_filter_small_kn"]: does converting a Linear [K -> N] pay?

predicted_speedup(recipe, K, N, M) = (bf16 fwd+bwd time) / (float8 fwd+bwd time), each the sum over the three
GEMMs of max(flops / peak, bytes / bandwidth), the float8 side plus the casts it adds (read the high-precision
operand, write float8, and the transposed float8 copies backward needs). Constants and any MEASURED speedups
live in roofline.json: `benchmarks/float8_linear.py --update-roofline` writes the measured table there; a
measured (recipe, K, N) row wins over the formula.
"""
from __future__ import annotations

import functools
import json
import os

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "roofline.json")
DEFAULT_TOKENS = 8192


@functools.lru_cache(maxsize=1)
def load_table(path: str = TABLE) -> dict:
    with open(path) as f:
        return json.load(f)


def analytic_speedup(recipe: str, K: int, N: int, M: int = DEFAULT_TOKENS, table: dict | None = None) -> float:
    c = (table or load_table())["constants"]
    bw = c["bandwidth_bytes_per_s"] * c["bandwidth_efficiency"]
    bf16_flops = c["bf16_flops_per_s"] * c["gemm_efficiency"]
    fp8_flops = c["recipe_gemm_flops_per_s"][recipe] * c["gemm_efficiency"]
    gemm = 2.0 * M * K * N
    shapes = [(M, K, N), (M, N, K), (N, M, K)]  # fwd, grad-input, grad-weight: (rows, contraction, cols)
    t_bf16 = sum(max(gemm / bf16_flops, 2.0 * (a * b + b * d + a * d) / bw) for a, b, d in shapes)
    t_fp8 = sum(max(gemm / fp8_flops, (1.0 * (a * b + b * d) + 2.0 * a * d) / bw) for a, b, d in shapes)
    # casts: x, w, g each read in 16 bits and written in 8 bits twice (two orientations), once more read for amax
    elems = M * K + K * N + M * N
    t_fp8 += elems * c["cast_bytes_per_element"][recipe] / bw
    return t_bf16 / t_fp8


def predicted_speedup(recipe: str, K: int, N: int, M: int = DEFAULT_TOKENS) -> float:
    table = load_table()
    rows = [r for r in table.get("measured", []) if r["recipe"] == recipe and r["K"] == K and r["N"] == N]
    if rows:
        return min(rows, key=lambda r: abs(r["M"] - M))["speedup"]
    return analytic_speedup(recipe, K, N, M, table)
