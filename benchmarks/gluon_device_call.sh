#!/bin/bash
# One device call for the Gluon mx32 kernels (issue 10): GPU tests, ncu warp-stall profiles of a few launches,
# then the benchmark (short table at the end). Logs into $OUT.
# usage (from the carried worktree root):
#   bash benchmarks/gluon_device_call.sh PYTEST_S BENCH_S "NCU_JOBS" [bench args...]
# NCU_JOBS: space-separated pass:config[:shape[:routing]] items, e.g. "fprop:default wgrad:m3" ("" for none)
# PYTEST_K (environment, optional): run only the GPU tests that pytest -k selects; the config tests are named by
# their config, e.g. PYTEST_K='c128_128_4_8_5 or c128_128_4_8_6 or new' = the MODE 5/6 candidates (2026-11-25).
# Next session (CPU-prepared candidates, one call, ~10 min; SASS counts in NOTES.md "Gluon mx32"):
#   PYTEST_K='c128_128_4_8_5 or c128_128_4_8_6 or new' bash benchmarks/gluon_device_call.sh 200 330 "" \
#     --routings even,skewed --rep 100 --skip-triton --budget-s 250 --configs default,m5p,m5w1p,m5w1u16p,m6w1p
# then, if device time remains, ncu of the candidates (PYTEST_K=none selects no test):
#   PYTEST_K=none bash benchmarks/gluon_device_call.sh 60 150 "fprop:m5p fprop:m6w1p wgrad:m5w1u16p" \
#     --routings even --rep 50 --skip-triton --shapes dsv3_up --configs default,m5p,m6w1p
# GLUON_SMI=1 (environment, optional): log SM clock / power during the benchmark and give each row its variant's
# mean clock (pass --timing steady too). Session 43's wgrad sweep at steady state (~3 min; results/issue10_s43/):
#   GLUON_SMI=1 PYTEST_K=none bash benchmarks/gluon_device_call.sh 30 560 "" --passes wgrad --routings even \
#     --shapes dsv3_up,llama_up,dsv3_down --skip-triton --timing steady --rounds 5 --settle-s 0.6 --measure-s 0.3 \
#     --budget-s 400 --configs default,m12,w11,m11s5,g4,g16,w12g4,w12g16
T1=${1:-120}; T2=${2:-240}; JOBS=$3; shift 3
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
t0=$(date +%s)
KARGS=(); [ -n "$PYTEST_K" ] && KARGS=(-k "$PYTEST_K")
timeout $T1 python -m pytest -q -p no:cacheprovider "${KARGS[@]}" tests/gpu/test_grouped_gemm_gluon_gpu.py > $OUT/pytest.log 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 ))s)"; tail -4 $OUT/pytest.log
for j in $JOBS; do
  IFS=: read p c sh r <<< "$j"
  k=_nt_grouped; [ "$p" = wgrad ] && k=_wgrad_kernel
  n=ncu_${p}_${c}_${sh:-dsv3_up}_${r:-even}
  timeout 90 ncu --clock-control none --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section SpeedOfLight --section ComputeWorkloadAnalysis -k regex:$k -s 2 -c 1 -f -o $OUT/$n \
    python benchmarks/gluon_ncu_one.py $p $c ${sh:-dsv3_up} ${r:-even} > /tmp/$n.run.log 2>&1 || tail -5 /tmp/$n.run.log
  ncu -i $OUT/$n.ncu-rep --page details > $OUT/$n.details.txt 2>&1
  ncu -i $OUT/$n.ncu-rep --page source --csv --print-source sass > $OUT/$n.sass.csv 2>&1
  ncu -i $OUT/$n.ncu-rep --page raw --csv > $OUT/$n.raw.csv 2>&1
  echo "## $n" > /tmp/$n.stalls.txt
  python benchmarks/gluon_ncu_stalls.py $OUT/$n.raw.csv >> /tmp/$n.stalls.txt 2>&1
  python benchmarks/gluon_ncu_stalls.py --sass $OUT/$n.sass.csv >> /tmp/$n.stalls.txt 2>&1
  cat /tmp/$n.stalls.txt >> $OUT/ncu_stalls.txt; head -40 /tmp/$n.stalls.txt
  rm -f $OUT/$n.ncu-rep $OUT/$n.raw.csv $OUT/$n.details.txt; gzip -f $OUT/$n.sass.csv
  echo "== $n ($(( $(date +%s) - t0 ))s)"
done
rm -f $OUT/*.ncu-rep.tmp
smi=
if [ -n "${GLUON_SMI:-}" ]; then  # an nvidia-smi clock/power log, read back by the benchmark (--timing steady rows)
  source benchmarks/smi_log.sh; start_smi_log $OUT/gpu_clocks.csv; smi=$SMI_PID
  set -- "$@" --smi-log $OUT/gpu_clocks.csv
fi
PYTHONUNBUFFERED=1 timeout $T2 python benchmarks/mxfp8_grouped_gemm_gluon.py "$@" > $OUT/bench.log 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 ))s)"; [ -n "$smi" ] && kill $smi
grep -v '^{' $OUT/bench.log | tail -80
echo "pytest:"; grep -E "passed|failed|error" $OUT/pytest.log | tail -3; grep -E "^FAILED|^ERROR" $OUT/pytest.log | head -20
