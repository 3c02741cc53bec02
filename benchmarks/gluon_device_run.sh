#!/bin/bash
# One device call for the Gluon mx32 kernels: GPU tests, then the benchmark (short table at the end).
# usage (from the carried worktree root): bash benchmarks/gluon_device_run.sh [pytest_s] [bench_s] [bench args...]
T1=${1:-150}; T2=${2:-180}; shift 2
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
timeout $T1 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_grouped_gemm_gluon_gpu.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; tail -25 $OUT/pytest.log
PYTHONUNBUFFERED=1 timeout $T2 python benchmarks/mxfp8_grouped_gemm_gluon.py "$@" > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -v '^{' $OUT/bench.log | tail -70
