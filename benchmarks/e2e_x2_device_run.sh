#!/bin/bash
# One device call on nvidia-h200-x2 per part: llama_moe end to end, 25 steps a run, median tokens/s/GPU.
#   speed  bf16, tensorwise, tensorwise + mx128 experts (the best recipe), mxfp8_mx128_linears: issue 9 acc. 3
#          and 10 acc. 3 on ONE machine; then bf16 and tw + mx128 experts again (the spread between two runs of
#          one recipe), the second profiling its last step (gaps_<run>.json from benchmarks/trace_gaps.py; the
#          traces themselves stay on the machine). X2_TESTS="tests/gpu/..." runs those GPU tests first.
#   modes  bf16, tensorwise, tensorwise + mx128 experts and mx128 Linears + experts as they are; bf16 and
#          tensorwise + mx128 experts with [parallelism] fsdp_reshard_after_forward = "never"
#          (no regather, no second weight cast in backward) and with [comm] cpu_affinity = "gpu_numa_node"
#          (session 10: the float8 runs switch between a host-bound and a GPU-bound mode; sync_wait_share shows it)
#   check  [training] nonfinite_check = "deferred" (session 11's default: the host reads a step's check one step
#          later) for bf16, tensorwise, tw + mx128 experts (also with reshard "never"), mx128 Linears; and
#          tw + mx128 experts and bf16 with the old mid-step check ("before_optimizer") beside them
#   profile bf16, tensorwise + mx128 experts and mx128 Linears + experts, each profiling its last step: GPU busy,
#          the host work the GPU waited under, and the kernels with the most GPU time (trace_gaps.py --kernels)
#   prefetch bf16 and tw + mx128 experts with and without [parallelism] fsdp_forward_prefetch = 1, each profiling
#          its last step (trace_gaps --exposed: NCCL time nothing else overlapped)
#   carveout bf16 and tw + mx128 experts with [comm] matmul_sm_carveout unset / 8 / 16 / 32 (persistent GEMMs
#          leave SMs to NCCL: session 12 saw forward all-gathers take ~10x their solo time under the GEMMs)
#   ctas   tensorwise + mx128 experts with NCCL_MAX_CTAS unset / 16 / 8
#   batch  bf16, tw + mx128 experts and mx128 Linears + experts at local_batch_size 2 (shipped) and 4: at 2 the
#          float8 steps can be host-paced (session 34; step_modes.py shows which rank paced which step), at 4 not
#   ep     FSDP only vs EP=2 with bf16 and float8 dispatch, bf16 EP: issue 12 acc. 2
#   all    session 9's list (every preset; needs two calls: run it again, it reuses finished runs)
# From the repo root, carrying .whl (torchao, nvidia-cutlass wheels) and, for a second call, outputs/e2e_x2:
#     run(command="bash benchmarks/e2e_x2_device_run.sh speed", carry=[".whl"], timeout_s=600)
# Whatever happens, the call ends inside X2_BUDGET seconds (default 560) with everything packed into
# $OUT/e2e_x2.tgz and the log in $OUT/e2e_x2.log: session 9's first call ran past its limit and returned nothing.
# X2_STEPS (default 25): steps per run. X2_RECIPES: another --recipes list for the call. X2_SMI_MS (default 500):
# the nvidia-smi clock log's interval. Each run's steps: benchmarks/step_modes.py (GPU lag per rank, clocks).
# X2_NPROC (default 2): ranks per run (1 on a one-GPU machine). X2_HOST_OPS=N: trace_gaps --host N on each
# profiled step (the host ops with the most self / inclusive time, per host thread).
set -u
PART=${1:-speed}
BUDGET=${X2_BUDGET:-560}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" outputs
LOG=$OUT/e2e_x2.log
pack() { (cd outputs && tar czf "$OUT/e2e_x2.tgz" --exclude="*.pt" e2e_x2 2>/dev/null); }
trap pack EXIT
case $PART in
  speed) P="profiling.enable_profiling=true,profiling.profile_freq=${X2_STEPS:-25}"  # the last step: not in the median
         R="bf16,tensorwise,tensorwise_mx128_experts,mxfp8_mx128_linears,bf16_b:bf16,tw_mx128_b:tensorwise_mx128_experts,$P" ;;
  modes) R="bf16,tensorwise,tensorwise_mx128_experts,mxfp8_mx128_linears,tw_mx128_never:tensorwise_mx128_experts,parallelism.fsdp_reshard_after_forward=never,bf16_never:bf16,parallelism.fsdp_reshard_after_forward=never,tw_mx128_numa:tensorwise_mx128_experts,comm.cpu_affinity=gpu_numa_node,bf16_numa:bf16,comm.cpu_affinity=gpu_numa_node" ;;
  check) R="bf16,tensorwise_mx128_experts,tw_mx128_blocking:tensorwise_mx128_experts,training.nonfinite_check=before_optimizer,tw_mx128_never:tensorwise_mx128_experts,parallelism.fsdp_reshard_after_forward=never,bf16_never:bf16,parallelism.fsdp_reshard_after_forward=never,tensorwise,mxfp8_mx128_linears,bf16_blocking:bf16,training.nonfinite_check=before_optimizer" ;;
  profile) P="profiling.enable_profiling=true,profiling.profile_freq=${X2_STEPS:-25}"  # the last step: not in the median
         R="bf16_prof:bf16,$P,tw_mx128_prof:tensorwise_mx128_experts,$P,mx128_linears_prof:mxfp8_mx128_linears,$P" ;;
  prefetch) P="profiling.enable_profiling=true,profiling.profile_freq=${X2_STEPS:-25}"
         R="bf16_prof:bf16,$P,tw_mx128_prof:tensorwise_mx128_experts,$P,tw_mx128_pf1:tensorwise_mx128_experts,parallelism.fsdp_forward_prefetch=1,$P,bf16_pf1:bf16,parallelism.fsdp_forward_prefetch=1,$P" ;;
  carveout) P="profiling.enable_profiling=true,profiling.profile_freq=${X2_STEPS:-25}"
         R="bf16,tensorwise_mx128_experts,tw_mx128_c8:tensorwise_mx128_experts,comm.matmul_sm_carveout=8,$P,tw_mx128_c16:tensorwise_mx128_experts,comm.matmul_sm_carveout=16,$P,tw_mx128_c32:tensorwise_mx128_experts,comm.matmul_sm_carveout=32,bf16_c16:bf16,comm.matmul_sm_carveout=16" ;;
  ctas) R="tensorwise_mx128_experts,tw_mx128_ctas16:tensorwise_mx128_experts,comm.nccl_max_ctas=16,tw_mx128_ctas8:tensorwise_mx128_experts,comm.nccl_max_ctas=8" ;;
  batch) R="bf16,tensorwise_mx128_experts,mxfp8_mx128_linears,bf16_b4:bf16,training.local_batch_size=4,tw_mx128_b4:tensorwise_mx128_experts,training.local_batch_size=4,mx128_linears_b4:mxfp8_mx128_linears,training.local_batch_size=4" ;;
  ep) R="bf16,tensorwise_fp8_rowwise_experts,ep2_tw_rw:tensorwise_fp8_rowwise_experts,parallelism.expert_parallel_degree=2,ep2_tw_rw_f8d:tensorwise_fp8_rowwise_experts,parallelism.expert_parallel_degree=2,dispatch_dtype=float8,ep2_bf16:bf16,parallelism.expert_parallel_degree=2" ;;
  all) R="bf16,tensorwise,tw_noag:tensorwise,enable_fsdp_float8_all_gather=false,precompute_float8_dynamic_scale_for_fsdp=false,tensorwise_fp8_rowwise_experts,tensorwise_mx128_experts,tw_ctas16:tensorwise,comm.nccl_max_ctas=16,tw_ctas8:tensorwise,comm.nccl_max_ctas=8,mxfp8_mx128,mxfp8_mx128_linears,mxfp8_mx32_experts" ;;
  *) echo "e2e_x2_device_run.sh: unknown part '$PART' (speed | modes | check | profile | prefetch | carveout | ctas | batch | ep | all)"; exit 2 ;;
