"""Warp-stall summaries of one ncu-profiled kernel launch.

  python benchmarks/gluon_ncu_stalls.py RAW.csv          # `ncu -i REP --page raw --csv`: headline metrics and
                                                         # stall reasons (warp cycles per issued instruction)
  python benchmarks/gluon_ncu_stalls.py --sass SASS.csv  # `ncu -i REP --page source --csv --print-source sass`:
      sampled stall reasons of the hot code (instructions executed >= 10% of the most executed one: the
      consumers' mainloop) apart from the cold code (idle/producer warps waiting), the hot code's executed
      instruction mix and its top stalling instructions per reason
"""
import collections
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def raw(path):
    rows = list(csv.reader(open(path)))
    hdr = next(i for i, r in enumerate(rows) if r and r[0] in ("ID", '"ID"'))
    m = dict(zip(rows[hdr], rows[hdr + 2]))
    key = "smsp__average_warps_issue_stalled_"
    stalls = sorted(((num(v), k[len(key):]) for k, v in m.items()
                     if k.startswith(key) and k.endswith("_per_issue_active.ratio")), reverse=True)
    for k in ("gpu__time_duration.sum", "gpc__cycles_elapsed.avg.per_second", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
              "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__warps_active.avg.per_cycle_active",
              "smsp__warps_eligible.avg.per_cycle_active", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
              "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
              "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", "smsp__average_warp_latency_per_inst_issued.ratio"):
        if k in m:
            print(f"{k:75s} {m[k]}")
    print("stall reasons, all warps (warp cycles per issued instruction):")
    for v, k in stalls:
        if v > 0.005:
            print(f"  {k[:-len('_per_issue_active.ratio')]:40s} {v:7.3f}")


def sass(path):
    rows = list(csv.reader(open(path)))
    hi = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[hi], rows[hi + 1:]
    cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ie, isamp = hdr.index("Instructions Executed"), hdr.index("Warp Stall Sampling (All Samples)")
    tot_all = sum(num(r[isamp]) for r in data) or 1.0
    emax = max(num(r[ie]) for r in data)
    hot = [r for r in data if num(r[ie]) >= 0.1 * emax]
    cold = [r for r in data if num(r[ie]) < 0.1 * emax]
    for name, sel in (("hot", hot), ("cold", cold)):
        c = collections.Counter()
        for r in sel:
            for h in cols:
                c[h] += num(r[hdr.index(h)])
        t = sum(c.values()) or 1.0
        print(f"{name} code: {len(sel)} instructions, {100 * t / tot_all:.1f}% of the stall samples; reasons: "
              + ", ".join(f"{k[6:]} {100 * v / t:.1f}%" for k, v in c.most_common(9)))
    mix = collections.Counter()
    for r in hot:
        ops = [o for o in r[1].split() if not o.startswith("@")]
        mix[ops[0].split(".")[0] if ops else "?"] += num(r[ie])
    t = sum(mix.values()) or 1.0
    print("hot executed mix: " + ", ".join(f"{k} {100 * v / t:.1f}%" for k, v in mix.most_common(16)))
    for h in ("stall_long_sb", "stall_wait", "stall_dispatch", "stall_barrier", "stall_math", "stall_no_inst",
              "stall_gmma" if "stall_gmma" in hdr else "stall_short_sb"):
        if h in hdr:
            ci = hdr.index(h)
            top = sorted(hot, key=lambda r: -num(r[ci]))[:4]
            print(f"  top {h[6:]}: " + " | ".join(f"{r[1].strip()[:48]} ({num(r[ci]):.0f})" for r in top))


if __name__ == "__main__":
    if sys.argv[1] == "--sass":
        sass(sys.argv[2])
    else:
        raw(sys.argv[1])
