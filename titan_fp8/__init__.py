"""titan_fp8: FSDP2 float8 / MXFP8 training for Llama-style MoE models."""
