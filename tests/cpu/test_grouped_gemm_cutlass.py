"""CPU checks of the CUTLASS backend's plumbing: the one-line toolchain errors, the backend switch (a named backend
that cannot run raises, never falls back), the limits it declares, and the fake impls torch.compile traces."""
import os

import pytest
import torch

from kernels.grouped_gemm import (mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad,
                                  pick_backend)
from kernels.grouped_gemm import cutlass_backend as cb
from kernels.grouped_gemm.quant import to_mxfp8_blocked


def _one_line(msg):
    assert "\n" not in msg, msg
    return msg


def test_missing_headers_is_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTLASS_INCLUDE_DIR", str(tmp_path / "missing"))
    with pytest.raises(cb.CutlassUnavailable) as e:
        cb.load()
    msg = _one_line(str(e.value))
    assert "CUTLASS headers not found" in msg and str(tmp_path / "missing") in msg
    assert "pip install nvidia-cutlass==4.2.0.0" in msg


def test_missing_nvcc_is_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda"))
    with pytest.raises(cb.CutlassUnavailable) as e:
        cb.nvcc_path()
    msg = _one_line(str(e.value))
    assert "nvcc not found" in msg and str(tmp_path / "no_cuda") in msg


def test_missing_nvcc_stops_the_build(monkeypatch, tmp_path):
    inc = tmp_path / "inc"
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cute").mkdir()
    (inc / "cutlass" / "cutlass.h").write_text("")
    (inc / "cute" / "tensor.hpp").write_text("")
    monkeypatch.setenv("CUTLASS_INCLUDE_DIR", str(inc))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda"))
    with pytest.raises(cb.CutlassUnavailable, match="nvcc not found"):
        cb.load()


def test_load_variant_builds_the_same_sources_without_ops(monkeypatch):
    """A variant build (benchmarks time it beside the default build in one process) is the same sources under
    another module name with its defines AND -DTITAN_MX_NO_OPS (a second registration of the ops' CUDA kernels
    would fail the import); without headers / nvcc / a GPU it stops with the same one-line error as load()."""
    seen = {}

    def fake_build(name, src_dir, sources, headers, what, defines=(), tag=""):
        seen.update(name=name, sources=tuple(sources), headers=tuple(headers), what=what, defines=tuple(defines),
                    tag=tag)
        return "ext"
    monkeypatch.setattr(cb, "build_extension", fake_build)
    monkeypatch.setattr(cb, "_LOADED", {})
    assert cb.load_variant("late", ("-DTITAN_MX_RELEASE_LATE",)) == "ext"
    assert seen["sources"] == cb.SOURCES and seen["headers"] == cb.HEADERS and seen["tag"] == "late"
    assert seen["defines"] == ("-DTITAN_MX_NO_OPS", "-DTITAN_MX_RELEASE_LATE") and "late" in seen["what"]
    for tag, defines, culprit in (("late-1", (), "tag"), ("late", "-DX", "defines"), ("late", ("X=1",), "X=1"),
                                  ("late", ("-D1X",), "-D1X")):
        with pytest.raises(ValueError, match=culprit):
            cb.load_variant(tag, defines)
    monkeypatch.undo()
    if not torch.cuda.is_available():
        with pytest.raises(cb.CutlassUnavailable) as e:
            cb.load_variant("late", ("-DTITAN_MX_RELEASE_LATE",))
        _one_line(str(e.value))


def _fprop_operands(block=128, tile=128, K=256, N=128):
    torch.manual_seed(0)
    x = torch.randn(70, K)
    w = torch.randn(2, N, K) * 0.02
    ad, as_ = to_mxfp8_blocked(x, -1, block, 1)
    wd, ws = to_mxfp8_blocked(w, -1, block, tile)
    offs = torch.tensor([30, 70], dtype=torch.int32)
    return ad, as_, wd, ws, offs


def test_named_cutlass_on_cpu_raises_never_falls_back():
    ad, as_, wd, ws, offs = _fprop_operands()
    with pytest.raises(cb.CutlassUnavailable) as e:
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
    msg = _one_line(str(e.value))
    assert "backend='cutlass' cannot run" in msg and "cpu" in msg


