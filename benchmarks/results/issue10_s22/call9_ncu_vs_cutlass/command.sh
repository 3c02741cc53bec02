source benchmarks/device_env.sh
MAX_JOBS=8 timeout 300 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" > $OUT/build_cutlass.log 2>&1 &
for v in "" "MX128_SPLIT_N=0"; do MAX_JOBS=3 timeout 300 python3 -c "from kernels.grouped_gemm import cuda_mx as c; c.load('$v'); print('built')" >> $OUT/build_cuda.log 2>&1 & done
wait; echo "builds ${SECONDS}s"
i=0
for v in ours cuda "cuda:MX128_SPLIT_N=0"; do
  n=ncu_$i; i=$((i+1))
  timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis -k regex:"device_kernel|nt_kernel" -s 2 -c 1 -f -o $OUT/$n python3 benchmarks/mx128_ncu_one.py "$v" fprop dsv3_up > $OUT/$n.run.log 2>&1 || tail -3 $OUT/$n.run.log
  ncu -i $OUT/$n.ncu-rep --page raw --csv > $OUT/$n.raw.csv 2>&1
  ncu -i $OUT/$n.ncu-rep --page details --csv > $OUT/$n.details.csv 2>&1
  echo "== $v"; python3 - $OUT/$n.raw.csv <<'PY'
import csv,sys
r=list(csv.reader(open(sys.argv[1]))); h=r[0]; v=r[2]
for i,k in enumerate(h):
    if 'per_second' in k: continue
    if any(s in k for s in ['gpu__time_duration.sum','sm__cycles_elapsed.max','sm__pipe_tensor_cycles_active.avg.pct','l1tex__data_pipe_lsu_wavefronts_mem_shared.sum','l1tex__data_bank','smsp__inst_executed.sum','lts__t_sectors_srcunit_tex_op_read.sum','dram__bytes_read.sum','l1tex__throughput.avg.pct','sm__memory_throughput.avg.pct','l1tex__data_pipe_lsu_wavefronts.sum','shared_op','smsp__issue_active.avg.pct']):
        print(' ', k, v[i])
PY
  rm -f $OUT/$n.ncu-rep; gzip -f $OUT/$n.raw.csv $OUT/$n.details.csv
done
