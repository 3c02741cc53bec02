#!/bin/bash
# Issue 10, session 40, on ONE H200 (REQUIRE=H200 exits on any other GPU; REQUIRE= runs anywhere).
#   PART=quant: the CUTLASS build in the background; the expert op's x / dO quantizer (kernels/grouped_gemm/cuda_quant)
#     beside build-time variants of it (VARIANTS: TAG=-DDEFINE,... ; default: 3 CTAs per SM, streaming stores,
#     evict-first loads, 3 CTAs + streaming stores: -D switches the kernel had at commit 3facba4, run from that
#     tree; removed after they measured slower), round-robin with a plain copy (benchmarks/quant_rowcol_cuda.py,
#     byte check first); then where the whole mx128 op's GPU time goes on this GPU (benchmarks/mx128_op_breakdown.py).
#   PART=final: the committed benchmark of the issue in one run (benchmarks/mxfp8_grouped_gemm_backends.py: mx128
#     CUTLASS and mx32 Gluon kernels and whole ops beside bf16, torch fp8 rowwise, cuBLAS blockwise, torchao).
#   PART=linear: the MXFP8 Linear fwd+bwd, compiled, beside bf16 (benchmarks/float8_linear.py) at 8192x4096->4096.
#   PART=steady (session 42): PART=final's variants at steady state (--timing steady: each variant back to back at
#     its own clock under the power cap; STEADY_ARGS overrides rounds / settle / measure), with an nvidia-smi log
#     ($OUT/gpu_clocks.csv) that gives each row its variant's mean SM clock and power; cuBLAS blockwise left out
#     (time: the round-robin run of PART=final has it). PYTEST_K (optional): the Gluon GPU tests it selects
#     (pytest -k) run while CUTLASS builds, before the benchmark.
# From the repo root:  run(command="PART=quant bash benchmarks/issue10_s40_device_run.sh", kind="nvidia-h200",
#                          carry=[".whl"])
source benchmarks/device_env.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
case "$name" in *"${REQUIRE-H200}"*) ;; *) echo "not an ${REQUIRE-H200}: nothing run"; exit 0 ;; esac
build_cutlass() {
  MAX_JOBS=12 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
    > "$OUT/build_cutlass.log" 2>&1
}
case "${PART:-quant}" in
quant)
  build_cutlass &
  VARIANTS=${VARIANTS:-mb3=-DROWCOL_MIN_BLOCKS=3 cs=-DROWCOL_STREAM_STORES ef=-DROWCOL_EVICT_FIRST_LOADS mb3cs=-DROWCOL_MIN_BLOCKS=3,-DROWCOL_STREAM_STORES}
  args=""; for v in $VARIANTS; do
    args="$args --variant $v"; tag=${v%%=*}
    timeout 300 python3 -c "from kernels.grouped_gemm import quant_cuda as q
q.load_source(q.SOURCE_PATH, 'v_$tag', '${v#*=}'.split(',')); print('built')" > "$OUT/build_$tag.log" 2>&1 &
  done
  timeout 300 python3 -c "from kernels.grouped_gemm import quant_cuda as q; q.load(); print('built')" \
    > "$OUT/build_rowcol.log" 2>&1
  sleep 1; while [ $(jobs -r | wc -l) -gt 1 ]; do sleep 2; done  # the quantizer builds (the CUTLASS one may go on)
  echo "quantizer builds (${SECONDS}s):"; for f in "$OUT"/build_[a-z]*.log; do echo "  $(basename $f): $(tail -1 $f | cut -c1-150)"; done
  timeout 300 python3 benchmarks/quant_rowcol_cuda.py --rounds ${ROUNDS:-20} $args > "$OUT/quant.log" 2>&1
  echo "quant rc=$? (${SECONDS}s)"; grep -v '^{' "$OUT/quant.log" | grep -E "ms|MISMATCH|rror" | cut -c1-110
  wait; echo "build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
  timeout $(( 585 - SECONDS )) python3 benchmarks/mx128_op_breakdown.py --shapes dsv3_up,dsv3_down,llama_up \
    --routing even --ops bf16,op_mx128_cutlass > "$OUT/breakdown.log" 2>&1
  echo "breakdown rc=$? (${SECONDS}s)"; grep -E "^==|  x[0-9] " "$OUT/breakdown.log" | cut -c1-110 | head -40
  ;;
final)
  build_cutlass; echo "build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
  timeout $(( 590 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cutlass,mx32_gluon \
    --ops torchao_fp8_rowwise,op_mx128_cutlass,op_mx32_gluon --rounds ${ROUNDS:-15} > "$OUT/backends.log" 2>&1
  echo "backends rc=$? (${SECONDS}s)"
  grep -v '^{' "$OUT/backends.log" | grep -E "fprop|dgrad|wgrad|fwd\+bwd" | cut -c1-125
  ;;
steady)
  if [ -n "${PYTEST_K:-}" ]; then  # (session 43) the Gluon GPU tests that -k selects, while CUTLASS builds
    { timeout 240 python3 -m pytest -q -p no:cacheprovider -k "$PYTEST_K" tests/gpu/test_grouped_gemm_gluon_gpu.py \
        > "$OUT/pytest.log" 2>&1; echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; } &
  fi
  build_cutlass; echo "build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
  wait  # (the tests, before anything is timed)
  source benchmarks/smi_log.sh; start_smi_log "$OUT/gpu_clocks.csv"
  timeout $(( 590 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cutlass,mx32_gluon \
    --ops torchao_fp8_rowwise,op_mx128_cutlass,op_mx32_gluon --no-cublas --timing steady \
    --smi-log "$OUT/gpu_clocks.csv" ${STEADY_ARGS:---rounds 3 --settle-s 0.6 --measure-s 0.3} > "$OUT/backends.log" 2>&1
  echo "backends rc=$? (${SECONDS}s)"; kill $SMI_PID
  grep -v '^{' "$OUT/backends.log" | grep -E "fprop|dgrad|wgrad|fwd\+bwd" | cut -c1-132
  ;;
linear)
  timeout 560 python3 benchmarks/float8_linear.py ${LINEAR_ARGS:---shapes acceptance --recipes mxfp8_mx128,tensorwise --out $OUT} > "$OUT/linear.log" 2>&1
  echo "linear rc=$? (${SECONDS}s)"; grep -v '^{' "$OUT/linear.log" | tail -30 | cut -c1-140
  ;;
esac
