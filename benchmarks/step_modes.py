"""Which steps of a run did the host pace, and which the GPU? One line per step of a `launch/train.py` run folder:
tokens/s/GPU (rank 0); for each rank the GPU lag (the GPU work still queued when that rank's host got there:
near 0 = host-bound; `titan_fp8/train/gpu_lag.py`) at the step's start, its backward and its optimizer step
("lag s/b/o"), and the host's time to issue the forward and the backward ("host f/b"); the SM clock and power of
each GPU nearest the step's start from an `nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,...
--format=csv,noheader -lms N` log.

    python benchmarks/step_modes.py outputs/e2e_x2/mxfp8_mx128_linears [--clocks outputs/e2e_x2/gpu_clocks.csv]
        [--json OUT.json]

Prints the table and a split of the timed steps (after the warm-up) by the smallest step-start lag over the ranks,
below / above --host-ms. The step-start lag includes the previous step's optimizer update, which the host issues in
well under a millisecond (llama_moe on 2 H100s: ~14 ms of GPU work), so a host-paced step reads about that.
"""
from __future__ import annotations

import argparse
import bisect
import datetime
import glob
import json
import os
import statistics
import sys


def load_run(folder: str) -> tuple[dict, dict]:
    """({step: metrics record}, {rank: {step: {"lag": (s, b, o) ms, "host": (fwd, bwd) ms, "wall": s}}})."""
    path = os.path.join(folder, "metrics.jsonl")
    try:
        with open(path) as f:
            recs = {r["step"]: r for r in (json.loads(line) for line in f if line.strip())}
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise SystemExit(f"step_modes: cannot read {path}: {e}")
    lags = {}
    for p in sorted(glob.glob(os.path.join(folder, "gpu_lag_rank*.json"))):
        with open(p) as f:
            d = json.load(f)
        n = len(d["steps"])
        phase = d.get("phase_lag_ms", {"step": d["lag_ms"]})
        host = d.get("host_ms", {})
        per = {}
        for i, step in enumerate(d["steps"]):
            lag = tuple((phase.get(k) or [None] * n)[i] for k in ("step", "backward", "optimizer"))
            hb, ho = ((host.get(k) or [None] * n)[i] for k in ("backward", "optimizer"))
            per[step] = {"lag": lag, "host": (hb, None if hb is None or ho is None else ho - hb),
                         "wall": d["wall_s"][i]}
        lags[d["rank"]] = per
    if not lags:
        raise SystemExit(f"step_modes: no gpu_lag_rank*.json in {folder} (a run from before GpuLag, or not on GPU)")
    return recs, lags


def _ms(values) -> str:
    return "/".join("-" if v is None else f"{v:.0f}" for v in values)


def load_clocks(path: str) -> dict:
    """{gpu index: ([epoch s], [(sm MHz, W)])} from nvidia-smi's csv (timestamps in the machine's local time)."""
    out: dict = {}
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 4:
                continue
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                idx, mhz, watt = int(parts[1]), float(parts[2].split()[0]), float(parts[3].split()[0])
            except ValueError:
                continue
            ts, vals = out.setdefault(idx, ([], []))
            ts.append(t)
            vals.append((mhz, watt))
    return out


def nearest(clocks: dict, idx: int, t: float):
    ts, vals = clocks.get(idx, ([], []))
    if not ts:
        return None
    i = bisect.bisect_left(ts, t)
    best = min((j for j in (i - 1, i) if 0 <= j < len(ts)), key=lambda j: abs(ts[j] - t))
    return vals[best] if abs(ts[best] - t) < 1.0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--clocks", default=None)
    ap.add_argument("--host-ms", type=float, default=20.0,
                    help="smallest step-start lag over the ranks below this: a host paced the step")
    ap.add_argument("--warmup", type=int, default=None, help="steps left out of the split (default: compare's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    recs, lags = load_run(args.run)
    clocks = load_clocks(args.clocks) if args.clocks else {}
    ranks = sorted(lags)
    head = f"{'step':>4} {'tok/s/GPU':>9} " + " ".join(f"{f'r{r} lag s/b/o':>14} {f'host f/b':>9}" for r in ranks)
    if clocks:
        head += " " + " ".join(f"  gpu{i} MHz/W" for i in sorted(clocks))
    print(f"== {args.run}\n{head}")
    rows = []
    for step in sorted(recs):
        r = recs[step]
        tps = r.get("tps_per_gpu")
        per = {k: lags[k].get(step, {"lag": (None,) * 3, "host": (None,) * 2, "wall": None}) for k in ranks}
        row = {"step": step, "tps": tps, "lag_ms": {k: per[k]["lag"][0] for k in ranks},
               "phase_lag_ms": {k: per[k]["lag"] for k in ranks}, "host_fwd_bwd_ms": {k: per[k]["host"] for k in ranks}}
        line = f"{step:>4} {tps if tps is None else round(tps):>9} " + " ".join(
            f"{_ms(per[k]['lag']):>14} {_ms(per[k]['host']):>9}" for k in ranks)
        wall = per[ranks[0]]["wall"]
        if clocks and wall:
            row["clocks"] = {i: nearest(clocks, i, wall) for i in sorted(clocks)}
            line += " " + " ".join(f"{'n/a' if v is None else f'{v[0]:.0f}/{v[1]:.0f}':>13}"
                                   for v in row["clocks"].values())
        print(line)
        rows.append(row)
    final = max(recs)
    warm = args.warmup if args.warmup is not None else max(1, min(10, final // 5))
    timed = [w for w in rows if w["step"] > warm and w["tps"] is not None
             and all(w["lag_ms"][k] is not None for k in ranks) and not recs[w["step"]].get("profiled")]
    split = {}
    for name, pick in (("host-paced", lambda w: min(w["lag_ms"].values()) < args.host_ms),
                       ("gpu-paced", lambda w: min(w["lag_ms"].values()) >= args.host_ms)):
        sel = [w for w in timed if pick(w)]
        split[name] = {"steps": len(sel), "median_tps": statistics.median(w["tps"] for w in sel) if sel else None}
        med = split[name]["median_tps"]
        print(f"{name} (smallest lag over the ranks {'<' if name == 'host-paced' else '>='} {args.host_ms} ms): "
              f"{len(sel)} of "
              f"{len(timed)} timed steps, median {'n/a' if med is None else round(med)} tokens/s/GPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "rows": rows, "split": split, "host_ms": args.host_ms}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
