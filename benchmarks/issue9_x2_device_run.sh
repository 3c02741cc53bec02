#!/bin/bash
# Issue 9 acceptance 2 and 3 (and issue 10's 3) in ONE call on nvidia-h200-x2, inside X9_BUDGET seconds (default 585):
#   1. benchmarks/e2e_x2_device_run.sh speed with X2_RECIPES (default: bf16, tensorwise + mx128 experts, tensorwise,
#      mx128 Linears + experts, then bf16 again for the run-to-run spread), X2_TESTS first (GPU tests; no timed runs
#      if they fail), X2_BUDGET seconds (default 330);
#   2. benchmarks/moe_layer.py on GPU 0 with what is left, one shape after the other: dsv3_layer (bf16, torchao fp8
#      rowwise, ours fp8_rowwise, mxfp8 mx128, mxfp8 mx32), then llama_moe (bf16 and, with the shared expert in
#      float8 tensorwise: bf16 experts, torchao fp8 rowwise, ours fp8_rowwise, mxfp8 mx128).
#      X9_LAYER_ONLY=1 skips part 1.
# From the repo root, carrying .whl:
#     run(command="bash benchmarks/issue9_x2_device_run.sh", kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600)
# $OUT/e2e_x2.tgz + e2e_x2.log (part 1), $OUT/layer_<shape>.json + .log (part 2).
set -u
BUDGET=${X9_BUDGET:-585}
if [ -z "${X9_LAYER_ONLY:-}" ]; then
  X2_RECIPES=${X2_RECIPES:-bf16,tensorwise_mx128_experts,tensorwise,mxfp8_mx128_linears,bf16_b:bf16} \
    X2_STEPS=${X2_STEPS:-25} X2_BUDGET=${X2_BUDGET:-330} bash benchmarks/e2e_x2_device_run.sh speed
fi
source benchmarks/device_env.sh  # part 1 ran in its own shell: its exports are not here
[ -z "${X9_LAYER_ONLY:-}" ] || MAX_JOBS=32 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load()" 2>&1 | tail -1
left=$((BUDGET - SECONDS - 15))
[ $left -gt 60 ] || { echo "moe_layer: no time left ($left s)"; exit 0; }
layer() {  # shape gpu variants
  CUDA_VISIBLE_DEVICES=$2 timeout $left python3 benchmarks/moe_layer.py --shapes $1 --variants "$3" --rounds 2 \
      --iters 8 --warmup 2 --deadline-s $((left - 30)) --out "$OUT/layer_$1" > "$OUT/layer_$1.log" 2>&1
  for f in "$OUT"/layer_$1/moe_layer-*.json; do [ -f "$f" ] && mv "$f" "$OUT/layer_$1.json"; done
  rmdir "$OUT/layer_$1" 2>/dev/null
}
# One shape after the other, not one per GPU at once: the float8 llama_moe layer's synced time is mostly host time
# (4.8-7.4 ms a step across session 14's runs), and a second benchmark process on the same host can only add to it.
echo "moe_layer: $left s"
left=$((left * 55 / 100))
layer dsv3_layer 0 "${X9_DSV3:-bf16,torchao_fp8,fp8_rowwise,mxfp8_mx128,mxfp8_mx32}"
left=$((BUDGET - SECONDS - 10))
[ $left -gt 60 ] && layer llama_moe 0 "${X9_LLAMA:-bf16,tw:bf16,tw:torchao_fp8,tw:fp8_rowwise,tw:mxfp8_mx128}"
for s in dsv3_layer llama_moe; do echo "== $s"; grep -v Warn "$OUT/layer_$s.log" | grep -v "^  host" | tail -9; done
