#!/bin/bash
# One device call (nvidia-h100-x1 or nvidia-h200): the GPU tests of the gathered MXFP8 weights and the CUTLASS
# grouped GEMMs, then benchmarks/host_profile.py (cProfile of the trainer's host, steps 8-10 of llama_moe on one
# GPU) for bf16, tensorwise + mx128 experts and mx128 Linears + experts. Carry .whl (torchao, nvidia-cutlass):
#     run(command="bash benchmarks/host_profile_device_run.sh", carry=[".whl"], timeout_s=600)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" outputs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
# HP_TESTS: the GPU tests to run first (default: the gathered MXFP8 weights and the CUTLASS grouped GEMMs)
MAX_JOBS=16 timeout ${HP_TESTS_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider \
    ${HP_TESTS:-tests/gpu/test_float8_mxfp8_gathered_gpu.py tests/gpu/test_grouped_gemm_cutlass_gpu.py} \
    > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
TW="--float8.enable=true --float8.recipe_name=tensorwise --float8.enable_fsdp_float8_all_gather=true --float8.precompute_float8_dynamic_scale_for_fsdp=true --float8.moe_recipe_name=mxfp8 --float8.moe_granularity=mx128"
MX="--float8.enable=true --float8.recipe_name=mxfp8 --float8.linear_granularity=mx128 --float8.enable_fsdp_float8_all_gather=true --float8.moe_recipe_name=mxfp8 --float8.moe_granularity=mx128"
for run in bf16 tw_mx128 mx128_linears; do
  case $run in bf16) A="--float8.enable=false" ;; tw_mx128) A=$TW ;; mx128_linears) A=$MX ;; esac
  timeout 150 python3 benchmarks/host_profile.py --steps 8:10 --out "$OUT/host_$run.txt" -- \
      --config train_configs/llama_moe.toml --training.steps=10 --checkpoint.enable=false \
      --job.dump_folder=outputs/host_$run $A > "$OUT/train_$run.log" 2>&1
  echo "$run: rc $? $(grep -h 'step    10' "$OUT/train_$run.log" | cut -c1-120)"
done
