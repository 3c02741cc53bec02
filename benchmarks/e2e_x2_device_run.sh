#!/bin/bash
# One device call on nvidia-h200-x2 for issue 11 acc. 3 and issue 12 acc. 2: llama_moe, every recipe, float8 all-gather
# on/off, tensorwise Linears + fp8_rowwise / mx128 experts, NCCL_MAX_CTAS unset/16/8, EP=2 with bf16 / float8 dispatch, mx128 Linears (issue 10 acc. 3), 25 steps each
# (~45 s a run: 13 runs need two calls), then --redraw.
# From the repo root with .whl (torchao, nvidia-cutlass wheels) carried: bash benchmarks/e2e_x2_device_run.sh
# A call cut short: untar its e2e_x2.tgz into outputs/ here, then run it again carrying outputs/e2e_x2 (--reuse
# keeps the finished runs).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
(python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')" > /tmp/cb.log 2>&1) &
R="bf16,tensorwise,tw_noag:tensorwise,enable_fsdp_float8_all_gather=false,precompute_float8_dynamic_scale_for_fsdp=false,tensorwise_fp8_rowwise_experts,tensorwise_mx128_experts,ep2_tw_rw:tensorwise_fp8_rowwise_experts,parallelism.expert_parallel_degree=2,ep2_tw_rw_f8d:tensorwise_fp8_rowwise_experts,parallelism.expert_parallel_degree=2,dispatch_dtype=float8,tw_ctas16:tensorwise,comm.nccl_max_ctas=16,tw_ctas8:tensorwise,comm.nccl_max_ctas=8,mxfp8_mx128,mxfp8_mx128_linears,mxfp8_mx32_experts,ep2_bf16:bf16,parallelism.expert_parallel_degree=2"
wait
tail -1 /tmp/cb.log
timeout ${X2_LIMIT:-540} python3 launch/compare.py --config train_configs/llama_moe.toml --nproc 2 --steps 25 \
    --job.dump_folder=outputs/e2e_x2 --reuse --recipes "$R" 2>&1 | grep -v Warning | tail -40
python3 launch/compare.py --config train_configs/llama_moe.toml --nproc 2 --steps 25 \
    --job.dump_folder=outputs/e2e_x2 --redraw --recipes "$R" 2>&1 | tail -25
# one file: the device returns only a few files per call
mkdir -p $OUT && (cd outputs && tar czf $OUT/e2e_x2.tgz --exclude="*.pt" e2e_x2)
