#!/bin/bash
# DeepGEMM (deepseek-ai/DeepGEMM) built as a library on the GPU machine, then benchmarks/deepgemm_anchor.py (its
# sm_90 FP8 grouped GEMMs beside bf16 torch._grouped_mm and our CUTLASS mx128 kernels), in ONE device call:
#     run(command="bash benchmarks/deepgemm_device_run.sh", carry=[".whl", "third_party_build"], timeout_s=...)
# Prepare third_party_build/ on the CPU machine first (git ignores it: `/third_party_build/` in .git/info/exclude;
# nothing of DeepGEMM is committed here):
#     fetch github:deepseek-ai/DeepGEMM and github:fmtlib/fmt (the fetch tool; the snapshot has no submodules), then
#     mkdir -p third_party_build/DeepGEMM/third-party/fmt && cd third_party_build/DeepGEMM
#     git -C /work/.mirror/deepseek-ai+DeepGEMM/repo archive HEAD csrc deep_gemm scripts setup.py LICENSE | tar -x
#     git -C /work/.mirror/fmtlib+fmt/repo archive HEAD include | tar -x -C third-party/fmt   # header-only
#     git -C /work/.mirror/deepseek-ai+DeepGEMM/repo rev-parse HEAD > DEEPGEMM_COMMIT
# (~2 MB). CUTLASS/CuTe headers come from the carried nvidia-cutlass 4.2 wheel (every <cute/..>/<cutlass/..> that
# DeepGEMM 54e2261 includes exists in 4.2; its submodule pins a newer commit, f3fde58).
# Why not `setup.py build_ext`: it imports `wheel` and `scripts.generate_pyi` and wants third-party/cutlass in
# place; the extension is one .cpp file (host code: pybind API + the JIT driver), so torch's cpp_extension.load
# builds the same thing with the same include dirs and libraries (cudart, nvrtc) and less to go wrong.
# DeepGEMM JIT-compiles each kernel with nvcc at first call (-I deep_gemm/include only, so cute/ and cutlass/ are
# linked in there, as its setup.py copies them) into $DG_JIT_CACHE_DIR; the nine kernels are compiled by nine
# processes at once (--warm) while our CUTLASS extension builds, then one process times everything.
# $OUT: build_dg.log, build_ours.log, first.log, variant.txt, warm.log, bench.log, deepgemm_anchor-*.json
# (+ pytest.log with DG_TESTS, ncu_<i>.* with DG_NCU, backends.log + its json with DG_BACKENDS_ARGS, breakdown.log +
# gpu_clocks.csv + its json with DG_BREAKDOWN_ARGS), all packed
# into $OUT/all.tgz at the end.
# DG_ROUNDS: timing rounds (default 30); DG_SKIP_BENCH=1 skips the anchor's timing; DG_PRINT_CONFIGS=1 (DeepGEMM's
# own variable) logs the block sizes / cluster / stages its heuristics pick.
source benchmarks/device_env.sh
DG=$PWD/third_party_build/DeepGEMM
CI=/tmp/site/cutlass_library/source/include
export DG CI CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} DG_JIT_CACHE_DIR=/tmp/dg_jit
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
nvcc --version | tail -1
if [ ! -d "$DG/csrc" ] || [ ! -d "$DG/third-party/fmt/include" ]; then
  echo "blocked: third_party_build/DeepGEMM (+ third-party/fmt/include) missing: see the top of this script"; exit 2
fi
ln -sfn "$CI/cute" "$DG/deep_gemm/include/cute"
ln -sfn "$CI/cutlass" "$DG/deep_gemm/include/cutlass"
# ours, in the background (its nvcc jobs and DeepGEMM's one g++ job share the 16 cores)
( MAX_JOBS=15 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')"
  echo "ours build rc=$? (${SECONDS}s)" ) > "$OUT/build_ours.log" 2>&1 &
ours=$!
# deep_gemm._C with its own static libstdc++, kept private (--exclude-libs). Session 18: built with torch's default
# flags (or setup.py's), the first DeepGEMM call segfaulted inside std::regex (IncludeParser::get_includes ->
# regex_traits::transform_primary, before any nvcc run; NVRTC the same): the extension's inline libstdc++ code
# meets another copy's locale internals in the python process (torch is loaded first, RTLD_GLOBAL);
# benchmarks/results/deepgemm_anchor_s18/NOTE.md. Only the working variant ("B" there) is built now.
build() {
  V=B python3 - <<'EOF'
import glob, os, shutil, time
from torch.utils.cpp_extension import load
dg, cuda, ci, v = os.environ["DG"], os.environ["CUDA_HOME"], os.environ["CI"], os.environ["V"]
t0, bd, pkg = time.time(), f"/tmp/dg_build_{v}", f"/tmp/dgpkg_{v}"
os.makedirs(bd, exist_ok=True)
ld = [f"-L{cuda}/lib64", "-lcudart", "-lnvrtc"]
ld += ["-static-libstdc++", "-static-libgcc", "-Wl,--exclude-libs,ALL"]
load(name="_C", sources=[f"{dg}/csrc/python_api.cpp"], build_directory=bd,
     extra_include_paths=[f"{cuda}/include", f"{cuda}/include/cccl", f"{dg}/deep_gemm/include", ci,
                          f"{dg}/third-party/fmt/include"],
     extra_cflags=["-std=c++17", "-O3", "-fPIC", "-Wno-psabi", "-Wno-deprecated-declarations"],
     extra_ldflags=ld, verbose=False)
shutil.rmtree(pkg, ignore_errors=True)
shutil.copytree(f"{dg}/deep_gemm", f"{pkg}/deep_gemm", symlinks=True)
shutil.copy(glob.glob(f"{bd}/_C*.so")[0], f"{pkg}/deep_gemm/_C.so")
print(f"deep_gemm._C variant {v} built in {time.time() - t0:.0f}s")
EOF
}
build > "$OUT/build_dg.log" 2>&1
echo "deep_gemm build rc=$? (${SECONDS}s)"; tail -1 "$OUT/build_dg.log"
grep -m6 -E "error|Error" "$OUT/build_dg.log"
gcc --version | head -1
export PYTHONPATH=/tmp/dgpkg_B:$PYTHONPATH; ok=B
timeout 150 python3 -X faulthandler benchmarks/deepgemm_anchor.py --warm llama_up:fprop > "$OUT/first.log" 2>&1
rc=$?; echo "first kernel rc=$rc (${SECONDS}s): $(grep -m1 -E '^warm|Fatal' "$OUT/first.log")"
if [ $rc -ne 0 ]; then tail -12 "$OUT/first.log"; wait $ours; exit 4; fi
echo "using variant $ok" | tee "$OUT/variant.txt"
pids=()
for s in dsv3_up dsv3_down llama_up; do for p in fprop dgrad wgrad; do
  timeout ${DG_WARM_S:-150} python3 benchmarks/deepgemm_anchor.py --warm $s:$p > "$OUT/warm_${s}_${p}.tmp" 2>&1 &
  pids+=($!)