@pytest.mark.parametrize("block,tile", [(32, 128), (128, 1)])
def test_named_cutlass_with_unsupported_granularity_raises(block, tile):
    ad, as_, wd, ws, offs = _fprop_operands(block, tile)
    assert "block=" in cb.unsupported_reason("fprop", block, tile, 256, 128, torch.bfloat16)
    with pytest.raises(cb.CutlassUnavailable, match="backend='cutlass' cannot run"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=block, w_tile=tile, backend="cutlass")


def test_unsupported_reasons():
    assert cb.unsupported_reason("fprop", 128, 128, 2048, 1408, torch.bfloat16) is None
    assert cb.unsupported_reason("wgrad", 128, 128, 4096, 1408, torch.float32) is None
    assert "multiple of 128" in cb.unsupported_reason("fprop", 128, 128, 2080, 1408, torch.bfloat16)
    assert "multiple of 8" in cb.unsupported_reason("dgrad", 128, 128, 2048, 1404, torch.bfloat16)
    assert "out_dtype" in cb.unsupported_reason("fprop", 128, 128, 2048, 1408, torch.float32)
    assert cb.unsupported_reason("wgrad", 128, 128, 2048, 1408, torch.bfloat16) is None
    assert "out_dtype" in cb.unsupported_reason("wgrad", 128, 128, 2048, 1408, torch.float16)
    assert "a_tile" in cb.unsupported_reason("wgrad", 128, 1, 2048, 1408, torch.float32)


def test_bad_backend_name_is_rejected():
    ad, as_, wd, ws, offs = _fprop_operands()
    with pytest.raises(ValueError, match="backend='cuda'.*'auto', 'triton', 'cutlass'"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        mxfp8_grouped_mm_dgrad(*_dgrad_operands(), backend="fast")


def _dgrad_operands():
    torch.manual_seed(1)
    do = torch.randn(70, 128)
    w = torch.randn(2, 128, 256) * 0.02
    dd, ds = to_mxfp8_blocked(do, -1, 128, 1)
    wtd, wts = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, 128, 128)
    return dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), torch.tensor([30, 70], dtype=torch.int32)


def test_auto_on_cpu_is_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    t = torch.empty(1, dtype=torch.float8_e4m3fn)
    assert pick_backend("t", "fprop", "auto", t, 128, 128, 256, 128, torch.bfloat16) == "triton"
    assert pick_backend("t", "wgrad", "auto", t, 128, 128, 256, 128, torch.float32, 128) == "triton"


def test_wgrad_token_align_is_validated():
    torch.manual_seed(2)
    dt, ds = to_mxfp8_blocked(torch.randn(128, 256), -1, 128, 1)
    xt, xs = to_mxfp8_blocked(torch.randn(256, 256), -1, 128, 128)
    offs = torch.tensor([128, 256], dtype=torch.int32)
    with pytest.raises(ValueError, match="token_align"):
        mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, block=128, a_tile=128, token_align=0)
    with pytest.raises(cb.CutlassUnavailable, match="backend='cutlass' cannot run"):
        mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, block=128, a_tile=128, backend="cutlass", token_align=128)


def test_cutlass_fake_impls_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a = torch.empty(100, 256, dtype=torch.float8_e4m3fn)
        sa = torch.empty(100, 8, dtype=torch.uint8)
        b = torch.empty(3, 384, 256, dtype=torch.float8_e4m3fn)
        sb = torch.empty(3, 384, 8, dtype=torch.uint8)
        offs = torch.empty(3, dtype=torch.int32)
        out = torch.ops.titan_fp8.mx128_grouped_mm_rows_cutlass(a, sa, b, sb, offs, "fprop")
        assert out.shape == (100, 384) and out.dtype == torch.bfloat16
        x = torch.empty(384, 512, dtype=torch.float8_e4m3fn)
        sx = torch.empty(384, 16, dtype=torch.uint8)
        y = torch.empty(256, 512, dtype=torch.float8_e4m3fn)
        sy = torch.empty(256, 16, dtype=torch.uint8)
        dw = torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass(x, sx, y, sy, offs, torch.float32, "wgrad")
        assert dw.shape == (3, 384, 256) and dw.dtype == torch.float32


