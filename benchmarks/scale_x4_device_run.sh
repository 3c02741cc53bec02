#!/bin/bash
# Issue 13 on FOUR GPUs of one host (nvidia-h200-x4, which the issue accepts in place of x8), through
# benchmarks/e2e_x2_device_run.sh (same packing, clocks, step_modes; each part packs into its own $OUT/<part>/),
# llama_moe, 25 steps a run, one device call per part, on one warm machine (the parts reuse each other's runs from
# outputs/; on a fresh machine carry outputs/e2e_x2 back in):
#   fsdp   4 ranks: bf16 and mxfp8_mx128_linears (the best float8 recipe, float8 all-gather), FSDP over 4 and HSDP 2x2
#   ep     4 ranks: EP = 4 for bf16 and the float8 recipe, the latter with bf16 and float8 dispatch
#   weak   2 ranks on GPUs 0,1 (one run at a time, as on an x2 machine): bf16 and the float8 recipe, for the
#          weak-scaling point (tokens/s/GPU at 4 over at 2, same per-GPU batch, same machine); its runs go to
#          outputs/e2e_x2_nproc2 so that they do not replace the 4-rank runs of the same names
#   ctas   4 ranks: the float8 recipe with NCCL_MAX_CTAS 16 and 8 (unset: PART=fsdp's run)
# Then, on the CPU machine: python benchmarks/scale_model.py --gpus 4,8,64,512 --measured <weak's summary.json>
#   [--measured-ep ...] and compare its 4-GPU row with the 4-rank runs ("say how far off it was and fix the model").
# From the repo root:  run(command="PART=fsdp bash benchmarks/scale_x4_device_run.sh", kind="nvidia-h200-x4",
#                          carry=[".whl"], timeout_s=600)
set -u
P=parallelism
F8=mxfp8_mx128_linears
PART=${PART:-fsdp}
export OUT=${OUT:-/tmp/out}/$PART X2_BUDGET=${X2_BUDGET:-585}
case "$PART" in
  fsdp) X2_NPROC=4 X2_RECIPES="bf16,$F8,hsdp_bf16:bf16,$P.data_parallel_replicate_degree=2,hsdp_mx128l:$F8,$P.data_parallel_replicate_degree=2" \
          bash benchmarks/e2e_x2_device_run.sh speed ;;
  ep)   X2_NPROC=4 X2_RECIPES="bf16,$F8,ep4_bf16:bf16,$P.expert_parallel_degree=4,ep4_mx128l:$F8,$P.expert_parallel_degree=4,ep4_mx128l_f8d:$F8,$P.expert_parallel_degree=4,dispatch_dtype=float8" \
          bash benchmarks/e2e_x2_device_run.sh speed ;;
  weak) mkdir -p outputs/e2e_x2 && mv outputs/e2e_x2 outputs/e2e_x4
        [ -d outputs/e2e_x2_nproc2 ] && mv outputs/e2e_x2_nproc2 outputs/e2e_x2
        CUDA_VISIBLE_DEVICES=0,1 X2_NPROC=2 X2_RECIPES="bf16,$F8" bash benchmarks/e2e_x2_device_run.sh speed
        mv outputs/e2e_x2 outputs/e2e_x2_nproc2 && mv outputs/e2e_x4 outputs/e2e_x2 ;;
  ctas) X2_NPROC=4 X2_RECIPES="bf16,$F8,mx128l_ctas16:$F8,comm.nccl_max_ctas=16,mx128l_ctas8:$F8,comm.nccl_max_ctas=8" \
          bash benchmarks/e2e_x2_device_run.sh speed ;;
  *) echo "scale_x4_device_run.sh: PART=fsdp | ep | weak | ctas"; exit 2 ;;
esac
