"""[compile] reaches torch.compile in parallelize: cpp_wrapper = true compiles every block with inductor's C++
wrapper (options={"cpp_wrapper": True}), false (the default) with torch.compile's defaults."""
import pytest
import torch

from _train_runs import DEBUG_TOML, parallelized_debug_model


@pytest.mark.parametrize("cpp_wrapper", [None, False, True], ids=["default", "false", "true"])
def test_cpp_wrapper_reaches_torch_compile(monkeypatch, cpp_wrapper):
    calls = []

    def record(mod, **kwargs):
        calls.append(kwargs)
        return mod
    monkeypatch.setattr(torch, "compile", record)
    overrides = ["--compile.enable=true"]
    if cpp_wrapper is not None:
        overrides.append(f"--compile.cpp_wrapper={str(cpp_wrapper).lower()}")
    with parallelized_debug_model(overrides) as model:
        n_blocks = len(model.layers)
    assert len(calls) == n_blocks > 0
    want = {"cpp_wrapper": True} if cpp_wrapper else None
    assert all(c.get("options") == want for c in calls), calls


def test_cpp_wrapper_must_be_a_bool():
    from titan_fp8.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="cpp_wrapper"):
        load_config(DEBUG_TOML, ["--compile.cpp_wrapper=maybe"], world_size=1)
