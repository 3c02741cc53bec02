"""Numerics kernels (torch + triton). Never imports titan_fp8."""
