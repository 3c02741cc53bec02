#!/bin/bash
# One device call on nvidia-h200-x2: the EP=2 run that stalled at step 12 on 2026-11-23 (llama_moe, tensorwise Linears
# gathered in float8 + precompute, fp8_rowwise experts, torch.compile), 25 steps under benchmarks/ep_compile_probe.py:
# per rank and step a timestamp, the graph count (constant after step 1 unless a rank recompiled), the rows each MoE
# layer received; TORCH_LOGS=recompiles; every thread's stack after EP_PROBE_STALL_S seconds without progress.
# From the repo root with .whl (torchao wheel) carried: bash benchmarks/ep_probe_device_run.sh
set -u
export PYTHONUNBUFFERED=1 EP_PROBE_STALL_S=${EP_PROBE_STALL_S:-90}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD:$PYTHONPATH
mkdir -p $OUT
timeout ${PROBE_LIMIT:-420} python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/ep_compile_probe.py \
    --config train_configs/llama_moe.toml --training.steps=25 --checkpoint.enable=false --training.seed=42 \
    --float8.enable=true --float8.recipe_name=tensorwise --float8.enable_fsdp_float8_all_gather=true \
    --float8.precompute_float8_dynamic_scale_for_fsdp=true --float8.moe_recipe_name=fp8_rowwise \
    --parallelism.expert_parallel_degree=2 --job.dump_folder=$OUT/ep_probe > $OUT/ep_probe.log 2>&1
echo "exit $?"
grep -E "^\[probe\]|^step |Recompiling|Traceback|Error|Thread 0x|File \"" $OUT/ep_probe.log | tail -80
