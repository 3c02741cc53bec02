#!/bin/bash
# Issue 10, session 23, ONE call on one GPU: the quantizer holding its tile in the storage type
# (kernels/grouped_gemm/quant_triton.py) against the one it replaced, as the mx128 op pays for it.
#   1. build the CUTLASS backend; GPU tests of the quantizers (bit for bit against quant.py, the MXFP8 Linear's);
#   2. benchmarks/mx128_op_breakdown.py --quant: the op's four quantizer launches one by one (TB/s);
#   3. benchmarks/mxfp8_grouped_gemm_backends.py (round-robin: bf16, torchao fp8 rowwise, the mx128 op) with this
#      tree, then again with the previous quantizer copied over it (_old_quant/, HEAD before this change: each pass
#      has its own bf16 / torchao baselines in the same call).
# _old_quant/ (untracked, so it travels with the tree) holds the quantizer it is compared with, written before the call:
#   mkdir -p _old_quant && git show fa24709:kernels/grouped_gemm/quant_triton.py > _old_quant/quant_triton.py &&
#   git show fa24709:kernels/mxfp8/triton.py > _old_quant/triton.py    (session 23 used fa24709, the tree before it)
# From the repo root:  run(command="bash benchmarks/issue10_s23_quant_run.sh", carry=[".whl"], timeout_s=600)
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
MAX_JOBS=16 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1 &
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_float8_mx128_linear_gpu.py \
  "tests/gpu/test_grouped_gemm_gpu.py::test_triton_blocked_quantizer_gpu_bit_identical" \
  tests/gpu/test_mxfp8_format_gpu.py > "$OUT/pytest_quant.log" 2>&1
echo "pytest quant rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest_quant.log")"
grep -E "^FAILED|^ERROR|^E " "$OUT/pytest_quant.log" | head -20
wait; echo "cutlass build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
timeout 120 python3 benchmarks/mx128_op_breakdown.py --shapes dsv3_up,llama_up --ops "" --quant > "$OUT/breakdown.log" 2>&1
echo "breakdown rc=$? (${SECONDS}s)"; grep -v -i warn "$OUT/breakdown.log" | grep -v '"""' | cut -c1-150
[ -f _old_quant/quant_triton.py ] || { echo "_old_quant/ missing (see the header)"; exit 1; }
B="benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cutlass --ops torchao_fp8_rowwise,op_mx128_cutlass"
B="$B --no-cublas --rounds 20"
timeout 150 python3 $B > "$OUT/backends_new.log" 2>&1
echo "backends new rc=$? (${SECONDS}s)"; grep "fwd+bwd" "$OUT/backends_new.log" | grep -v '^{'
mkdir -p "$OUT/old"; cp kernels/grouped_gemm/quant_triton.py "$OUT/new_quant_triton.py"
cp _old_quant/quant_triton.py kernels/grouped_gemm/quant_triton.py; cp _old_quant/triton.py kernels/mxfp8/triton.py
OUT="$OUT/old" timeout 150 python3 $B > "$OUT/backends_old.log" 2>&1
echo "backends old quantizer rc=$? (${SECONDS}s)"; grep "fwd+bwd" "$OUT/backends_old.log" | grep -v '^{'
