#!/bin/bash
# Issue 9 acceptance 2 and 3 (and issue 10's 3) in ONE call on nvidia-h200-x2, inside X9_BUDGET seconds (default 585):
#   1. benchmarks/e2e_x2_device_run.sh speed with X2_RECIPES (default: bf16, tensorwise, tensorwise + mx128 experts,
#      mx128 Linears + experts), X2_TESTS first (GPU tests; no timed runs if they fail), X2_BUDGET seconds;
#   2. benchmarks/moe_layer.py on GPU 0 with what is left: dsv3_layer (bf16, torchao fp8 rowwise, ours fp8_rowwise,
#      ours mxfp8 mx128), then llama_moe (bf16, tensorwise shared expert + torchao / ours mx128).
# From the repo root, carrying .whl:
#     run(command="bash benchmarks/issue9_x2_device_run.sh", kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600)
# $OUT/e2e_x2.tgz + e2e_x2.log (part 1), $OUT/layer/*.json + layer.log (part 2).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
BUDGET=${X9_BUDGET:-585}
X2_RECIPES=${X2_RECIPES:-bf16,tensorwise,tensorwise_mx128_experts,mxfp8_mx128_linears} X2_STEPS=${X2_STEPS:-25} \
  X2_BUDGET=${X2_BUDGET:-330} bash benchmarks/e2e_x2_device_run.sh speed
export PYTHONPATH=$PWD:/tmp/site
mkdir -p "$OUT/layer"
{
for shape in dsv3_layer llama_moe; do
  left=$((BUDGET - SECONDS - 10))
  [ "$shape" = dsv3_layer ] && left=$((left * 55 / 100))
  [ $left -gt 60 ] || { echo "moe_layer $shape: no time left ($left s)"; continue; }
  if [ "$shape" = dsv3_layer ]; then V="bf16,torchao_fp8,fp8_rowwise,mxfp8_mx128"; else V="bf16,tw:torchao_fp8,tw:mxfp8_mx128"; fi
  echo "moe_layer $shape: $left s"
  CUDA_VISIBLE_DEVICES=0 timeout $left python3 benchmarks/moe_layer.py --shapes $shape --variants "$V" --rounds 2 \
      --iters 8 --warmup 2 --deadline-s $((left - 30)) --out "$OUT/layer" 2>&1 | grep -v Warn | grep -v "^  host" | tail -8
  for f in "$OUT"/layer/moe_layer-*.json; do [ -f "$f" ] && mv "$f" "$OUT/layer/$shape.json"; done
done
} > "$OUT/layer.log" 2>&1
tail -20 "$OUT/layer.log"
