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
