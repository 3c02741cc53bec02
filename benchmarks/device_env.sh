# Sourced from the repo root on the device machine by benchmarks/*_device_run.sh: unbuffered Python, $OUT made,
# the carried wheels (.whl: torchao, nvidia-cutlass; the calling script's `carry`) installed into /tmp/site, and the
# repo and /tmp/site on PYTHONPATH.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# (once per machine: a warm machine keeps /tmp/site between calls and between the scripts of one call)
[ -d /tmp/site/torchao ] && [ -d /tmp/site/cutlass_library ] ||
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
