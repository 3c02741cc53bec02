#!/bin/bash
# Issue 10, prepared in session 44, run in session 45 (benchmarks/results/issue10_s45/call1_op_ab/): the x / dO
# quantizer's one-CTA-per-tile grid (session 44's new default, 1.08-1.24x the persistent grid of 2 CTAs per SM at
# the kernel) measured where the user pays:
#   1. the GPU tests of the CUDA quantizer (both grids, byte for byte against quant.py), while CUTLASS builds;
#   2. the whole mx128 / mx32 ops fwd+bwd, each with the new grid and with the old one (_qp2 rows: quant_cuda.
#      CTAS_PER_SM = 2 over forward and backward), beside bf16 and torchao, round-robin, one run
#      (benchmarks/mxfp8_grouped_gemm_backends.py, no kernel rows: --ours "");
#   3. the same at steady state (STEADY=1; each op at its own clock under the power cap).
# Session 44's inline version hung in its wait for the CUTLASS build (`pgrep -f` matched its own command line);
# this one waits on the build's PID.
# From the repo root:  run(command="bash benchmarks/issue10_s44_op_ab.sh", kind="nvidia-h200", carry=[".whl"])
source benchmarks/device_env.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
MAX_JOBS=12 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1 &
build=$!
timeout 150 python3 -m pytest -q tests/gpu/test_grouped_gemm_gpu.py -k cuda_rowcol > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"
wait $build
echo "CUTLASS build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log" | cut -c1-150)"
OPS=torchao_fp8_rowwise,op_mx128_cutlass,op_mx128_cutlass_qp2,op_mx32_gluon,op_mx32_gluon_qp2
timeout 240 python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours "" --no-cublas --ops $OPS \
  --rounds ${ROUNDS:-15} > "$OUT/ops.log" 2>&1
echo "ops rc=$? (${SECONDS}s)"; grep -E "fwd\+bwd|rror" "$OUT/ops.log" | cut -c1-140
if [ -n "${STEADY:-}" ]; then
  source benchmarks/smi_log.sh; start_smi_log "$OUT/gpu_clocks.csv"
  timeout 240 python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours "" --no-cublas --ops $OPS --timing steady \
    --smi-log "$OUT/gpu_clocks.csv" --rounds 3 --settle-s 0.6 --measure-s 0.3 > "$OUT/ops_steady.log" 2>&1
  echo "steady rc=$? (${SECONDS}s)"; kill $SMI_PID 2>/dev/null
  grep -E "fwd\+bwd|rror" "$OUT/ops_steady.log" | cut -c1-140
fi