esac
R=${X2_RECIPES:-$R}  # X2_RECIPES: compare.py --recipes for this call instead of the part's list
{
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
# the CUTLASS extension builds once per machine, before any timed run
MAX_JOBS=32 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')" 2>&1 | tail -1
if [ -n "${X2_TESTS:-}" ]; then
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider $X2_TESTS > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  echo "gpu tests: rc $rc ($(tail -1 "$OUT/gpu_tests.log"))"
  [ $rc -eq 0 ] || { echo "GPU tests failed: no timed runs"; exit 1; }
fi
LEFT=$((BUDGET - SECONDS - 25))
echo "compare: $LEFT s left for the runs"
# SM clock, power and temperature of both GPUs every 500 ms while the runs go (outputs/e2e_x2/gpu_clocks.csv):
# float8 runs vary more from step to step than bf16, and clocks are one suspect
mkdir -p outputs/e2e_x2
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu \
    --format=csv,noheader -lms ${X2_SMI_MS:-500} >> outputs/e2e_x2/gpu_clocks.csv 2>/dev/null &
SMI=$!
timeout $LEFT python3 launch/compare.py --config train_configs/llama_moe.toml --nproc ${X2_NPROC:-2} --steps ${X2_STEPS:-25} \
    --job.dump_folder=outputs/e2e_x2 --reuse --recipes "$R" 2>&1 | grep -v Warning
kill $SMI 2>/dev/null
for t in outputs/e2e_x2/*/profile_traces/iteration_*/rank0_trace.json; do
  [ -f "$t" ] || continue
  run=${t#outputs/e2e_x2/}; run=${run%%/*}
  python3 benchmarks/trace_gaps.py "$t" --top 12 --kernels 25 --exposed 14 --host ${X2_HOST_OPS:-0} \
      --json "outputs/e2e_x2/$run/gaps_rank0.json" | head -$((62 + 4 * ${X2_HOST_OPS:-0}))
done
# per step: tokens/s, each rank's GPU lag (near 0: the host paced the step), clocks and power near its start
for d in outputs/e2e_x2/*/; do
  ls "$d"gpu_lag_rank*.json >/dev/null 2>&1 || continue
  python3 benchmarks/step_modes.py "$d" --clocks outputs/e2e_x2/gpu_clocks.csv --json "${d}step_modes.json"
done
find outputs/e2e_x2 -name "rank*_trace.json" -delete
} > "$LOG" 2>&1
tail -30 "$LOG"
