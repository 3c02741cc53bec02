"""benchmarks/scale_model.py runs on CPU and its numbers hang together."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import scale_model  # noqa: E402


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale")
    res = scale_model.main(["--out", str(out)])
    files = os.listdir(out)
    assert len(files) == 1 and files[0].startswith("scale_model-")
    with open(out / files[0]) as f:
        assert json.load(f)["rows"] == json.loads(json.dumps(res["rows"]))
    return res


def test_steps_are_compute_plus_exposed_comm(result):
    a = result["assumptions"]
    for row in result["rows"]:
        c = row["compute_s"]
        for sc in scale_model.SCENARIOS:
            comm = row[sc]["comm_s"]
            fsdp = comm["all_gather"] + comm["reduce_scatter"] + comm["all_reduce_replicas"]
            assert row[sc]["step_s"] == pytest.approx(c + max(0.0, fsdp - a["overlap"] * c) + comm["all_to_all"])
            assert row[sc]["step_s"] >= c
        assert row["saving_f8_all_gather"] == pytest.approx(1 - row["fsdp_f8ag"]["step_s"] / row["fsdp_bf16"]["step_s"])
        assert row["saving_f8_all_gather"] >= 0 and row["saving_f8_dispatch"] > 0
        # float8 gathers fewer bytes; float8 dispatch moves fewer all-to-all bytes; FSDP-only has no all-to-all
        assert row["fsdp_f8ag"]["comm_s"]["all_gather"] < row["fsdp_bf16"]["comm_s"]["all_gather"]
        assert row["fsdp_bf16"]["comm_s"]["all_to_all"] == 0
        ratio = row["ep_f8dispatch"]["comm_s"]["all_to_all"] / row["ep_bf16"]["comm_s"]["all_to_all"]
        # of 4 equal bf16 transfers (dispatch, combine, 2 gradients) the dispatch shrinks to (1 + 1/32) / 2
        assert ratio == pytest.approx((3 + (1 + 1 / 32) / 2) / 4)


def test_calibration_reproduces_the_measured_step(result):
    sizes = result["model"]
    comm = scale_model.comm_seconds(sizes, 2, "fsdp_bf16", result["assumptions"])
    step = scale_model.step_seconds(result["compute_s"], comm, result["assumptions"])
    assert step == pytest.approx(result["measured"]["step_s"])
    assert sizes["params"]["experts"] > sizes["params"]["float8_linear"] > 0


def test_more_bandwidth_never_slows_a_step(result):
    sizes, a = result["model"], result["assumptions"]
    for key in ("nvlink_gbs", "internode_gbits"):
        fast = dict(a, **{key: a[key] * 2})
        for g in (8, 64, 512):
            for sc in scale_model.SCENARIOS:
                slow_t = scale_model.step_seconds(1.0, scale_model.comm_seconds(sizes, g, sc, a), a)
                fast_t = scale_model.step_seconds(1.0, scale_model.comm_seconds(sizes, g, sc, fast), fast)
                assert fast_t <= slow_t
    assert result["sensitivity"]["moves_most"] in result["sensitivity"]["swing"]


def test_measured_ep_run_calibrates_the_ep_host_term(tmp_path):
    """--measured-ep: the EP=2 step the bytes do not explain becomes a per-MoE-layer host term, the model then
    reproduces that measured EP step at 2 GPUs, and it slows every EP step by the same amount."""
    base = os.path.join(ROOT, "benchmarks", "results", "llama_moe_e2e_x2", "summary.json")
    with open(base) as f:
        summary = json.load(f)
    bf16_tps = summary["runs"]["bf16"]["tps_per_gpu_median"]
    summary["runs"]["ep2"] = {"tps_per_gpu_median": 0.7 * bf16_tps}  # EP=2 at 0.7x FSDP, as measured (0.716x)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    bytes_only = scale_model.main(["--measured", str(path), "--out", str(tmp_path / "a")])
    res = scale_model.main(["--measured", str(path), "--measured-ep", "ep2", "--out", str(tmp_path / "b")])
    sizes, a = res["model"], res["assumptions"]
    assert bytes_only["assumptions"]["ep_host_s_per_layer"] == 0.0 and a["ep_host_s_per_layer"] > 0
    ep_step = scale_model.step_seconds(res["compute_s"], scale_model.comm_seconds(sizes, 2, "ep_bf16", a), a)
    assert ep_step == pytest.approx(res["measured"]["ep"]["step_s"]) and res["measured"]["ep"]["run"] == "ep2"
    for r0, r1 in zip(bytes_only["rows"], res["rows"]):
        extra = a["ep_host_s_per_layer"] * sizes["n_moe_layers"]
        assert r1["ep_bf16"]["step_s"] == pytest.approx(r0["ep_bf16"]["step_s"] + extra)
        assert r1["fsdp_bf16"]["step_s"] == pytest.approx(r0["fsdp_bf16"]["step_s"])  # FSDP-only: no EP term
        assert r1["ep_vs_fsdp"] < r0["ep_vs_fsdp"]
    assert "ep_host_s_per_layer x2" in res["sensitivity"]["answer_change"]
    with pytest.raises(SystemExit, match="no finished run of that name"):
        scale_model.main(["--measured", str(path), "--measured-ep", "ep4", "--out", str(tmp_path / "c")])
    with pytest.raises(SystemExit, match="not both"):
        scale_model.main(["--measured", str(path), "--measured-ep", "ep2", "--ep-host-ms-per-layer", "1",
                          "--out", str(tmp_path / "d")])
