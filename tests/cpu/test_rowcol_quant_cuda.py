"""CPU checks of the CUDA rowcol quantizer (kernels/grouped_gemm/quant_cuda.py) and of quant_triton's switch
(TITAN_FP8_ROWCOL_QUANT): what each setting runs, the one-line errors, and the kernel's sm_90a build (registers
and spills, with nvcc when this machine has it). Its bytes are checked on the GPU
(tests/gpu/test_grouped_gemm_gpu.py::test_cuda_rowcol_quantizer_bit_identical)."""
import logging
import os
import re
import shutil
import subprocess
import types

import pytest
import torch

from kernels.grouped_gemm import quant_cuda, quant_triton
from kernels.grouped_gemm.cutlass_backend import CutlassUnavailable


def _fake_x(M=256, K=256):
    """What _cuda_rowcol reads of a tensor, for a CUDA bf16 [1, M, K] this machine does not have."""
    return types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, ndim=3, shape=(1, M, K))


@pytest.fixture
def compiled_path(monkeypatch):
    """_cuda_rowcol as on a GPU: not interpreted, the device checks passed."""
    monkeypatch.setattr(quant_triton, "_INTERPRET", False)
    monkeypatch.setattr(quant_cuda, "unsupported_reason", lambda *a: None)
    quant_triton._logged.clear()
    yield
    quant_triton._logged.clear()


def test_switch_rejects_unknown_setting(monkeypatch):
    monkeypatch.setenv("TITAN_FP8_ROWCOL_QUANT", "cutlass")
    with pytest.raises(ValueError, match=r"TITAN_FP8_ROWCOL_QUANT='cutlass'; allowed: \('auto', 'cuda', 'triton'\)"):
        quant_triton.rowcol_quant_backend()


@pytest.mark.parametrize("setting", ["auto", "cuda", "triton"])
def test_interpreter_and_cpu_tensors_run_triton(monkeypatch, setting):
    monkeypatch.setenv("TITAN_FP8_ROWCOL_QUANT", setting)
    x = torch.zeros(1, 64, 64, dtype=torch.bfloat16)
    assert quant_triton._cuda_rowcol(x, 128, 1, 128, 128, True, True) is None


def test_named_cuda_that_cannot_build_raises(monkeypatch, compiled_path):
    monkeypatch.setenv("TITAN_FP8_ROWCOL_QUANT", "cuda")

    def no_nvcc():
        raise CutlassUnavailable("nvcc not found: no CUDA_HOME and no nvcc on PATH")
    monkeypatch.setattr(quant_cuda, "load", no_nvcc)
    with pytest.raises(RuntimeError, match="TITAN_FP8_ROWCOL_QUANT=cuda: .* cannot run this call: nvcc not found"):
        quant_triton._cuda_rowcol(_fake_x(), 128, 1, 128, 128, True, True)


def test_auto_that_cannot_build_says_so_once(monkeypatch, compiled_path, caplog):
    monkeypatch.setenv("TITAN_FP8_ROWCOL_QUANT", "auto")

    def no_nvcc():
        raise CutlassUnavailable("nvcc not found")
    monkeypatch.setattr(quant_cuda, "load", no_nvcc)
    with caplog.at_level(logging.INFO, logger=quant_triton.__name__):
        for _ in range(3):
            assert quant_triton._cuda_rowcol(_fake_x(), 32, 1, 32, 1, True, True) is None
    said = [r.getMessage() for r in caplog.records]
    assert said == ["rowcol quantizer: auto picked the Triton kernel (nvcc not found)"]


def test_auto_picks_cuda_and_logs_it(monkeypatch, compiled_path, caplog):
    monkeypatch.setenv("TITAN_FP8_ROWCOL_QUANT", "auto")
    monkeypatch.setattr(quant_cuda, "load", lambda: None)
    with caplog.at_level(logging.INFO, logger=quant_triton.__name__):
        assert quant_triton._cuda_rowcol(_fake_x(), 128, 1, 128, 1, True, True) is quant_cuda
        assert quant_triton._cuda_rowcol(_fake_x(), 32, 1, 32, 128, True, True) is quant_cuda
    assert [r.getMessage() for r in caplog.records] == [
        "rowcol quantizer: auto picked the CUDA kernel (kernels/grouped_gemm/quant_cuda.py)"]


@pytest.mark.parametrize("setting", ["auto", "cuda"])
@pytest.mark.parametrize("call", [
    dict(row_block=128, row_tile=128, col_block=128, col_tile=1, do_row=True, do_col=False),  # weights, one copy
    dict(row_block=128, row_tile=1, col_block=128, col_tile=128, do_row=False, do_col=True),
    dict(row_block=64, row_tile=1, col_block=64, col_tile=1, do_row=True, do_col=True),  # no CUDA layout
    dict(row_block=128, row_tile=128, col_block=128, col_tile=128, do_row=True, do_col=True),
], ids=["w_rows", "cols_only", "block64", "row_tile128"])
def test_calls_outside_the_switch_run_triton_under_every_setting(monkeypatch, compiled_path, setting, call):
    """The switch covers the fused x / dO copies only; the rest is Triton even when "cuda" is named (documented)."""
    monkeypatch.setenv("TITAN_FP8_ROWCOL_QUANT", setting)
    monkeypatch.setattr(quant_cuda, "load", lambda: pytest.fail("must not build for a call outside the switch"))
    c = call
    assert quant_triton._cuda_rowcol(_fake_x(), c["row_block"], c["row_tile"], c["col_block"], c["col_tile"],
                                     c["do_row"], c["do_col"]) is None
    fp16 = types.SimpleNamespace(**{**vars(_fake_x()), "dtype": torch.float16})
    assert quant_triton._cuda_rowcol(fp16, 128, 1, 128, 128, True, True) is None


