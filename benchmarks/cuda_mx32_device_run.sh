#!/bin/bash
# The CUDA C++ mx32 grouped GEMM (kernels/grouped_gemm/cuda_mx.py, issue 10) in ONE call on one GPU:
#   1. build the compile-time variants named in MX32_VARIANTS (';'-separated, 'default' = the file's settings);
#   2. its GPU tests (float64 reference at awkward group sizes, bit for bit against the Gluon kernel);
#   3. benchmarks/mxfp8_grouped_gemm_gluon.py: bf16 torch._grouped_mm, the Gluon default and every variant,
#      fprop + dgrad (+ Gluon wgrad), round-robin, E=8 x 8192 tokens, 3 shapes, MX32_ROUTINGS (even,skewed).
# From the repo root, carrying .whl (nvidia-cutlass):
#     run(command="bash benchmarks/cuda_mx32_device_run.sh", carry=[".whl"], timeout_s=600)
#   4. MX32_NCU="pass:shape ..." (optional): ncu warp-stall summaries of one launch each (benchmarks/
#      cuda_mx32_ncu_one.py + gluon_ncu_stalls.py), e.g. MX32_NCU="fprop:dsv3_up".
# $OUT: build.log, pytest.log, bench.log (+ json), ncu_*.raw.csv.gz / .sass.csv.gz.
source benchmarks/device_env.sh
VARIANTS=${MX32_VARIANTS:-default}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
IFS=';' read -ra VS <<< "$VARIANTS"
for v in "${VS[@]}"; do
  vv=$([ "$v" = default ] && echo "" || echo "$v" | sed -E 's/(^|,)GROUP_M=[0-9]+//; s/^,//')
  MAX_JOBS=16 timeout 300 python3 -c "from kernels.grouped_gemm import cuda_mx as c; c.load('$vv'); print('built $v')" \
    >> "$OUT/build.log" 2>&1 || { echo "BUILD FAILED: $v"; tail -30 "$OUT/build.log"; }
done
echo "build: ${SECONDS}s"; grep -c built "$OUT/build.log"
if [ -z "${MX32_SKIP_TESTS:-}" ]; then
timeout ${MX32_TEST_S:-150} python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_grouped_gemm_cuda_mx_gpu.py \
    > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR|Error|assert" "$OUT/pytest.log" | head -20
fi
timeout ${MX32_BENCH_S:-400} python3 benchmarks/mxfp8_grouped_gemm_gluon.py --routings ${MX32_ROUTINGS:-even,skewed} \
    --skip-triton --configs default --cuda "$VARIANTS" --rounds ${MX32_ROUNDS:-30} ${MX32_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "bench rc=$? (${SECONDS}s)"; grep -v '^{' "$OUT/bench.log" | tail -60
for j in ${MX32_NCU:-}; do
  IFS=: read p sh <<< "$j"; n=ncu_cuda_${p}_${sh}
  timeout 150 ncu --clock-control none --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section SpeedOfLight -k regex:nt_kernel -s 2 -c 1 -f -o $OUT/$n \
    python3 benchmarks/cuda_mx32_ncu_one.py $p $sh even > $OUT/$n.run.log 2>&1 || tail -5 $OUT/$n.run.log
  ncu -i $OUT/$n.ncu-rep --page raw --csv > $OUT/$n.raw.csv 2>&1
  ncu -i $OUT/$n.ncu-rep --page source --csv --print-source sass > $OUT/$n.sass.csv 2>&1
  python3 benchmarks/gluon_ncu_stalls.py $OUT/$n.raw.csv 2>&1 | head -22
  python3 benchmarks/gluon_ncu_stalls.py --sass $OUT/$n.sass.csv 2>&1 | head -12
  rm -f $OUT/$n.ncu-rep; gzip -f $OUT/$n.sass.csv $OUT/$n.raw.csv
done