def test_experts_op_accepts_the_backend_names():
    try:
        from titan_fp8.float8.experts import mxfp8_grouped_mm
    except ModuleNotFoundError as e:  # the package __init__ pulls in torchao
        pytest.skip(str(e))
    x = torch.randn(64, 256)
    w = torch.randn(2, 128, 256)
    offs = torch.tensor([32, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="'cutlass'"):
        mxfp8_grouped_mm(x, w, offs, backend="bogus")


def test_schedule_override_is_checked(monkeypatch):
    assert cb.schedule_id("fprop") == cb.config_id(cb.SCHEDULES["fprop"])
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "pingpong")
    assert cb.schedule_id("wgrad") == 1
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "fast")
    with pytest.raises(ValueError, match="TITAN_FP8_CUTLASS_SCHEDULE 'fast'.*cooperative, pingpong"):
        cb.schedule_id("dgrad")
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "fprop=cooperative_2x1:swizzle=2;wgrad=pingpong")
    assert cb.schedule_id("fprop") == 2 | (1 << 8)
    assert cb.schedule_id("wgrad") == 1
    assert cb.schedule_id("dgrad") == cb.config_id(cb.SCHEDULES["dgrad"])
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "fwd=cooperative")
    with pytest.raises(ValueError, match="pass 'fwd' unknown"):
        cb.schedule_id("fprop")
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "dgrad=cooperative:swizzle=5")
    with pytest.raises(ValueError, match=r"\(dgrad\).*swizzle=5"):
        cb.schedule_id("dgrad")


def test_config_string_packs_kernel_raster_and_swizzle():
    # the bit layout bindings.cpp's launch() unpacks: bits 0-3 kernel, bit 4 along N, bits 8-11 log2 swizzle
    assert cb.config_id("cooperative") == 0
    assert cb.config_id("cooperative_1x1") == 3
    assert cb.config_id("cooperative_lpt") == 4
    assert cb.config_id("cooperative_2x1:along_n") == 2 | 16
    assert cb.config_id("pingpong:swizzle=8") == 1 | (3 << 8)
    assert cb.config_id("cooperative:along_n:swizzle=2") == 16 | (1 << 8)
    # raster left out: along N exactly when a group's output has more row tiles than column tiles
    assert cb.config_id("cooperative", m_tiles=64, n_tiles=16) == 16
    assert cb.config_id("cooperative", m_tiles=16, n_tiles=56) == 0
    assert cb.config_id("cooperative", m_tiles=32, n_tiles=32) == 0
    # the wide kernels' tiles are 2x as wide: callers count 128-column tiles, the rule counts the kernel's
    assert cb.config_id("cooperative_n256_2x1") == 5
    assert cb.config_id("cooperative_n256_2x1", m_tiles=40, n_tiles=48) == 5 | 16
    assert cb.config_id("cooperative_n256_2x1", m_tiles=30, n_tiles=48) == 5 | 16  # 24 wide tiles (192: 32)
    assert cb.config_id("cooperative_n256_2x1", m_tiles=30, n_tiles=64) == 5
    assert cb.config_id("cooperative_lpt_n256_2x1", m_tiles=40, n_tiles=48) == 6 | 16
    assert cb.config_id("cooperative_lpt_n256_2x1:along_m:swizzle=2", m_tiles=40, n_tiles=48) == 6 | (1 << 8)
    assert cb.config_id("cooperative", m_tiles=40, n_tiles=48) == 0
    assert cb.config_id("cooperative:along_m", m_tiles=64, n_tiles=16) == 0
    assert cb.config_id("cooperative:along_n", m_tiles=16, n_tiles=56) == 16
    assert cb.schedule_id("wgrad", 56, 16) == cb.config_id(cb.SCHEDULES["wgrad"], m_tiles=56, n_tiles=16)
    for bad, part in (("cooperative:swizzle=3", "swizzle=3"), ("cooperative:along_k", "along_k"),
                      ("coop", "kernel 'coop'")):
        with pytest.raises(ValueError, match=part):
            cb.config_id(bad)
    # every kernel has both output dtypes in the build
    for tu in cb._KERNEL_TU.values():
        assert f"blockwise_grouped_bf16_{tu}.cu" in cb.SOURCES and f"blockwise_grouped_f32_{tu}.cu" in cb.SOURCES
        for dt in ("bf16", "f32"):
            assert os.path.isfile(os.path.join(cb.SRC_DIR, f"blockwise_grouped_{dt}_{tu}.cu"))