done; done
for p in "${pids[@]}"; do wait $p; done
cat "$OUT"/warm_*.tmp > "$OUT/warm.log"; rm -f "$OUT"/warm_*.tmp
echo "warm done (${SECONDS}s)"; grep -E "^warm|Error|error|failed" "$OUT/warm.log" | head -20
wait $ours; tail -2 "$OUT/build_ours.log"
if [ -n "${DG_TESTS:-}" ]; then  # pytest -k expression over our CUTLASS GPU tests, before the timing
  timeout ${DG_TESTS_S:-200} python3 -m pytest -q -p no:cacheprovider -k "$DG_TESTS" \
      tests/gpu/test_grouped_gemm_cutlass_gpu.py > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
fi
# DG_NCU="VARIANT/PASS/SHAPE ...": ncu profiles of one launch each (benchmarks/mx128_ncu_one.py; VARIANT ours,
# ours@SCHEDULE or deepgemm): $OUT/ncu_<i>.raw.csv.gz (+ .sass.csv.gz) and the headline metrics / stall reasons
i=0
for j in ${DG_NCU:-}; do
  IFS=/ read v p sh <<< "$j"; n=ncu_$i; i=$((i + 1)); echo "== $n: $v $p $sh"
  timeout ${DG_NCU_S:-120} ncu --clock-control none --set full -k regex:"device_kernel|sm90_fp8_gemm_1d2d" -s 2 -c 1 \
      -o $OUT/$n python3 benchmarks/mx128_ncu_one.py "$v" $p $sh > $OUT/$n.run.log 2>&1 || tail -5 $OUT/$n.run.log
  ncu -i $OUT/$n.ncu-rep --page raw --csv > $OUT/$n.raw.csv 2>&1
  ncu -i $OUT/$n.ncu-rep --page source --csv --print-source sass > $OUT/$n.sass.csv 2>&1
  python3 benchmarks/gluon_ncu_stalls.py $OUT/$n.raw.csv 2>&1 | head -24
  rm -f $OUT/$n.ncu-rep; gzip -f $OUT/$n.raw.csv $OUT/$n.sass.csv
done
if [ -z "${DG_SKIP_BENCH:-}" ]; then
# DG_ARGS: more arguments for the anchor, e.g. --ours-schedule LABEL@SCHEDULE (rows of our other kernels)
eval "python3 benchmarks/deepgemm_anchor.py --rounds ${DG_ROUNDS:-30} ${DG_ARGS:-}" > "$OUT/bench.log" 2>&1
echo "bench rc=$? (${SECONDS}s)"
sed -n '/^DeepGEMM anchor/,$p' "$OUT/bench.log"; grep -m5 -E "Error|error" "$OUT/bench.log"
fi
if [ -n "${DG_BACKENDS_ARGS:-}" ]; then  # then benchmarks/mxfp8_grouped_gemm_backends.py with these arguments
  eval "timeout ${DG_BACKENDS_S:-240} python3 benchmarks/mxfp8_grouped_gemm_backends.py $DG_BACKENDS_ARGS" \
      > "$OUT/backends.log" 2>&1
  echo "backends rc=$? (${SECONDS}s)"; grep -v '^{' "$OUT/backends.log" | grep -v Warn | tail -60 | cut -c1-110
fi
if [ -n "${DG_BREAKDOWN_ARGS:-}" ]; then  # then benchmarks/mx128_op_breakdown.py, an nvidia-smi log beside it
  source benchmarks/smi_log.sh; start_smi_log "$OUT/gpu_clocks.csv"
  eval "timeout ${DG_BREAKDOWN_S:-240} python3 benchmarks/mx128_op_breakdown.py --smi-log $OUT/gpu_clocks.csv \
      $DG_BREAKDOWN_ARGS" > "$OUT/breakdown.log" 2>&1
  echo "breakdown rc=$? (${SECONDS}s)"; kill $SMI_PID
  grep -E "^==|^  .*ms .*%" "$OUT/breakdown.log" | cut -c1-150 | head -${DG_BREAKDOWN_LINES:-90}
  grep -m5 -E "Error|error" "$OUT/breakdown.log"
fi
# everything under $OUT as one archive (the device tool returns a limited number of files)
(cd "$OUT" && tar czf /tmp/dg_out.tgz . && rm -rf ./* && mv /tmp/dg_out.tgz all.tgz)
