#!/bin/bash
# Issue 10, session 39: the whole op fwd+bwd (quantization included) on ONE H200, beside bf16 and torchao fp8
# rowwise in the same rounds: mx128 (CUTLASS) and mx32 (Gluon). Sessions 36-37 measured the op on H100s only
# (1.335-1.430x bf16 for mx128); the op's quantizers are memory-bound, and an H200 moves ~1.4x the bytes per second.
# Exits at once on any other GPU (REQUIRE=H200; REQUIRE= runs anywhere).
# From the repo root:  run(command="bash benchmarks/issue10_s39_op_h200.sh", kind="nvidia-h200", carry=[".whl"])
source benchmarks/device_env.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
case "$name" in *"${REQUIRE-H200}"*) ;; *) echo "not an ${REQUIRE-H200}: nothing run"; exit 0 ;; esac
MAX_JOBS=16 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1
echo "build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
timeout $(( 585 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours "" --no-cublas \
  --rounds ${ROUNDS:-12} --ops ${OPS:-torchao_fp8_rowwise,op_mx128_cutlass,op_mx32_gluon} > "$OUT/op.log" 2>&1
echo "op rc=$? (${SECONDS}s)"; grep "fwd+bwd" "$OUT/op.log" | grep -v '^{' | cut -c1-120
