"""benchmarks/issue10_acceptance.py: issue 10's acceptance 2 judged on one run of the backends benchmark."""
import json

import pytest

from benchmarks import issue10_acceptance as acc

BARS = {ln.name: ln.bar for ln in acc.LINES}


def full_run(scale=1.0):
    """Rows of a complete run where every ratio is `scale` x its bar (scale > 1: every line met)."""
    rows = []
    for ln in acc.LINES:
        for s in acc.SHAPES:
            for r in acc.ROUTINGS:
                for p in ln.passes:
                    row = next((x for x in rows if (x["shape"], x["routing"], x["pass_"], x["variant"]) ==
                                (s, r, p, ln.variant)), None)
                    if row is None:
                        row = {"shape": s, "routing": r, "pass_": p, "variant": ln.variant, "ms": 1.0}
                        rows.append(row)
                    row[ln.ratio] = round(ln.bar * scale, 4)
    return rows


def test_shapes_are_the_benchmarks():
    bench = pytest.importorskip("benchmarks.mxfp8_grouped_gemm_backends")
    assert acc.SHAPES == tuple(bench.SHAPES)


def test_every_line_met_at_and_above_the_bar():
    for scale in (1.0, 1.3):
        verdicts = acc.judge(full_run(scale))
        assert all(v.ok for v in verdicts)
        assert [v.cells for v in verdicts] == [18, 6, 6, 18, 6]


def test_one_cell_under_its_bar_misses_that_line_only():
    rows = full_run(1.1)
    cell = next(x for x in rows if x["variant"] == "mx32_gluon" and x["pass_"] == "wgrad"
                and x["shape"] == "llama_up" and x["routing"] == "even")
    cell["vs_bf16"] = 1.149
    verdicts = {v.line.name: v for v in acc.judge(rows)}
    assert not verdicts["mx32 kernels"].ok and verdicts["mx32 kernels"].met == 17
    assert min(verdicts["mx32 kernels"].values) == (1.149, "llama_up", "even", "wgrad")
    assert all(v.ok for n, v in verdicts.items() if n != "mx32 kernels")
    # the op row's two ratios are separate lines
    op = next(x for x in rows if x["variant"] == "op_mx128_cutlass")
    op["vs_torchao_fp8_rowwise"] = 1.19
    verdicts = {v.line.name: v for v in acc.judge(rows)}
    assert verdicts["mx128 op"].ok and not verdicts["mx128 op vs torchao"].ok


def test_a_missing_cell_or_an_error_row_is_a_miss_named():
    rows = [x for x in full_run(1.1) if not (x["variant"] == "op_mx32_gluon" and x["shape"] == "dsv3_down"
                                              and x["routing"] == "skewed")]
    bad = next(x for x in rows if x["variant"] == "mx128_cutlass" and x["pass_"] == "dgrad")
    rows.remove(bad)
    rows.append({k: bad[k] for k in ("shape", "routing", "pass_", "variant")} | {"error": "RuntimeError('boom')"})
    verdicts = {v.line.name: v for v in acc.judge(rows)}
    assert verdicts["mx32 op"].missing == ["dsv3_down skewed fwd+bwd"] and not verdicts["mx32 op"].ok
    assert verdicts["mx128 kernels"].missing == [
        f"{bad['shape']} {bad['routing']} dgrad (error: RuntimeError('boom'))"]
    text = acc.report("run.json", {}, list(verdicts.values()))
    assert "missing: dsv3_down skewed fwd+bwd" in text and "NOT every line met" in text
    # a run without a variant (benchmark run with --ours "") names it once instead of listing 18 cells
    verdicts = acc.judge([x for x in rows if x["variant"] != "mx32_gluon"])
    absent = next(v for v in verdicts if v.line.name == "mx32 kernels")
    assert len(absent.missing) == 18 and not absent.ok
    line = next(ln for ln in acc.report("run.json", {}, verdicts).splitlines() if "mx32 kernels" in ln)
    assert "absent from this run" in line and "mx32_gluon" in line and line.endswith("MISSED")


def test_reads_the_json_file_and_the_log(tmp_path, capsys):
    rows = full_run(1.1)
    meta = {"device": "NVIDIA H200", "date": "2026-11-28", "timing": "steady state per variant (x); 3 rounds"}
    js = tmp_path / "run.json"
    js.write_text(json.dumps({"meta": meta, "results": rows}))
    log = tmp_path / "run.log"
    log.write_text("a warning line\n" + json.dumps(meta) + "\n" + "\n".join(json.dumps(r) for r in rows)
                   + "\ndsv3_up even fwd+bwd table line\n")
    assert acc.main([str(js), str(log)]) == 0
    out = capsys.readouterr().out
    assert out.count("every line met") == 2 and "NVIDIA H200, 2026-11-28, steady state per variant" in out
    rows[0]["vs_bf16"] = 0.5
    js.write_text(json.dumps({"meta": meta, "results": rows}))
    assert acc.main([str(js)]) == 1


def test_bad_files_are_named(tmp_path):
    with pytest.raises(SystemExit, match="nowhere.json: cannot read it"):
        acc.main([str(tmp_path / "nowhere.json")])
    empty = tmp_path / "empty.log"
    empty.write_text("no rows here\n")
    with pytest.raises(SystemExit, match="empty.log: no result rows"):
        acc.main([str(empty)])
    broken = tmp_path / "broken.log"
    broken.write_text('{"shape": "dsv3_up"\n')
    with pytest.raises(SystemExit, match=r"broken.log:1: not a JSON object"):
        acc.main([str(broken)])
    twice = tmp_path / "twice.json"
    rows = full_run(1.1)
    twice.write_text(json.dumps({"meta": {}, "results": rows + rows[:1]}))
    with pytest.raises(SystemExit, match="twice.json: .* 2 rows; one run has one"):
        acc.main([str(twice)])


def test_committed_runs_read_as_their_notes_say():
    """The benchmark's real output format: session 40's round-robin run misses three lines (its NOTE.md), session
    45's steady-state runs meet every line."""
    import glob
    import os
    root = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results")
    s40 = glob.glob(os.path.join(root, "issue10_s40", "call2_final", "*.json"))
    s45 = glob.glob(os.path.join(root, "issue10_s45", "call2_steady", "*.json"))
    s45_log = os.path.join(root, "issue10_s45", "call3_steady_repeat", "backends.log")
    assert len(s40) == 1 and len(s45) == 1
    missed = {v.line.name for v in acc.judge(acc.read_rows(s40[0])[1]) if not v.ok}
    assert missed == {"mx128 op", "mx32 kernels", "mx32 op"}
    for path in (s45[0], s45_log):
        assert all(v.ok for v in acc.judge(acc.read_rows(path)[1]))
