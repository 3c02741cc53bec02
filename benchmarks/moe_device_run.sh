#!/bin/bash
# One device call for kernels/moe's quantizers and the fused float8 experts (issue 9), nvidia-h100-x1:
#   (a) GPU tests of kernels/moe and the fused path, (b) benchmarks/moe_kernels.py (quantizers vs copy bandwidth),
#   (c) benchmarks/moe_layer.py (bf16 / torchao fp8 / ours fp8_rowwise / mxfp8 mx128), then (d) the launch-config
#   sweep of moe_kernels.py in whatever time is left. Each stage has its own time limit; logs and JSON go to $OUT.
# From the repo root on the device, with .whl (torchao, nvidia-cutlass wheels) carried:
#   bash benchmarks/moe_device_run.sh [checkout, default .] [total seconds, default 320] [sweep-first]
# (a helper's worktree copied to .carry/<name>: bash .carry/<name>/benchmarks/moe_device_run.sh .carry/<name>)
set -u
CHECKOUT=${1:-.}
TOTAL=${2:-320}
ORDER=${3:-layer-first}
T0=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || echo "carried wheels did not install"
cd "$CHECKOUT" && export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
# the CUTLASS extension (about 65 s of nvcc) builds in the background while the kernel tests run
(python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS extension ready')" \
    > /tmp/cutlass_build.log 2>&1) &
BUILD=$!
timeout 150 python3 -m pytest -x -q tests/gpu/test_moe_kernels_gpu.py 2>&1 | tee "$OUT/gpu_tests_kernels.log" | tail -4
wait $BUILD; tail -3 /tmp/cutlass_build.log
timeout 150 python3 -m pytest -x -q tests/gpu/test_float8_moe_fused_gpu.py 2>&1 | tee "$OUT/gpu_tests_fused.log" | tail -4
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 60 python3 benchmarks/moe_kernels.py --out "$OUT" --no-compile --recipes fp8_rowwise,mxfp8/128 \
    2>&1 | tee "$OUT/moe_kernels.log"
run_layer() {
    local lim; lim=$(left); [ "$lim" -gt 40 ] || { echo "no time left for moe_layer"; return; }
    timeout "$lim" python3 benchmarks/moe_layer.py --deadline-s $(( lim - 45 )) \
        --variants bf16,torchao_fp8,fp8_rowwise,mxfp8_mx128 --out "$OUT" 2>&1 | tee "$OUT/moe_layer.log" | tail -14
}
run_sweep() {
    local lim; lim=$(( $(left) - ${1:-0} )); [ "$lim" -gt 20 ] || { echo "no time left for the sweep"; return; }
    timeout "$lim" python3 benchmarks/moe_kernels.py --out "$OUT/sweep" --no-compile --shapes dsv3_layer \
        --recipes fp8_rowwise,mxfp8/128 --sweep 2>&1 | grep -E "^  (fp8_rowwise|mxfp8)|sweep|Error" | tee "$OUT/sweep.log"
}
if [ "$ORDER" = sweep-first ]; then run_sweep 190; run_layer; else run_layer; run_sweep; fi
echo "total $(( $(date +%s) - T0 )) s"
