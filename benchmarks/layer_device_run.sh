#!/bin/bash
# One nvidia-h100-x1 / nvidia-h200 call for issue 9 acceptance 2: GPU tests, then benchmarks/moe_layer.py at
# dsv3_layer and llama_moe, inside L_BUDGET seconds (default 540).
#   L_TESTS     pytest targets run first (default: the router, kernels.moe and fused-path GPU tests); timed runs
#               go ahead even if they fail, the log says so
#   L_DSV3      moe_layer variants at dsv3_layer  (default bf16,torchao_fp8,fp8_rowwise,mxfp8_mx128)
#   L_LLAMA     moe_layer variants at llama_moe   (default bf16,tw:bf16,tw:torchao_fp8,tw:mxfp8_mx128)
#   L_ARGS      extra moe_layer.py arguments (default --rounds 2 --iters 8 --warmup 2)
# The CUTLASS extension (~65 s of nvcc) is built once per machine; the build folder comes back as
# $OUT/cutlass_build.tgz, and a later call that carries it unpacked as .cutlass_build skips the build:
#   mkdir -p .cutlass_build && tar xzf <files_at>/cutlass_build.tgz -C .cutlass_build   (here, once)
#   run(command="bash benchmarks/layer_device_run.sh", carry=[".whl", ".cutlass_build"], timeout_s=600)
source benchmarks/device_env.sh
BUDGET=${L_BUDGET:-540}
export TITAN_FP8_CUTLASS_BUILD_DIR=$PWD/.cutlass_build
mkdir -p "$TITAN_FP8_CUTLASS_BUILD_DIR"
find "$TITAN_FP8_CUTLASS_BUILD_DIR" -type f -exec touch {} +  # carried objects newer than the fresh sources
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
( MAX_JOBS=16 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')" \
    > "$OUT/cutlass_build.log" 2>&1 ) &
BUILD=$!
TESTS=${L_TESTS:-tests/gpu/test_moe_cuda.py tests/gpu/test_moe_kernels_gpu.py}
timeout 200 python3 -m pytest -q -x -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
echo "GPU tests ($TESTS): rc=$? $(tail -1 "$OUT/gpu_tests.log")"
wait $BUILD; tail -1 "$OUT/cutlass_build.log"
if [ ! -f "$OUT/.no_pack" ]; then
  (cd "$TITAN_FP8_CUTLASS_BUILD_DIR" && tar czf "$OUT/cutlass_build.tgz" .) && ls -la "$OUT/cutlass_build.tgz"
fi
echo "setup done at $SECONDS s"
ARGS=${L_ARGS:---rounds 2 --iters 8 --warmup 2}
for shape in dsv3_layer llama_moe; do
  left=$((BUDGET - SECONDS - 10))
  [ "$shape" = dsv3_layer ] && left=$((left * 55 / 100))
  [ $left -gt 45 ] || { echo "moe_layer $shape: no time left ($left s)"; continue; }
  if [ "$shape" = dsv3_layer ]; then V=${L_DSV3:-bf16,torchao_fp8,fp8_rowwise,mxfp8_mx128}
  else V=${L_LLAMA:-bf16,tw:bf16,tw:torchao_fp8,tw:mxfp8_mx128}; fi
  [ -n "$V" ] || continue
  mkdir -p "$OUT/$shape"
  timeout $left python3 benchmarks/moe_layer.py --shapes $shape --variants "$V" $ARGS \
      --deadline-s $((left - 25)) --out "$OUT/$shape" > "$OUT/layer_$shape.log" 2>&1
  echo "moe_layer $shape rc=$? at $SECONDS s"
  for f in "$OUT/$shape"/moe_layer-*.json; do [ -f "$f" ] && mv "$f" "$OUT/layer_$shape.json"; done
  rmdir "$OUT/$shape" 2>/dev/null
  grep -v Warn "$OUT/layer_$shape.log" | grep -E "^(shape|dsv3|llama)" | tail -12
done
echo "total $SECONDS s"
