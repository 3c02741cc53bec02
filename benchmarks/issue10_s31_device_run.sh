#!/bin/bash
# Issue 10, session 31: what bounds the CUDA rowcol quantizer (kernels/grouped_gemm/quant_cuda.py), one H100 call:
#   1. ncu of the mx128 x copy at dsv3_up (x [65536, 7168] bf16): the kernel, the same without any data stores
#      (diag 3, wrong bytes), and a copy of x (x * 1; in call 2 it was x.clone(), a memcpy ncu does not profile):
#      speed of light, memory (DRAM bytes read / written), warp stalls;
#   2. benchmarks/quant_rowcol_cuda.py: byte check, then kernel ms round-robin: the CUDA kernel now (select chains
#      instead of the loop that put the row-scale pick in local memory), the session-30 source (cuda_base, built
#      beside it), the Triton kernel (the script's "triton" rows run Triton again: they had followed the switch to
#      CUDA since session 30) and a copy.
# From the repo root:  run(command="bash benchmarks/issue10_s31_device_run.sh", timeout_s=600)
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
# the session-30 source: the device copy of the tree has no git history, so write it here before the call:
#   git show 9665ce8:kernels/grouped_gemm/cuda_quant/rowcol_quant.cu > benchmarks/rowcol_quant_s30.cu
# (untracked, it travels with the tree; delete it afterwards)
mkdir -p /tmp/base && cp benchmarks/rowcol_quant_s30.cu /tmp/base/rowcol_quant.cu
timeout 200 python3 -c "from kernels.grouped_gemm import quant_cuda as q; q.load(); print('built')" > "$OUT/build.log" 2>&1
echo "build (${SECONDS}s): $(tail -1 "$OUT/build.log")"
timeout 150 python3 -c "from kernels.grouped_gemm import quant_cuda as q; q.load_source('/tmp/base/rowcol_quant.cu', 'base'); print('built')" \
  > "$OUT/build_base.log" 2>&1 &
for v in cuda cuda_diag3 copy; do
  n=ncu_${v}_mx128_x_dsv3_up
  timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum \
    -k regex:"rowcol|elementwise|copy" -s 2 -c 1 -f -o "$OUT/$n" \
    python3 benchmarks/quant_rowcol_ncu_one.py $v mx128_x dsv3_up > "$OUT/$n.run.log" 2>&1 || tail -3 "$OUT/$n.run.log"
  ncu -i "$OUT/$n.ncu-rep" --page raw --csv > "$OUT/$n.raw.csv" 2>&1
  ncu -i "$OUT/$n.ncu-rep" --page details > "$OUT/$n.details.txt" 2>&1
  echo "== $v (${SECONDS}s)"; python3 benchmarks/gluon_ncu_stalls.py "$OUT/$n.raw.csv" 2>&1 | head -24
  grep -E "dram__bytes_(read|write).sum|lts__t_sectors_op_(read|write).sum|Duration|DRAM Throughput" "$OUT/$n.details.txt" | head -8
  rm -f "$OUT/$n.ncu-rep"; gzip -f "$OUT/$n.raw.csv"
done
wait; echo "base build (${SECONDS}s): $(tail -1 "$OUT/build_base.log")"
timeout $(( 590 - SECONDS )) python3 benchmarks/quant_rowcol_cuda.py --base-src /tmp/base/rowcol_quant.cu --rounds 20 \
  > "$OUT/quant.log" 2>&1
echo "quant rc=$? (${SECONDS}s)"; grep -E "byte check|MISMATCH|Error" "$OUT/quant.log" | head -5
grep -E " ms " "$OUT/quant.log" | cut -c1-100
