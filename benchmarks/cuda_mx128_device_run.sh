#!/bin/bash
# The CuTe mx128 grouped GEMM (kernels/grouped_gemm/cuda_mx/mx128_grouped.cu) in ONE call on one GPU:
#   1. build the CUTLASS backend and the cuda_mx extension under each compile-time variant of MX128_VARIANTS
#      (';'-separated, "" = the file's settings; e.g. "MX128_BLOCK_STAGES=2"), side by side; a short smoke launch
#      (a cluster or barrier hang must not eat the call);
#   2. its GPU tests (-k mx128: float64 reference, bit for bit against the CUTLASS backend);
#   3. benchmarks/cuda_mx128_probe.py: bf16, the CUTLASS default, the kernel and each variant, fprop + dgrad;
#   4. ncu of one fprop launch at dsv3_up (warp stalls, the hot loop's instruction mix: gluon_ncu_stalls.py) of
#      MX128_NCU_VARIANT (a mx128_ncu_one.py variant, default "cuda").
# From the repo root:  run(command="bash benchmarks/cuda_mx128_device_run.sh", carry=[".whl"], timeout_s=540)
# $OUT: build_*.log, smoke.log, pytest.log, probe.log (+ json), ncu_cuda_fprop_dsv3_up.{raw,sass}.csv.gz.
source benchmarks/device_env.sh
IFS=';' read -ra VS <<< "${MX128_VARIANTS:-}"
MAX_JOBS=8 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
  > "$OUT/build_cutlass.log" 2>&1 &
PROBE="cutlass;cuda"
for v in "" "${VS[@]}"; do
  MAX_JOBS=3 timeout 300 python3 -c "from kernels.grouped_gemm import cuda_mx as c; c.load('$v'); print('built $v')" \
    >> "$OUT/build_cuda.log" 2>&1 &
  [ -n "$v" ] && PROBE="$PROBE;cuda:$v"
done
wait
echo "builds (${SECONDS}s): $(grep -c built "$OUT/build_cuda.log") cuda, cutlass: $(tail -1 "$OUT/build_cutlass.log")"
timeout 60 python3 benchmarks/cuda_mx128_smoke.py > "$OUT/smoke.log" 2>&1
grep -q "smoke ok" "$OUT/smoke.log" || { echo "SMOKE FAILED: stopping"; tail -5 "$OUT/smoke.log"; exit 1; }
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_cuda_mx_gpu.py -k mx128 \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^E  " "$OUT/pytest.log" | head -8
timeout 200 python3 benchmarks/cuda_mx128_probe.py --variants "$PROBE" > "$OUT/probe.log" 2>&1
echo "probe rc=$? (${SECONDS}s)"; grep -v "^{" "$OUT/probe.log" | tail -32
n=ncu_cuda_fprop_dsv3_up
timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section SourceCounters --section ComputeWorkloadAnalysis -k regex:nt_kernel -s 2 -c 1 -f -o "$OUT/$n" \
  python3 benchmarks/mx128_ncu_one.py "${MX128_NCU_VARIANT:-cuda}" fprop dsv3_up > "$OUT/$n.run.log" 2>&1 || tail -5 "$OUT/$n.run.log"
ncu -i "$OUT/$n.ncu-rep" --page raw --csv > "$OUT/$n.raw.csv" 2>&1
ncu -i "$OUT/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/$n.sass.csv" 2>&1
python3 benchmarks/gluon_ncu_stalls.py "$OUT/$n.raw.csv" 2>&1 | head -24
python3 benchmarks/gluon_ncu_stalls.py --sass "$OUT/$n.sass.csv" 2>&1 | head -6
rm -f "$OUT/$n.ncu-rep"; gzip -f "$OUT/$n.sass.csv" "$OUT/$n.raw.csv"
