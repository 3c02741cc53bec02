#!/bin/bash
# Issue 10, session 22, ONE call on one GPU: the CuTe mx128 kernel (kernels/grouped_gemm/cuda_mx/mx128_grouped.cu)
# against the CUTLASS backend, the CUTLASS kernels' tests, and (S22_MX32=1) the mx32 CuTe kernel beside Gluon.
#   1. build the CUTLASS backend and the cuda_mx extension side by side; a short smoke launch of the mx128 kernel
#      (a cluster or barrier hang must not eat the call);
#   2. GPU tests: tests/gpu/test_grouped_gemm_cuda_mx_gpu.py (mx32 + mx128: float64 reference, bit for bit against
#      the Gluon / CUTLASS kernels) and tests/gpu/test_grouped_gemm_cutlass_gpu.py (-k $S22_CUTLASS_K, default all);
#   3. benchmarks/mxfp8_grouped_gemm_backends.py: bf16, fp8 rowwise, mx128_cutlass (defaults), mx128_cuda, round-
#      robin (S22_ROUNDS, default 20), plus $S22_BENCH_ARGS (e.g. --no-op, --ops ..., --cutlass-configs ...);
#   4. (S22_MX32=1) benchmarks/mxfp8_grouped_gemm_gluon.py: bf16, the Gluon default, the CuTe mx32 kernel.
# (Session 22's call 1 ran it with --cutlass-configs cooperative_lpt_n192_2x1_epi16 --no-op, the 128x16-epilogue
# kernel later folded into cooperative_lpt_n192_2x1's fp32 build.)
# From the repo root:  run(command="bash benchmarks/issue10_s22_device_run.sh", carry=[".whl"], timeout_s=600)
# $OUT: build_*.log, pytest*.log, backends.log (+ json), mx32.log (+ json).
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
MAX_JOBS=16 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1 &
MAX_JOBS=16 timeout 300 python3 -c "from kernels.grouped_gemm import cuda_mx as c; c.load(); print('built')" \
  > "$OUT/build_cuda_mx.log" 2>&1
echo "cuda_mx build (${SECONDS}s): $(tail -1 "$OUT/build_cuda_mx.log")"
wait
echo "cutlass build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
timeout 60 python3 benchmarks/cuda_mx128_smoke.py > "$OUT/smoke.log" 2>&1
rc=$?; echo "smoke rc=$rc (${SECONDS}s): $(tail -3 "$OUT/smoke.log")"
[ $rc -eq 0 ] || { echo "SMOKE FAILED: stopping"; exit 1; }
timeout ${S22_TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_cuda_mx_gpu.py \
  > "$OUT/pytest_cuda_mx.log" 2>&1
echo "pytest cuda_mx rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest_cuda_mx.log")"
grep -E "^FAILED|^ERROR|Error|assert" "$OUT/pytest_cuda_mx.log" | head -20
timeout ${S22_TEST2_S:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_cutlass_gpu.py \
  ${S22_CUTLASS_K:+-k "$S22_CUTLASS_K"} > "$OUT/pytest_cutlass.log" 2>&1
echo "pytest cutlass rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest_cutlass.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_cutlass.log" | head -10
timeout ${S22_BENCH_S:-240} python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cutlass,mx128_cuda \
  --no-cublas --rounds ${S22_ROUNDS:-20} ${S22_BENCH_ARGS:-} > "$OUT/backends.log" 2>&1
echo "backends rc=$? (${SECONDS}s)"; grep -v '^{' "$OUT/backends.log" | grep -v "^\s*$" | tail -60
if [ -n "${S22_MX32:-}" ]; then
  timeout ${S22_MX32_S:-150} python3 benchmarks/mxfp8_grouped_gemm_gluon.py --routings even --skip-triton \
    --configs default --cuda default --rounds ${S22_ROUNDS:-20} > "$OUT/mx32.log" 2>&1
  echo "mx32 rc=$? (${SECONDS}s)"; grep -v '^{' "$OUT/mx32.log" | grep -v "^\s*$" | tail -25
fi
