"""Print the warp-stall breakdown (cycles per issued instruction, by reason) and a few headline metrics from an
`ncu -i REP --page raw --csv` dump (one kernel launch)."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if r and r[0] in ("ID", '"ID"'))
names, units, vals = rows[hdr], rows[hdr + 1], rows[hdr + 2]
m = dict(zip(names, vals))
key = "smsp__average_warps_issue_stalled_"
stalls = sorted(((float(v.replace(",", "")), k[len(key):]) for k, v in m.items()
                 if k.startswith(key) and k.endswith("_per_issue_active.ratio") and v not in ("", "n/a")), reverse=True)
for k in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
          "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__warps_active.avg.per_cycle_active",
          "smsp__warps_eligible.avg.per_cycle_active", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", "smsp__average_warp_latency_per_inst_issued.ratio",
          "sm__cycles_elapsed.avg.per_second"):
    if k in m:
        print(f"{k:75s} {m[k]}")
print("stall reasons (warp cycles per issued instruction):")
for v, k in stalls:
    if v > 0.005:
        print(f"  {k[:-len('_per_issue_active.ratio')]:40s} {v:7.3f}")