def test_unsupported_reason_names_the_culprit():
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert quant_cuda.unsupported_reason(x, 128, 1, 128, 128, True, True) == "x is on cpu"
    assert "only the fused row + column copies" in quant_cuda.unsupported_reason(x, 128, 1, 128, 128, True, False)
    assert "column 64 x 128 is not one of" in quant_cuda.unsupported_reason(x, 128, 1, 64, 128, True, True)
    with pytest.raises(ValueError, match="quant_cuda.rowcol: x is on cpu"):
        quant_cuda.rowcol(x, 128, 128, 128)


def test_missing_nvcc_is_one_line_error(monkeypatch, tmp_path):
    """No CUTLASS headers needed, and no nvcc is one line naming where it looked."""
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda"))
    monkeypatch.setenv("CUTLASS_INCLUDE_DIR", str(tmp_path / "no_cutlass"))  # must not matter
    quant_cuda._LOADED.clear()
    try:
        with pytest.raises(CutlassUnavailable) as e:
            quant_cuda.load()
    finally:
        quant_cuda._LOADED.clear()
    msg = str(e.value)
    assert "\n" not in msg and "nvcc not found" in msg and str(tmp_path / "no_cuda") in msg


def _nvcc():
    home = os.environ.get("CUDA_HOME")
    return os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")


@pytest.mark.skipif(not _nvcc() or not os.path.isfile(_nvcc() or ""), reason="no nvcc on this machine")
def test_kernels_build_for_sm90a_at_two_ctas_per_sm(tmp_path):
    """The kernels alone (-DROWCOL_KERNEL_ONLY: no torch headers) compile for sm_90a in every layout without spills
    or a stack frame (local memory) and within 128 registers a thread: two 256-thread CTAs per SM, which the
    measured speed assumes."""
    src = os.path.join(quant_cuda.SRC_DIR, quant_cuda.SOURCES[0])
    out = subprocess.run([_nvcc(), "-O3", "-std=c++17", "-DROWCOL_KERNEL_ONLY", "-gencode=arch=compute_90a,code=sm_90a",
                          "-cubin", "-o", str(tmp_path / "k.cubin"), src, "-Xptxas", "-v"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", out.stderr)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out.stderr)]
    frames = [int(f) for f in re.findall(r"(\d+) bytes stack frame", out.stderr)]
    kernels = len(quant_cuda.LAYOUTS)
    assert len(regs) == kernels and len(spills) == kernels and len(frames) == kernels, out.stderr[-3000:]
    assert max(regs) <= 128 and not any(spills) and not any(frames), out.stderr[-3000:]


def test_load_source_builds_a_variant_with_its_defines_under_its_own_name(monkeypatch):
    """benchmarks/quant_rowcol_cuda.py --variant: this tree's source with build-time defines, as a separate module
    (the tag), so the default build and the variant load side by side in one process."""
    got = {}

    def fake_build(name, src_dir, sources, headers, what, defines=(), tag="", cutlass=True):
        got.update(name=name, src_dir=src_dir, sources=sources, defines=defines, tag=tag, cutlass=cutlass)
        return "ext"

    monkeypatch.setattr(quant_cuda, "build_extension", fake_build)
    assert quant_cuda.load_source(quant_cuda.SOURCE_PATH, "v_mb3", ["-DROWCOL_MIN_BLOCKS=3"]) == "ext"
    assert got == dict(name="titan_fp8_rowcol_quant", src_dir=quant_cuda.SRC_DIR, sources=(quant_cuda.SOURCES[0],),
                       defines=("-DROWCOL_MIN_BLOCKS=3",), tag="v_mb3", cutlass=False)


class _RecordingExt:
    """What quant_cuda.rowcol hands the extension (no GPU here: the launch is recorded, not run)."""
    def __init__(self):
        self.args = None

    def rowcol(self, *args):
        self.args = args


@pytest.mark.parametrize("given,launched", [(None, 0), (0, 0), (2, 2)])
def test_grid_defaults_to_one_cta_per_tile(monkeypatch, given, launched):
    """ctas_per_sm reaches the launcher as its last argument: CTAS_PER_SM (0, one CTA per tile: session 44's
    default) unless the call names a persistent grid."""
    monkeypatch.setattr(quant_cuda, "unsupported_reason", lambda *a: None)
    ext = _RecordingExt()
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    quant_cuda.rowcol(x, 128, 128, 128, ext=ext, ctas_per_sm=given)
    assert quant_cuda.CTAS_PER_SM == 0 and ext.args[-1] == launched


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_bad_grid_is_named(monkeypatch, bad):
    monkeypatch.setattr(quant_cuda, "unsupported_reason", lambda *a: None)
    with pytest.raises(ValueError, match=r"quant_cuda.rowcol: ctas_per_sm = "):
        quant_cuda.rowcol(torch.zeros(64, 64, dtype=torch.bfloat16), 128, 128, 128, ext=_RecordingExt(),
                          ctas_per_sm=bad)
