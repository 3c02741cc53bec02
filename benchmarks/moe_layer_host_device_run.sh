#!/bin/bash
# One GPU: where the host time of one compiled MoE layer step goes, then (optionally) the Gluon mx32 configs
# round-robin. From the repo root, carrying .whl:
#     run(command="bash benchmarks/moe_layer_host_device_run.sh", kind="nvidia-h100-x1", carry=[".whl"])
# Steps, each optional but the layer benchmark:
#   HP_TESTS (pytest files; HP_K their -k): GPU tests;
#   HP_ERRPROBE=1: benchmarks/op_error_probe.py (which errors thrown from op kernels reach Python);
#   HP_PROBE=1: benchmarks/host_overhead_probe.py (host time per call of the pieces);
#   benchmarks/moe_layer.py at HP_SHAPE (llama_moe) for HP_VARIANTS (bf16,tw:mxfp8_mx128), HP_ROUNDS (2) rounds,
#     with HP_LAYER_ARGS (default the host profiles: --host-top 45 --py-top 45);
#   HP_KEEP_CODE: copy inductor's generated .py files that match this regex (HP_KEEP_N of them) to $OUT/code/;
#   HP_GLUON_CONFIGS: the Gluon mx32 configs round-robin ("" skips it).
# $OUT: pytest.log, op_error_probe.log/json, probe.log/json, layer.log / layer.json, gluon.log / gluon.json.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
MAX_JOBS=16 python3 -c "from kernels.grouped_gemm import cutlass_backend as c; c.load(); print('CUTLASS ready')" 2>&1 | tail -1
echo "build: ${SECONDS}s"
if [ -n "${HP_TESTS:-}" ]; then  # GPU tests first (HP_K: their -k filter)
  timeout ${HP_TEST_S:-240} python3 -m pytest -q -p no:cacheprovider -k "${HP_K:-not nothing}" $HP_TESTS \
      > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? (${SECONDS}s): $(tail -1 "$OUT/pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head -20
fi
if [ -n "${HP_ERRPROBE:-}" ]; then  # which errors thrown from op kernels reach Python (benchmarks/op_error_probe.py)
  timeout ${HP_ERRPROBE_S:-200} python3 benchmarks/op_error_probe.py --out "$OUT" > "$OUT/op_error_probe.log" 2>&1
  echo "op error probe rc=$? (${SECONDS}s)"; grep -v Warn "$OUT/op_error_probe.log" | tail -10 | cut -c1-170
fi
if [ -n "${HP_PROBE:-}" ]; then
  timeout ${HP_PROBE_S:-180} python3 benchmarks/host_overhead_probe.py --out "$OUT" > "$OUT/probe.log" 2>&1
  echo "probe rc=$? (${SECONDS}s)"; grep -v Warn "$OUT/probe.log" | tail -22 | cut -c1-160
fi
timeout ${HP_LAYER_S:-240} python3 benchmarks/moe_layer.py --shapes ${HP_SHAPE:-llama_moe} \
    --variants "${HP_VARIANTS:-bf16,tw:mxfp8_mx128}" --rounds ${HP_ROUNDS:-2} --iters 8 --warmup 2 \
    ${HP_LAYER_ARGS:---host-top 45 --py-top 45} \
    --out "$OUT/layer" > "$OUT/layer.log" 2>&1
echo "layer rc=$? (${SECONDS}s)"
for f in "$OUT"/layer/moe_layer-*.json; do [ -f "$f" ] && mv "$f" "$OUT/layer.json"; done
rmdir "$OUT/layer" 2>/dev/null
grep -v Warn "$OUT/layer.log" | grep -v "^  host" | tail -${HP_TAIL:-30}
if [ -n "${HP_KEEP_CODE:-}" ]; then  # inductor's generated files holding this regex (a kernel's name): $OUT/code/
  mkdir -p "$OUT/code"
  grep -rlE --include='*.py' "$HP_KEEP_CODE" "${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(whoami)}" 2>/dev/null |
      head -${HP_KEEP_N:-6} | while read -r f; do cp "$f" "$OUT/code/"; done
  echo "kept $(ls "$OUT/code" | wc -l) generated files matching $HP_KEEP_CODE"
fi
if [ -n "${HP_GLUON_CONFIGS:-}" ]; then
  timeout ${HP_GLUON_S:-300} python3 benchmarks/mxfp8_grouped_gemm_gluon.py --routings even,skewed --rep 100 \
      --skip-triton --configs $HP_GLUON_CONFIGS > "$OUT/gluon.log" 2>&1
  echo "gluon bench rc=$? (${SECONDS}s)"
  grep -v '^{' "$OUT/gluon.log" | grep -v Warn | tail -40 | cut -c1-100
fi
