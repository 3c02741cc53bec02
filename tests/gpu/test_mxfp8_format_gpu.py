"""MXFP8 Triton kernels COMPILED on CUDA, byte for byte against the PyTorch reference (run on CPU, where
tests/cpu/test_mxfp8_format.py proves it equal to an independent float64 oracle), for every entry point,
every autotune config, both rounding paths (hardware cvt and integer RNE), at larger shapes and on every
bf16 bit pattern. Skips without CUDA.

    python -m pytest -q tests/gpu/test_mxfp8_format_gpu.py
"""
import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

import kernels.mxfp8 as mx  # noqa: E402
from kernels.mxfp8 import reference as ref  # noqa: E402

if torch.cuda.is_available():
    from kernels.mxfp8 import triton as tk
else:  # keep collection working on CPU
    tk = None

_spec = importlib.util.spec_from_file_location(
    "_mxfp8_cpu_cases", os.path.join(os.path.dirname(__file__), "..", "cpu", "test_mxfp8_format.py"))
cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu)
make_cases, tile_cases, assert_bytes_equal = cpu.make_cases, cpu.tile_cases, cpu.assert_bytes_equal

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HW = (True, False)  # hardware e4m3 cvt, integer rounding


def _cpu_ref(x, dim):
    return ref.to_mxfp8_reference(x.cpu(), dim)


def _cfg(kind):
    """A fixed kernel config for the many small shapes below (autotuning each shape would cost minutes; every
    config is covered by test_every_config_on_uneven_shapes, the tuned path by test_large_shapes_default_path)."""
    return dict(rows=tk._ROWS_CONFIGS[1], cols=tk._COLS_CONFIGS[1], rowcol=tk._ROWCOL_CONFIGS[1],
                tiles=tk._TILES_CONFIGS[0])[kind]


@pytest.mark.parametrize("hw_cast", HW)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cases_every_entry_point(dtype, hw_cast):
    for name, x in make_cases(dtype).items():
        xg = x.cuda()
        for src, dim in ((x, -1), (x, 0), (x.t().contiguous(), 0)):
            want = _cpu_ref(src, dim)
            kind = "rows" if dim == -1 else "cols"
            got = tk.to_mxfp8_triton(src.cuda(), dim, hw_cast=hw_cast, config=_cfg(kind))
            assert_bytes_equal(got[0], want[0], f"{dtype} {name} dim={dim} hw={hw_cast} data")
            assert_bytes_equal(got[1], want[1], f"{dtype} {name} dim={dim} hw={hw_cast} scale")
            # the reference itself on CUDA (division, frexp on the GPU) gives the same bytes
            rg = ref.to_mxfp8_reference(src.cuda(), dim)
            assert_bytes_equal(rg[0], want[0], f"{dtype} {name} reference on cuda data")
            assert_bytes_equal(rg[1], want[1], f"{dtype} {name} reference on cuda scale")
        for xx in (x, x.t().contiguous()):
            for col_t in (True, False):
                want = ref.to_mxfp8_rowcol_reference(xx, col_t)
                got = tk.to_mxfp8_rowcol(xx.cuda(), col_t, hw_cast=hw_cast, config=_cfg("rowcol"))
                for g, w, what in zip(got, want, ("data_row", "scale_row", "data_col", "scale_col")):
                    assert_bytes_equal(g, w, f"{dtype} {name} rowcol col_t={col_t} hw={hw_cast} {what}")
        rows = x.shape[0] // 32 * 32
        if rows >= 64:
            w = xg[:64].reshape(2, 32, -1)
            for dim in (-1, -2):
                want = _cpu_ref(w, dim)
                got = tk.to_mxfp8_expert_weights(w, dim, hw_cast=hw_cast,
                                                 config=_cfg("rows" if dim == -1 else "cols"))
                assert_bytes_equal(got[0], want[0], f"{dtype} {name} experts dim={dim} data")
                assert_bytes_equal(got[1], want[1], f"{dtype} {name} experts dim={dim} scale")
    for name, w in tile_cases(dtype).items():
        want = ref.to_mxfp8_tiles32_reference(w)
        got = tk.to_mxfp8_tiles32_triton(w.cuda(), hw_cast=hw_cast, config=_cfg("tiles"))
        for g, wt, what in zip(got, want, ("data", "scale_k", "scale_n")):
            assert_bytes_equal(g, wt, f"{dtype} {name} tiles hw={hw_cast} {what}")
    # and once through the public entry points (custom ops, autotuned, default rounding)
    x = make_cases(dtype)["boundary"].cuda()
    for dim in (-1, 0):
        got = mx.to_mxfp8(x, dim)
        want = _cpu_ref(x, dim)
        assert_bytes_equal(got[0], want[0], f"{dtype} public to_mxfp8 dim={dim} data")
        assert_bytes_equal(got[1], want[1], f"{dtype} public to_mxfp8 dim={dim} scale")


