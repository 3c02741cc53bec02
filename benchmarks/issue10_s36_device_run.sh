#!/bin/bash
# Issue 10, session 36: the wide CUTLASS mx128 kernels with each consumer warpgroup storing its own 64 rows
# (blockwise_grouped.cuh WarpgroupStoreEpilogue; now the default, -DTITAN_MX_EPI_CUTLASS builds CUTLASS's epilogue)
# against the other build, in the same rounds.
# Variant builds carry -DTITAN_MX_ONLY_DEFAULT_KERNEL: only cooperative_lpt_n256_2x1 (the kernel every pass uses) is
# instantiated, so three variants and the default build together take ~2 minutes on 16 cores.
#   PART=1 (call 1, on the tree where -DTITAN_MX_EPI_WG built the new epilogue and -DTITAN_MX_STAGGER=C held
#           warpgroup 1 C cycles behind; both defines are gone): the builds (in parallel); kernel rows round-robin:
#           bf16, fp8 rowwise, the default build, each variant (bits_equal: its output identical to the default's),
#           3 shapes x 2 routings x fprop / dgrad / wgrad.
#   PART=2: the default build (now the per-warpgroup epilogue) and VARIANT (default: CUTLASS's epilogue); kernel rows
#           as PART=1 with wgrad writing fp32 (--wgrad-out fp32); then the GPU tests of every CUTLASS kernel.
#   PART=3: the whole op fwd+bwd (quantization included) beside bf16 and torchao fp8 rowwise; then the GPU tests
#           of the paths that reach the kernels (expert op, gathered MXFP8 weights, grouped GEMMs, MXFP8 Linears).
# From the repo root:  run(command="PART=1 bash benchmarks/issue10_s36_device_run.sh", carry=[".whl"], timeout_s=600)
# Session 37 ran it with VARIANTS="b3=-DTITAN_MX_EPI_BUFS=3 o2=-DTITAN_MX_EPI_ONEBAR" / "b2=-DTITAN_MX_EPI_BUFS=2" (three output
# buffers a warpgroup against two; benchmarks/results/issue10_s37/NOTE.md has the commands).
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
VARIANTS=${VARIANTS:-cut=-DTITAN_MX_EPI_CUTLASS}
build_default() {
  MAX_JOBS=16 timeout 420 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
    > "$OUT/build_cutlass.log" 2>&1
}
if [ "${PART:-1}" = 1 ] || [ "${PART:-1}" = 2 ]; then
  build_default &
  for v in $VARIANTS; do
    tag=${v%%=*}
    MAX_JOBS=6 timeout 420 python3 -c "from kernels.grouped_gemm import cutlass_backend as c
c.load_variant('$tag', tuple('${v#*=}'.split(',')) + ('-DTITAN_MX_ONLY_DEFAULT_KERNEL',)); print('built')" \
      > "$OUT/build_$tag.log" 2>&1 &
  done
  wait
  echo "builds (${SECONDS}s):"; for f in "$OUT"/build_*.log; do echo "  $(basename $f): $(tail -1 $f | cut -c1-200)"; done
  args=""; for v in $VARIANTS; do args="$args --cutlass-variant ${v},-DTITAN_MX_ONLY_DEFAULT_KERNEL"; done
  timeout $(( 585 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cutlass $args \
    --no-cublas --no-op --rounds ${ROUNDS:-15} ${WGRAD_OUT:+--wgrad-out $WGRAD_OUT} > "$OUT/kernels.log" 2>&1
  echo "kernels rc=$? (${SECONDS}s)"; grep -E "rror|bits_equal\": false" "$OUT/kernels.log" | head -5
  echo "bits_equal true: $(grep -c 'bits_equal": true' "$OUT/kernels.log")"
  grep -v '^{' "$OUT/kernels.log" | grep -E "fprop|dgrad|wgrad" | cut -c1-120
fi
if [ "${PART:-1}" = 2 ]; then
  timeout $(( 590 - SECONDS )) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_cutlass_gpu.py \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
fi
if [ "${PART:-1}" = 3 ]; then
  PART=2 bash benchmarks/issue10_s32_device_run.sh
  timeout $(( 590 - SECONDS )) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_float8_moe_fused_gpu.py \
    tests/gpu/test_float8_mxfp8_gathered_gpu.py tests/gpu/test_grouped_gemm_gpu.py \
    tests/gpu/test_float8_mx128_linear_gpu.py > "$OUT/pytest_paths.log" 2>&1
  echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest_paths.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest_paths.log" | head
fi
