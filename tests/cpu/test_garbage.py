"""[training] gc_freq: automatic collection off during training, a generation-1 collection before every
gc_freq-th step, back on afterwards; 0 leaves Python's collector alone; negative values are a config error."""
import gc

import pytest

from titan_fp8.train.garbage import GarbageCollection


def test_collects_at_fixed_steps_only(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda gen=2: calls.append(gen) or 0)
    was = gc.isenabled()
    try:
        c = GarbageCollection(3)
        assert not gc.isenabled() and calls == [1]
        got = [s for s in range(1, 11) if c.step(s)]
        assert got == [3, 6, 9] and calls == [1, 1, 1, 1]
        c.close()
        assert gc.isenabled()
        calls.clear()
        off = GarbageCollection(0)
        assert gc.isenabled() and not any(off.step(s) for s in range(1, 11)) and calls == []
        off.close()
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


def test_negative_gc_freq_is_a_config_error(tmp_path):
    from titan_fp8.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="gc_freq"):
        load_config("train_configs/debug_moe.toml", ["--training.gc_freq=-1"], world_size=1)
    assert load_config("train_configs/debug_moe.toml", [], world_size=1).training.gc_freq == 50
