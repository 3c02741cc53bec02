# One device call for the mx32 MXFP8 Linear on kernels.grouped_gemm (benchmarks/results/mx32_linear_s28/): its GPU
# tests (PYTEST_FILES, PYTEST_K), then benchmarks/float8_linear.py (SHAPES / RECIPES, compiled fwd+bwd beside bf16
# and torchao in interleaved rounds). Run from the repo root with .whl carried and $OUT given; LIMIT_S bounds it.
set -u
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
LIMIT_S=${LIMIT_S:-560}
T0=$(date +%s)
if [ -n "${PYTEST_FILES:-}" ]; then
  timeout ${PYTEST_S:-240} python3 -m pytest -q -p no:cacheprovider $PYTEST_FILES -k "${PYTEST_K:-not nccl}" \
    > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$? $(( $(date +%s) - T0 ))s"
  grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests.log | tail -25
fi
if [ -n "${SHAPES:-}" ]; then
  T1=$(date +%s)
  timeout $(( LIMIT_S - (T1 - T0) )) python3 benchmarks/float8_linear.py --shapes "$SHAPES" --recipes "$RECIPES" \
    --iters 20 --warmup 5 --rounds ${ROUNDS:-3} --out $OUT ${BENCH_ARGS:-} > $OUT/bench.log 2>&1
  echo "bench rc=$? $(( $(date +%s) - T1 ))s"
  grep -A12 "^cells" $OUT/bench.log || tail -30 $OUT/bench.log
fi
