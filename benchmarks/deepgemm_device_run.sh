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
# $OUT: build_dg.log, build_ours.log, first.log, variant.txt, warm.log, bench.log, deepgemm_anchor-*.json.
# DG_ROUNDS: timing rounds (default 30).
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
( MAX_JOBS=12 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')"
  echo "ours build rc=$? (${SECONDS}s)" ) > "$OUT/build_ours.log" 2>&1 &
ours=$!
# Two builds of deep_gemm._C at once, differing only in how libstdc++ is bound. Session 18's first two calls: built
# with torch's default flags, the first DeepGEMM call segfaulted inside std::regex (IncludeParser::get_includes ->
# regex_traits::transform_primary, before any nvcc run; NVRTC the same): the extension's inline libstdc++ code
# meets another copy's locale internals in the python process (torch is loaded first, RTLD_GLOBAL).
#   A: setup.py's own flags (-std=c++17 -O3 ...) in case the C++ standard torch picks (newer) is what differs;
#   B: A + its own static libstdc++, kept private (--exclude-libs), so its regex/locale code binds to itself.
# Each goes into its own package copy (/tmp/dgpkg_X/deep_gemm); the first whose first kernel runs is used.
# Call 3 of session 18: A segfaulted the same way, B ran (benchmarks/results/deepgemm_anchor_s18/NOTE.md).
build() {  # $1 = A|B
  V=$1 python3 - <<'EOF'
import glob, os, shutil, time
from torch.utils.cpp_extension import load
dg, cuda, ci, v = os.environ["DG"], os.environ["CUDA_HOME"], os.environ["CI"], os.environ["V"]
t0, bd, pkg = time.time(), f"/tmp/dg_build_{v}", f"/tmp/dgpkg_{v}"
os.makedirs(bd, exist_ok=True)
ld = [f"-L{cuda}/lib64", "-lcudart", "-lnvrtc"]
if v == "B":
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
build A > "$OUT/build_dg.log" 2>&1 &
a=$!
build B > "$OUT/build_dg_B.log" 2>&1
rcB=$?; wait $a; rcA=$?
echo "deep_gemm builds rc A=$rcA B=$rcB (${SECONDS}s)"; tail -1 "$OUT/build_dg.log"; tail -1 "$OUT/build_dg_B.log"
cat "$OUT/build_dg_B.log" >> "$OUT/build_dg.log"; rm -f "$OUT/build_dg_B.log"
grep -m6 -E "error|Error" "$OUT/build_dg.log"
python3 -c "import torch; print([l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l][:1])"
gcc --version | head -1
BASE=$PYTHONPATH; ok=""
for v in A B; do
  [ -f /tmp/dgpkg_$v/deep_gemm/_C.so ] || continue
  export PYTHONPATH=/tmp/dgpkg_$v:$BASE
  timeout 150 python3 -X faulthandler benchmarks/deepgemm_anchor.py --warm llama_up:fprop > "$OUT/first.log" 2>&1
  rc=$?; echo "variant $v first kernel rc=$rc (${SECONDS}s): $(grep -m1 -E '^warm|Fatal' "$OUT/first.log")"
  [ $rc -eq 0 ] && { ok=$v; break; }
done
if [ -z "$ok" ]; then tail -12 "$OUT/first.log"; wait $ours; exit 4; fi
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
python3 benchmarks/deepgemm_anchor.py --rounds ${DG_ROUNDS:-30} > "$OUT/bench.log" 2>&1
echo "bench rc=$? (${SECONDS}s)"
sed -n '/^DeepGEMM anchor/,$p' "$OUT/bench.log"; grep -m5 -E "Error|error" "$OUT/bench.log"
