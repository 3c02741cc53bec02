#!/bin/bash
# benchmarks/timing_probe.py on one GPU (builds the CUTLASS extension first):
#     run(command="bash benchmarks/timing_probe_device_run.sh", kind="nvidia-h100-x1", carry=[".whl"])
# $OUT: probe.log, timing_probe-*.json, clocks.csv (SM clock, power, temperature every 50 ms).
source benchmarks/device_env.sh
MAX_JOBS=16 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')" 2>&1 | tail -1
echo "build: ${SECONDS}s"
timeout ${PROBE_S:-300} python3 benchmarks/timing_probe.py ${PROBE_ARGS:-} > "$OUT/probe.log" 2>&1
echo "probe rc=$? (${SECONDS}s)"
grep -v '^{' "$OUT/probe.log" | grep -v Warn | tail -20
