"""Issue 10's acceptance 2, checked on one run of benchmarks/mxfp8_grouped_gemm_backends.py.

  python benchmarks/issue10_acceptance.py RESULT [RESULT ...]

RESULT: the JSON file the benchmark writes ({"meta": ..., "results": [...]}) or its printed log (one JSON object
per line). Each RESULT is one run and is judged on its own: the acceptance asks for every line in one run.

Lines (E = 8 x 8192 tokens, every shape of the benchmark's SHAPES, even and skewed routing; ratios are the run's
own, against bf16 torch._grouped_mm / torchao's fp8 rowwise grouped op timed beside them):
  mx128 kernels   mx128_cutlass, fprop / dgrad / wgrad, each >= 1.7x bf16
  mx128 op        op_mx128_cutlass fwd+bwd >= 1.5x bf16, and >= 1.2x torchao_fp8_rowwise
  mx32 kernels    mx32_gluon, fprop / dgrad / wgrad, each >= 1.15x bf16
  mx32 op         op_mx32_gluon fwd+bwd >= 1.05x bf16
The MXFP8 Linear line (benchmarks/float8_linear.py) and acceptance 1 and 3 are not in this file's data.

Prints, per RESULT and line, the range of the ratio, how many cells meet the bar and the lowest cell. A cell the
run lacks, or a row the benchmark recorded as an error, counts as missed and is named. Exit status: 0 when every
line of every RESULT is met, 1 otherwise; a file that cannot be read exits with a message naming it.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

SHAPES = ("dsv3_up", "dsv3_down", "llama_up")  # benchmarks/mxfp8_grouped_gemm_backends.SHAPES
ROUTINGS = ("even", "skewed")
KERNEL_PASSES = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class Line:
    name: str
    variant: str
    passes: tuple
    ratio: str  # the row's key: vs_bf16 or vs_torchao_fp8_rowwise
    bar: float


LINES = (
    Line("mx128 kernels", "mx128_cutlass", KERNEL_PASSES, "vs_bf16", 1.7),
    Line("mx128 op", "op_mx128_cutlass", ("fwd+bwd",), "vs_bf16", 1.5),
    Line("mx128 op vs torchao", "op_mx128_cutlass", ("fwd+bwd",), "vs_torchao_fp8_rowwise", 1.2),
    Line("mx32 kernels", "mx32_gluon", KERNEL_PASSES, "vs_bf16", 1.15),
    Line("mx32 op", "op_mx32_gluon", ("fwd+bwd",), "vs_bf16", 1.05),
)


@dataclass(frozen=True)
class Verdict:
    line: Line
    values: list  # (ratio, shape, routing, pass) of the cells the run has
    missing: list  # "shape routing pass" of the cells it lacks (or recorded as an error)

    @property
    def met(self) -> int:
        return sum(v[0] >= self.line.bar for v in self.values)

    @property
    def cells(self) -> int:
        return len(self.values) + len(self.missing)

    @property
    def ok(self) -> bool:
        return not self.missing and self.met == self.cells


def read_rows(path: str) -> tuple[dict, list]:
    """(meta, rows) of one run, from the benchmark's JSON file or its log."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read it ({e.strerror})")
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and "results" in doc:
            return doc.get("meta", {}), list(doc["results"])
    except json.JSONDecodeError:
        pass
    meta, rows = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not a JSON object ({e.msg})")
        if "shape" in obj:
            rows.append(obj)
        elif "device" in obj and not meta:
            meta = obj
    if not rows:
        raise SystemExit(f"{path}: no result rows (expected the JSON file or the log of "
                         "benchmarks/mxfp8_grouped_gemm_backends.py)")
    return meta, rows


def judge(rows: list, lines=LINES, shapes=SHAPES, routings=ROUTINGS) -> list[Verdict]:
    verdicts = []
    for ln in lines:
        values, missing = [], []
        for s in shapes:
            for r in routings:
                for p in ln.passes:
                    cell = [x for x in rows if (x.get("shape"), x.get("routing"), x.get("pass_"),
                                                x.get("variant")) == (s, r, p, ln.variant)]
                    good = [x for x in cell if isinstance(x.get(ln.ratio), (int, float))]
                    if len(good) > 1:
                        raise ValueError(f"{ln.variant} {s} {r} {p}: {len(good)} rows; one run has one")
                    if good:
                        values.append((float(good[0][ln.ratio]), s, r, p))
                    else:
                        err = next((x["error"][:80] for x in cell if "error" in x), None)
                        missing.append(f"{s} {r} {p}" + (f" (error: {err})" if err else ""))
        verdicts.append(Verdict(ln, values, missing))
    return verdicts


def report(path: str, meta: dict, verdicts: list[Verdict]) -> str:
    head = f"{path}: {meta.get('device', '?')}, {meta.get('date', '?')}, {meta.get('timing', '?').split(' (')[0]}"
    out = [head, f"  {'line':22s} {'bar':>6s} {'range':>13s} {'met':>6s}  lowest / missing"]
    for v in verdicts:
        if v.values:
            lo = min(v.values)
            rng = f"{lo[0]:.3f}-{max(v.values)[0]:.3f}"
            low = f"{lo[1]} {lo[2]} {lo[3]}"
        else:
            rng, low = "-", ""
        if not v.values:
            miss = f"absent from this run (--ours / --ops without {v.line.variant})"
        else:
            miss = f"; missing: {', '.join(v.missing)}" if v.missing else ""
        out.append(f"  {v.line.name:22s} {v.line.bar:>5.2f}x {rng:>13s} {v.met:>2d}/{v.cells:<3d}  {low}{miss}"
                   + ("" if v.ok else "  MISSED"))
    out.append("  every line met" if all(v.ok for v in verdicts) else "  NOT every line met")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="JSON file or log of one run of mxfp8_grouped_gemm_backends.py")
    args = ap.parse_args(argv)
    all_ok = True
    for path in args.results:
        meta, rows = read_rows(path)
        try:
            verdicts = judge(rows)
        except ValueError as e:
            raise SystemExit(f"{path}: {e}")
        print(report(path, meta, verdicts))
        all_ok &= all(v.ok for v in verdicts)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