def test_config_is_read_when_the_op_runs_not_when_it_is_traced(monkeypatch):
    """A compiled graph calls the CUTLASS ops with the pass name; the configuration ($TITAN_FP8_CUTLASS_SCHEDULE /
    SCHEDULES) and the raster choice from the call's shapes are resolved per call (a constant baked in at trace
    time made benchmarks/moe_layer.py's ^<config> variants rerun the first variant's graph)."""
    seen = []

    class FakeExt:
        def grouped_rows(self, a, sa, b, sb, offs, out, config, first_group):
            seen.append(config)
            out.fill_(1.0)

    monkeypatch.setattr(cb, "load", lambda: FakeExt())
    monkeypatch.delenv("TITAN_FP8_CUTLASS_SCHEDULE", raising=False)
    E, rows, R, C = 2, 256, 256, 128  # 128 rows per group = 1 row tile; C = 1 column tile: raster along M
    a = torch.zeros(rows, R, dtype=torch.float8_e4m3fn)
    sa = torch.zeros(rows, R // 32, dtype=torch.uint8)
    b = torch.zeros(E, C, R, dtype=torch.float8_e4m3fn)
    sb = torch.zeros(E, C, R // 32, dtype=torch.uint8)
    offs = torch.tensor([128, 256], dtype=torch.int32)
    f = torch.compile(lambda a, b: cb.fprop(a, sa, b, sb, offs), backend="aot_eager", fullgraph=True)
    f(a, b)
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "fprop=cooperative_1x1:along_n:swizzle=2")
    f(a, b)
    # 1 row tile and 1 (128-column) tile per group: the default's raster for those shapes, then the override's
    assert seen == [cb.config_id(cb.SCHEDULES["fprop"], m_tiles=1, n_tiles=1), 3 | 16 | (1 << 8)]
    # raster from the shapes: 4 row tiles per group > 1 column tile -> along N
    monkeypatch.delenv("TITAN_FP8_CUTLASS_SCHEDULE")
    a4 = torch.zeros(4 * rows, R, dtype=torch.float8_e4m3fn)
    sa4 = torch.zeros(4 * rows, R // 32, dtype=torch.uint8)
    cb.fprop(a4, sa4, b, sb, offs * 4)
    assert seen[-1] == cb.config_id(cb.SCHEDULES["fprop"]) | 16


def test_dgrad_in_parts_errors_name_the_argument():
    """mxfp8_grouped_mm_dgrad(out=, first_group=) (the fused MoE backward's w13 dgrad in parts of the experts):
    every misuse is one ValueError naming what is wrong; on a machine without the CUTLASS kernels it says so
    rather than running another backend that cannot write into out."""
    import pytest
    import torch
    from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    M, N, K, E = 256, 256, 128, 4
    dd, ds = to_mxfp8_blocked(torch.randn(M, N), -1, 128, 1)
    wt = to_mxfp8_blocked(torch.randn(E, K, N), -1, 128, 128)
    wn, wns = wt[0].transpose(1, 2), wt[1].transpose(1, 2)
    offs = torch.tensor([64, 128, 192, 256], dtype=torch.int32)
    out = torch.empty(M, K, dtype=torch.bfloat16)
    kw = dict(block=128, w_tile=128, validate=False)
    with pytest.raises(ValueError, match="first_group=2 needs out="):
        mxfp8_grouped_mm_dgrad(dd, ds, wn[2:], wns[2:], offs, first_group=2, **kw)
    with pytest.raises(ValueError, match=r"experts 3\.\.4 .* not all among offs' 4 groups"):
        mxfp8_grouped_mm_dgrad(dd, ds, wn[2:], wns[2:], offs, out=out, first_group=3, **kw)
    with pytest.raises(ValueError, match=r"out is \(256, 128\) torch.float32"):
        mxfp8_grouped_mm_dgrad(dd, ds, wn[2:], wns[2:], offs, out=out.float(), first_group=2, **kw)
    with pytest.raises(ValueError, match="first_group=-1"):
        mxfp8_grouped_mm_dgrad(dd, ds, wn[2:], wns[2:], offs, out=out, first_group=-1, **kw)
    with pytest.raises(ValueError, match="runs on the CUTLASS kernels only; backend='auto' picked 'triton'"):
        mxfp8_grouped_mm_dgrad(dd, ds, wn[2:], wns[2:], offs, out=out, first_group=2, **kw)


def test_dgrad_in_parts_checks_its_operands():
    """cutlass_backend.dgrad_in_parts (the fused MoE backward's dgrad over parts of the experts): every operand it
    cannot take is a ValueError naming it, before anything runs (no GPU needed to see them)."""
    f8 = torch.float8_e4m3fn
    w = torch.zeros(2, 256, 128, dtype=torch.bfloat16)
    dq = torch.zeros(64, 256, dtype=f8)
    ds = torch.zeros(64, 8, dtype=torch.uint8)
    offs = torch.tensor([32, 64], dtype=torch.int32)
    for args, part in (((dq, ds, w.float(), offs, 2), "w must be a bf16"),
                       ((dq, ds, w[:, :200], offs, 2), "multiples of 128"),
                       ((dq[:, :128], ds, w, offs, 2), "dq must be"),
                       ((dq, ds[:, :4], w, offs, 2), "dq must be"),
                       ((dq, ds, w, offs.long(), 2), "offs must be int32"),
                       ((dq, ds, w, offs[:1], 2), "offs must be int32"),
                       ((dq, ds, w, offs, 0), "parts must be")):
        with pytest.raises(ValueError, match=part):
            cb.dgrad_in_parts(*args)
    with pytest.raises(cb.CutlassUnavailable, match="dgrad_in_parts: tensors are on cpu"):
        cb.dgrad_in_parts(dq, ds, w, offs, 2)


def test_schedules_for_env_is_what_the_cxx_ops_launch_with():
    """The resolver the extension's C++ ops call when $TITAN_FP8_CUTLASS_SCHEDULE changes: per pass (fprop, dgrad,
    wgrad), the kernel/swizzle bits and the raster code (0 auto, 1 along M, 2 along N); the ops add the along-N bit
    for "auto" from each call's shapes. It must agree with schedule_id, which the Python kernels use."""
    unset = cb.schedules_for_env("")
    assert len(unset) == 3
    for (bits, raster), pass_ in zip(unset, ("fprop", "dgrad", "wgrad")):
        assert raster == 0 and bits == cb.config_id(cb.SCHEDULES[pass_])
        assert bits == cb.schedule_id(pass_, 1, 2) and bits | 16 == cb.schedule_id(pass_, 2, 1)
    assert cb.schedules_for_env("pingpong:along_n:swizzle=4") == ((1 | 2 << 8, 2),) * 3
    mixed = cb.schedules_for_env("fprop=cooperative_1x1:along_m;wgrad=cooperative_lpt")
    assert mixed[0] == (3, 1) and mixed[1] == unset[1] and mixed[2] == (4, 0)
    with pytest.raises(ValueError, match="kernel 'fast' unknown"):
        cb.schedules_for_env("dgrad=fast")


def test_default_kernel_builds_for_sm90a_without_spills_or_generic_stores(tmp_path):
    """The default kernel (cooperative_lpt_n256_2x1, bf16 output) compiles for sm_90a with no spills and no stack
    frame, and its per-warpgroup epilogue (blockwise_grouped.cuh WarpgroupStoreEpilogue) writes its output buffers
    with shared-memory stores: a first version stored through generic pointers (ST.E, 64-bit addresses), which
    also spilled. Needs nvcc and the CUTLASS headers (the `gpu` extra); skipped without them."""
    import re
    import subprocess
    import triton
    try:
        include, nvcc = cb.cutlass_include_dir(), cb.nvcc_path()
    except cb.CutlassUnavailable as e:
        pytest.skip(str(e))
    cubin = tmp_path / "k.cubin"
    out = subprocess.run([nvcc, "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG",
                          "-gencode=arch=compute_90a,code=sm_90a", "-I", cb.SRC_DIR, "-I", include, "-cubin", "-o",
                          str(cubin), os.path.join(cb.SRC_DIR, "blockwise_grouped_bf16_cooplptn256x2.cu"),
                          "-Xptxas", "-v"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    gemm = out.stderr[out.stderr.index("device_kernel"):]  # ptxas's lines for the GEMM (after the prep kernel's)
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", gemm)
    assert spills and spills.groups() == ("0", "0", "0"), gemm[:2000]
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, timeout=300).stdout
    assert "UTMASTG" in sass and "QGMMA" in sass, sass[:2000]
    assert not re.search(r"\bST\.E\b", sass), "generic stores in the GEMM kernel"
