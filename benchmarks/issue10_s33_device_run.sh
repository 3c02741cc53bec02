#!/bin/bash
# Issue 10, session 33: 128x256 tiles for the CUTLASS mx128 kernels (blockwise_grouped.cuh mma_halves: each
# k-block's partial formed one 128-column half at a time) against the 128x192 tiles, in the same rounds.
# Call 1 ran PART=1 with VARIANT=n256=-DTITAN_MX_N256 on the tree where the 128x192 tiles were still the default
# and the 128x256 ones a variant (that define is gone: the 128x256 tiles are the default now and
# -DTITAN_MX_WIDE_N=192 builds the 128x192 ones, the default VARIANT below).
# One call on one GPU:
#   PART=1: both builds (in parallel); kernel rows round-robin: bf16, fp8 rowwise, the default build, the variant
#           (bits_equal: the two outputs identical), 3 shapes x 2 routings x fprop / dgrad / wgrad; then ncu
#           (clocks not locked) of the default and the variant on NCU_CELLS (PASS:SHAPE ...). CONFIGS=a,b: also
#           the default build under those kernel configurations (--cutlass-configs, e.g. raster / swizzle).
#   PART=2: both builds; GPU tests of every CUTLASS kernel against float64; ncu of both on NCU_CELLS.
#   PART=3: the whole op fwd+bwd (quantization included) on the default build beside bf16 and torchao fp8 rowwise.
#   PART=4: the GPU tests of the expert op, the gathered MXFP8 weights, the grouped GEMMs and the MXFP8 Linears.
# Call 5 ran PART=1 with VARIANT=e3=-DTITAN_MX_EPI_STAGES=3 (three epilogue output buffers instead of CUTLASS's two,
# through a rebuilt CollectiveEpilogue type): 0.975-1.064x, slower in 11 of 12 fprop/dgrad cells; that code is gone.
# Call 7: VARIANT=ew=-DTITAN_MX_EPI_WIDE (128x64 sub-tiles in one 16 KB buffer: half the epilogue barriers) with
# CONFIGS=cooperative_lpt_n256_2x1:swizzle=2,cooperative_lpt_n256_2x1:swizzle=4,cooperative_lpt_n256_2x1:along_m,
# cooperative_lpt_n256_2x1:along_n NCU_CELLS="": the variant 0.969-0.994x for fprop/dgrad (code gone); the raster
# and swizzle options within 1% of the default (geometric means 0.993-1.003).
# From the repo root:  run(command="PART=2 bash benchmarks/issue10_s33_device_run.sh", carry=[".whl"], timeout_s=600)
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
VARIANT=${VARIANT:-w192=-DTITAN_MX_WIDE_N=192}
TAG=${VARIANT%%=*}
NCU_CELLS=${NCU_CELLS-fprop:dsv3_down fprop:dsv3_up}  # set empty: no ncu
build_default() {
  MAX_JOBS=16 timeout 420 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('built')" \
    > "$OUT/build_cutlass.log" 2>&1
}
ncu_cells() {
  mkdir -p "$OUT/ncu"
  for cell in $NCU_CELLS; do
    for b in default "$VARIANT"; do
      [ $SECONDS -gt 560 ] && break
      n=${b%%=*}_${cell/:/_}
      timeout 60 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        -k regex:"^device_kernel" -s 2 -c 1 -f -o "$OUT/ncu/$n" \
        python3 benchmarks/cutlass_ncu_one.py "$b" ${cell%%:*} ${cell##*:} > "$OUT/ncu/$n.run.log" 2>&1 || tail -3 "$OUT/ncu/$n.run.log"
      ncu -i "$OUT/ncu/$n.ncu-rep" --page raw --csv > "$OUT/ncu/$n.raw.csv" 2>&1
      ncu -i "$OUT/ncu/$n.ncu-rep" --page details > "$OUT/ncu/$n.details.txt" 2>&1
      echo "== ncu $n (${SECONDS}s)"
      grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Shared" "$OUT/ncu/$n.details.txt" | head -12
      python3 - "$OUT/ncu/$n.raw.csv" <<'PY' | head -30
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
for k, u, v in zip(rows[h], rows[h + 1], rows[h + 2]):
    if any(t in k for t in ("gmma", "pipe_tensor", "pipe_fma", "data_pipe_lsu_wavefronts_mem_shared", "lts__t_bytes", "lts__throughput")) and ("pct" in k or ".sum" in k):
        print(f"  {k} = {v} {u}")
PY
      rm -f "$OUT/ncu/$n.ncu-rep"
    done
  done
  tar -czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
}
if [ "${PART:-1}" = 1 ] || [ "${PART:-1}" = 2 ]; then
build_default &
MAX_JOBS=16 timeout 420 python3 -c "from kernels.grouped_gemm import cutlass_backend as c
c.load_variant('$TAG', tuple('${VARIANT#*=}'.split(','))); print('built')" > "$OUT/build_$TAG.log" 2>&1 &
wait; echo "builds (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log") / $(tail -1 "$OUT/build_$TAG.log")"
fi
if [ "${PART:-1}" = 1 ]; then
timeout $(( 470 - SECONDS )) python3 benchmarks/mxfp8_grouped_gemm_backends.py --ours mx128_cutlass \
  --cutlass-variant $VARIANT ${CONFIGS:+--cutlass-configs $CONFIGS} --no-cublas --no-op --rounds ${ROUNDS:-15} \
  > "$OUT/kernels.log" 2>&1
echo "kernels rc=$? (${SECONDS}s)"; grep -E "error|bits_equal\": false" "$OUT/kernels.log" | head -5
grep -c 'bits_equal": true' "$OUT/kernels.log"
grep -v '^{' "$OUT/kernels.log" | grep -E "fprop|dgrad|wgrad" | cut -c1-110
ncu_cells
fi
if [ "${PART:-1}" = 2 ]; then
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grouped_gemm_cutlass_gpu.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
ncu_cells
fi
if [ "${PART:-1}" = 3 ]; then  # session 32's op part, on this tree's kernels
  PART=2 bash benchmarks/issue10_s32_device_run.sh
fi
if [ "${PART:-1}" = 4 ]; then
# the GPU tests of the paths that call the CUTLASS kernels through backend "auto" / the expert op (call 8)
build_default; echo "build (${SECONDS}s): $(tail -1 "$OUT/build_cutlass.log")"
timeout $(( 585 - SECONDS )) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_float8_moe_fused_gpu.py \
  tests/gpu/test_float8_mxfp8_gathered_gpu.py tests/gpu/test_grouped_gemm_gpu.py tests/gpu/test_float8_mx32_linear_gpu.py \
  tests/gpu/test_float8_mx128_linear_gpu.py > "$OUT/pytest_paths.log" 2>&1
echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest_paths.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest_paths.log" | head
fi
