# Sourced by the device scripts: start_smi_log FILE starts an nvidia-smi clock/power log in the background (the
# format benchmarks/cuda_timing.smi_means reads: timestamp, clocks.sm, power.draw, temperature.gpu every 100 ms)
# and sets SMI_PID; stop it with `kill $SMI_PID`.
start_smi_log() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
    > "$1" 2>/dev/null &
  SMI_PID=$!
}
