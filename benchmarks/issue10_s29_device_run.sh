#!/bin/bash
# Issue 10, session 29: the quantizers' new launch configurations (rowcol_launch: 64 x 128 programs at 2 warps for
# the mx32 dO^T and W^T copies) checked and timed where the user pays. Two calls on one GPU:
# PART=1 (call 4 of benchmarks/results/issue10_s29/):
#   1. build the CUTLASS backend (background); GPU tests: the quantizer bit for bit at every program tile, the
#      experts op against its emulated twin and compiled, the mx32 Linear, gathered weights, the Gluon experts op
#      (the pytest step is cut at 200 s: PART=2 runs what it did not reach);
#   2. benchmarks/quant_rowcol_launch.py --recipes mx32 (the new defaults beside every configuration);
#   3. benchmarks/mxfp8_grouped_gemm_backends.py op rows: bf16, torchao, mx128, mx32 and mx32 as in session 28
#      (op_mx32_gluon_s28), round-robin, 20 rounds.
# PART=2 (call 5): the GPU tests PART=1 did not reach; benchmarks/mx128_op_breakdown.py: GPU time per kernel of the
#   mx32 op with the new and the session-28 quantizer launches, beside bf16, three shapes.
# Calls 4 and 5 held op_mx32_gluon_s28's rule over the forward call only (the backward's quantizations, where the
# change is, ran the new rule in both rows): benchmarks/mxfp8_grouped_gemm_backends.fwd_bwd now holds it over both.
# PART=3 (call 6): the breakdown and the op rows again (bf16, torchao, mx32, mx32 as in session 28), no CUTLASS.
# From the repo root:  run(command="PART=1 bash benchmarks/issue10_s29_device_run.sh", carry=[".whl"], timeout_s=600)
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
if [ "${PART:-1}" = 1 ]; then
MAX_JOBS=16 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1 &
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_gpu.py \
  tests/gpu/test_float8_mx32_linear_gpu.py tests/gpu/test_float8_mxfp8_gathered_gpu.py \
  "tests/gpu/test_grouped_gemm_gluon_gpu.py::test_experts_op_routes_to_gluon" \
  "tests/gpu/test_grouped_gemm_gluon_gpu.py::test_wgrad_on_token_major_scale_layout" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
timeout 150 python3 benchmarks/quant_rowcol_launch.py --recipes mx32 --warps 2,4 > "$OUT/quant.log" 2>&1
echo "quant rc=$? (${SECONDS}s)"; sed -n '/^fastest/,$p' "$OUT/quant.log" | grep -v '^wrote'
wait; echo "cutlass build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
left=$(( 585 - SECONDS ))
timeout $left python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours "" --no-cublas --rounds 20 \
  --ops torchao_fp8_rowwise,op_mx128_cutlass,op_mx32_gluon,op_mx32_gluon_s28 > "$OUT/backends.log" 2>&1
echo "backends rc=$? (${SECONDS}s)"; grep "fwd+bwd" "$OUT/backends.log" | grep -v '^{' | cut -c1-112
elif [ "$PART" = 2 ]; then
timeout 260 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_float8_mx32_linear_gpu.py tests/gpu/test_float8_mxfp8_gathered_gpu.py \
  "tests/gpu/test_grouped_gemm_gluon_gpu.py::test_experts_op_routes_to_gluon" \
  "tests/gpu/test_grouped_gemm_gluon_gpu.py::test_wgrad_on_token_major_scale_layout" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
timeout $(( 585 - SECONDS )) python3 benchmarks/mx128_op_breakdown.py --shapes dsv3_up,dsv3_down,llama_up \
  --ops bf16,op_mx32_gluon,op_mx32_gluon_s28 > "$OUT/breakdown.log" 2>&1
echo "breakdown rc=$? (${SECONDS}s)"; grep "^== " "$OUT/breakdown.log"
grep -E "_rowcol|blocked" "$OUT/breakdown.log" | cut -c1-110
else
timeout 120 python3 benchmarks/mx128_op_breakdown.py --shapes dsv3_up,dsv3_down,llama_up \
  --ops bf16,op_mx32_gluon,op_mx32_gluon_s28 > "$OUT/breakdown.log" 2>&1
echo "breakdown rc=$? (${SECONDS}s)"; grep "^== " "$OUT/breakdown.log"
timeout $(( 300 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours "" --no-cublas --rounds 20 \
  --ops torchao_fp8_rowwise,op_mx32_gluon,op_mx32_gluon_s28 > "$OUT/backends.log" 2>&1
echo "backends rc=$? (${SECONDS}s)"; grep "fwd+bwd" "$OUT/backends.log" | grep -v '^{' | cut -c1-112
fi
