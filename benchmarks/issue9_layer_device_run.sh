#!/bin/bash
# Issue 9 on ONE GPU (nvidia-h100-x1 / nvidia-h200): the GPU tests of what changed (X9_TESTS / X9_K), then
# benchmarks/moe_layer.py at X9_SHAPE (default llama_moe) for X9_VARIANTS, with the largest allocations alive at a
# step's memory peak (--mem-peak). From the repo root, carrying .whl:
#     run(command="bash benchmarks/issue9_layer_device_run.sh", kind="nvidia-h100-x1", carry=[".whl"])
# $OUT: pytest.log, layer.log, layer.json.
source benchmarks/device_env.sh
MAX_JOBS=16 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')" 2>&1 | tail -1
echo "build: ${SECONDS}s"
TESTS=${X9_TESTS:-tests/gpu/test_grouped_gemm_cutlass_gpu.py tests/gpu/test_float8_moe_fused_gpu.py}
timeout ${X9_TEST_S:-240} python3 -m pytest -q -p no:cacheprovider -k "${X9_K:-dgrad or parts or fused or twin}" \
    $TESTS > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head -20
timeout ${X9_LAYER_S:-300} python3 benchmarks/moe_layer.py --shapes ${X9_SHAPE:-llama_moe} \
    --variants "${X9_VARIANTS:-bf16,tw:mxfp8_mx128}" --rounds 2 --iters 8 --warmup 2 --mem-peak ${X9_MEM_PEAK:-8} \
    --out "$OUT/layer" > "$OUT/layer.log" 2>&1
echo "layer rc=$? (${SECONDS}s)"
for f in "$OUT"/layer/moe_layer-*.json; do [ -f "$f" ] && mv "$f" "$OUT/layer.json"; done
rmdir "$OUT/layer" 2>/dev/null
grep -v Warn "$OUT/layer.log" | grep -v "^  host" | tail -40
