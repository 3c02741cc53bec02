"""The JSON file a benchmark leaves: {"meta": ..., "results": [...]} as <stem>-<device>-<date>.json under $OUT (a
device call's output folder) or benchmarks/results/."""
import datetime
import json
import os


def write_results(stem: str, meta: dict, rows: list) -> str:
    """Write (and overwrite: benchmarks call it after every shape, so a run cut short keeps what it finished) and
    return the path. meta["device"] names the file, e.g. "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    slug = meta["device"].lower().replace("nvidia", "").strip().replace(" ", "-") or "gpu"
    outdir = os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"{stem}-{slug}-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)
    return path
