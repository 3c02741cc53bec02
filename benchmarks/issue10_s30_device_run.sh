#!/bin/bash
# Issue 10, session 30: the expert op's x / dO copies on the CUDA C++ rowcol quantizer (kernels/grouped_gemm/
# quant_cuda.py, now the "auto" pick on sm_90) checked and timed where the user pays, beside the Triton quantizer
# (the _tq op rows: TITAN_FP8_ROWCOL_QUANT=triton), bf16 and torchao in the same rounds. One call on one GPU:
#   1. build the CUTLASS backend and the quantizer (background); GPU tests: the CUDA quantizer bit for bit against
#      quant.py (4 layouts, awkward cases, both tile orders, the switch eager and compiled), the Triton one at its
#      default tiles, the autograd op against its emulated twin (mx128 and mx32, now on the CUDA quantizer);
#   2. benchmarks/mxfp8_grouped_gemm_backends.py op rows, round-robin: bf16, torchao fp8 rowwise, mx128 (CUTLASS)
#      and mx32 (Gluon), each with the CUDA and with the Triton quantizer.
# PART=2: benchmarks/mx128_op_breakdown.py (GPU time per kernel) for the same four op rows, three shapes.
# From the repo root:  run(command="bash benchmarks/issue10_s30_device_run.sh", carry=[".whl"], timeout_s=600)
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
if [ "${PART:-1}" = 1 ]; then
MAX_JOBS=16 timeout 330 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1 &
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_gpu.py \
  -k "cuda_rowcol or (quantizer_gpu_bit_identical and default) or autograd_op_gpu" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
wait; echo "cutlass build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
timeout $(( 590 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours "" --no-cublas --rounds 15 \
  --ops torchao_fp8_rowwise,op_mx128_cutlass,op_mx128_cutlass_tq,op_mx32_gluon,op_mx32_gluon_tq \
  > "$OUT/backends.log" 2>&1
echo "backends rc=$? (${SECONDS}s)"; grep "fwd+bwd" "$OUT/backends.log" | grep -v '^{' | cut -c1-120
else
MAX_JOBS=16 timeout 330 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1
echo "cutlass build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
timeout $(( 590 - SECONDS )) python3 benchmarks/mx128_op_breakdown.py --shapes dsv3_up,dsv3_down,llama_up \
  --ops bf16,op_mx128_cutlass,op_mx128_cutlass_tq,op_mx32_gluon,op_mx32_gluon_tq > "$OUT/breakdown.log" 2>&1
echo "breakdown rc=$? (${SECONDS}s)"; grep "^== " "$OUT/breakdown.log"
fi
