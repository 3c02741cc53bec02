# One device call (benchmarks/results/float8_linear_mx128-*.md): the mx128 Linear GPU tests, then
# benchmarks/float8_linear.py twice (SHAPES/RECIPES, then SHAPES2/RECIPES2 if set); run from the repo root with .whl
# (torchao) carried and $OUT given.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
cd .carry/mxlinear && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
timeout 120 python3 -m pytest -x -q -p no:cacheprovider tests/gpu/test_float8_mx128_linear_gpu.py > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$? $(( $(date +%s) - T0 ))s"
tail -25 $OUT/gpu_tests.log
T1=$(date +%s)
timeout $(( 280 - (T1 - T0) )) python3 benchmarks/float8_linear.py --shapes "$SHAPES" --recipes "$RECIPES" --iters 20 --warmup 5 --rounds 3 --out $OUT > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - T1 ))s"
grep -A6 "^cells" $OUT/bench.log
if [ -n "${SHAPES2:-}" ]; then
  T2=$(date +%s)
  timeout $(( 288 - (T2 - T0) )) python3 benchmarks/float8_linear.py --shapes "$SHAPES2" --recipes "$RECIPES2" --iters 20 --warmup 5 --rounds 3 --out $OUT > $OUT/bench2.log 2>&1; echo "bench2 rc=$? $(( $(date +%s) - T2 ))s"
  grep -A8 "^cells" $OUT/bench2.log
fi
