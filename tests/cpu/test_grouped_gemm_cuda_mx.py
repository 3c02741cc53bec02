"""CPU checks of the CUDA mx32 / mx128 kernels' plumbing (kernels/grouped_gemm/cuda_mx.py): the one-line toolchain
error, the compile-time variant parser, the block check and the limits it reports by operand name. The kernels
themselves: tests/gpu/test_grouped_gemm_cuda_mx_gpu.py."""
import pytest
import torch

from kernels.grouped_gemm import cuda_mx as cm
from kernels.grouped_gemm.cutlass_backend import CutlassUnavailable
from kernels.grouped_gemm.quant import to_mxfp8_blocked


def test_missing_headers_is_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTLASS_INCLUDE_DIR", str(tmp_path / "missing"))
    with pytest.raises(CutlassUnavailable) as e:
        cm.load()
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "missing") in msg and "pip install nvidia-cutlass" in msg


def test_variant_parser_names_the_bad_part():
    assert cm._defines("STAGES=4,BLOCK_STAGES=2") == ["-DMX32_STAGES=4", "-DMX32_BLOCK_STAGES=2"]
    assert cm._defines("MX128_STAGES=3") == ["-DMX128_STAGES=3"]
    assert cm._defines("") == []
    with pytest.raises(ValueError, match="'UNROLL=3'"):
        cm._defines("STAGES=4,UNROLL=3")
    with pytest.raises(ValueError, match="'STAGES=x'"):
        cm._defines("STAGES=x")


def _operands(K=256, N=128):
    x = torch.randn(64, K)
    w = torch.randn(2, N, K) * 0.02
    ad, as_ = to_mxfp8_blocked(x, -1, 32, 1)
    wd, ws = to_mxfp8_blocked(w, -1, 32, 128)
    return ad, as_, wd, ws


def test_unsupported_reason_names_the_operand():
    ad, as_, wd, ws = _operands()
    assert cm.unsupported_reason(ad, as_, wd, ws, torch.bfloat16) is None
    a2, s2, w2, ws2 = _operands(K=160)
    assert "reduction length 160" in cm.unsupported_reason(a2, s2, w2, ws2, torch.bfloat16)
    assert "out_dtype" in cm.unsupported_reason(ad, as_, wd, ws, torch.float16)
    assert "A (shape" in cm.unsupported_reason(ad.t().contiguous().t(), as_, wd, ws, torch.bfloat16)
    assert "A's scales" in cm.unsupported_reason(ad, as_[:, 1:], wd, ws, torch.bfloat16)


def test_block_other_than_32_or_128_is_refused_by_name():
    ad, as_, wd, ws = _operands()
    with pytest.raises(ValueError, match="block=64; 32 or 128"):
        cm.launch_nt(ad, as_, wd, ws, torch.tensor([32, 64], dtype=torch.int32), torch.bfloat16, block=64)