@pytest.mark.parametrize("hw_cast", HW)
def test_every_config_on_uneven_shapes(hw_cast):
    """Each autotune candidate must be right (the tuner may pick any); shapes that leave partial tiles."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(96 * 7, 32 * 45, generator=g) * 2.0 ** torch.randint(-30, 30, (96 * 7, 1), generator=g)
         ).to(torch.bfloat16)
    x[5, 17] = float("nan")
    x[200, 900] = float("-inf")
    xg = x.cuda()
    for cfg in tk._ROWS_CONFIGS:
        got = tk.to_mxfp8_triton(xg, -1, hw_cast=hw_cast, config=cfg)
        want = _cpu_ref(x, -1)
        assert_bytes_equal(got[0], want[0], f"rows {cfg}")
        assert_bytes_equal(got[1], want[1], f"rows {cfg} scale")
    for cfg in tk._COLS_CONFIGS:
        got = tk.to_mxfp8_triton(xg, 0, hw_cast=hw_cast, config=cfg)
        want = _cpu_ref(x, 0)
        assert_bytes_equal(got[0], want[0], f"cols {cfg}")
        assert_bytes_equal(got[1], want[1], f"cols {cfg} scale")
    # the tuned list and every kernel option the sweep tries (TMA stores, transposed input, grouped order, ...)
    for cfg in tk._ROWCOL_CONFIGS + cpu._ROWCOL_OPTION_CONFIGS:
        for col_t in (True, False):
            got = tk.to_mxfp8_rowcol(xg, col_t, hw_cast=hw_cast, config=cfg)
            want = ref.to_mxfp8_rowcol_reference(x, col_t)
            for gg, w, what in zip(got, want, ("data_row", "scale_row", "data_col", "scale_col")):
                assert_bytes_equal(gg, w, f"rowcol {cfg} col_t={col_t} {what}")
    w = x[: 96 * 6].reshape(3, 192, -1)
    for cfg in tk._TILES_CONFIGS:
        got = tk.to_mxfp8_tiles32_triton(w.cuda(), hw_cast=hw_cast, config=cfg)
        want = ref.to_mxfp8_tiles32_reference(w)
        for gg, wt, what in zip(got, want, ("data", "scale_k", "scale_n")):
            assert_bytes_equal(gg, wt, f"tiles {cfg} {what}")


@pytest.mark.parametrize("hw_cast", HW)
def test_every_bf16_bit_pattern(hw_cast):
    """All 65536 bf16 values (NaNs, infs, subnormals, both zeros), shuffled into blocks, plus the same values
    in blocks of one binade each (so most blocks are finite and the data path sees every value)."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    allv = bits.view(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    shuffled = allv[torch.randperm(allv.numel(), generator=g)].reshape(256, 256)
    finite = allv[torch.isfinite(allv)]
    finite = finite[finite.float().abs().argsort()]  # neighbouring magnitudes share a block
    finite = finite[: finite.numel() // 8192 * 8192].reshape(-1, 256)
    for name, x in (("shuffled", shuffled), ("sorted", finite)):
        for dim in (-1, 0):
            want = _cpu_ref(x, dim)
            kind = "rows" if dim == -1 else "cols"
            got = tk.to_mxfp8_triton(x.cuda(), dim, hw_cast=hw_cast, config=_cfg(kind))
            assert_bytes_equal(got[0], want[0], f"bf16 all bits {name} dim={dim} data")
            assert_bytes_equal(got[1], want[1], f"bf16 all bits {name} dim={dim} scale")


@pytest.mark.parametrize("hw_cast", HW)
def test_random_fp32_bit_patterns_large(hw_cast):
    """4M uniformly random fp32 bit patterns (every exponent, NaN/inf, subnormals) against the CPU reference."""
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(-2 ** 31, 2 ** 31, (2048, 2048), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    # most random blocks hold a NaN/inf somewhere (1/256 per element); keep half the rows finite
    x[::2] = torch.where(torch.isfinite(x[::2]), x[::2], torch.zeros_like(x[::2]))
    for dim in (-1, 0):
        want = _cpu_ref(x, dim)
        got = tk.to_mxfp8_triton(x.cuda(), dim, hw_cast=hw_cast)
        assert_bytes_equal(got[0], want[0], f"fp32 random bits dim={dim} data")
        assert_bytes_equal(got[1], want[1], f"fp32 random bits dim={dim} scale")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_large_shapes_default_path(dtype):
    """The autotuned default path (what training calls) at a few-hundred-MB shape, against the reference run
    on the GPU (itself checked against the CPU reference above)."""
    g = torch.Generator(device="cuda").manual_seed(2)
    x = (torch.randn(8192, 7168, device="cuda", generator=g) * 4).to(dtype)
    dr, sr, dc, sc = mx.to_mxfp8_rowcol(x)
    wr = ref.to_mxfp8_reference(x, -1)
    wc = ref.to_mxfp8_reference(x, 0)
    assert_bytes_equal(dr, wr[0], "large rowcol data_row")
    assert_bytes_equal(sr, wr[1], "large rowcol scale_row")
    assert_bytes_equal(dc.t(), wc[0], "large rowcol data_col")
    assert_bytes_equal(sc.t(), wc[1], "large rowcol scale_col")
    # the Triton kernel explicitly; later calls skip the autotuner (the launcher's cached config, plain JIT launch): same bytes
    for _ in range(2):
        got = mx.to_mxfp8_rowcol(x, backend="triton")
        for g, w, what in zip(got, (wr[0], wr[1], wc[0].t(), wc[1].t()), ("data_row", "scale_row", "data_col",
                                                                         "scale_col")):
            assert_bytes_equal(g, w, f"large rowcol triton {what}")
    assert any(k[0] == "rowcol_t" for k in tk._BEST), "the host fast path did not record the tuned config"
    d, s = mx.to_mxfp8(x)
    assert_bytes_equal(d, wr[0], "large rows data")
    assert_bytes_equal(s, wr[1], "large rows scale")
    d, s = mx.to_mxfp8(x, 0)
    assert_bytes_equal(d, wc[0], "large cols data")
    w = x.view(4, 2048, 7168)
    for dim in (-1, -2):
        d, s = mx.to_mxfp8_expert_weights(w, dim)
        want = ref.to_mxfp8_reference(w, dim)
        assert_bytes_equal(d, want[0], f"large experts dim={dim} data")
        assert_bytes_equal(s, want[1], f"large experts dim={dim} scale")
    got = mx.to_mxfp8_tiles32(w)
    for gg, wt, what in zip(got, ref.to_mxfp8_tiles32_reference(w), ("data", "scale_k", "scale_n")):
        assert_bytes_equal(gg, wt, f"large tiles {what}")


def test_torch_compile_inductor_sees_through_ops():
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)

    def f(t):
        d, s = mx.to_mxfp8(t)
        dr, sr, dc, sc = mx.to_mxfp8_rowcol(t)
        return mx.from_mxfp8(d, s, dtype=torch.bfloat16), dc, sc

    got = torch.compile(f, fullgraph=True)(x)
    want = f(x)
    assert torch.equal(got[0], want[0])
    assert_bytes_equal(got[1], want[1], "compiled data_col")
    assert_bytes_equal(got[2], want[2], "compiled scale_col")
