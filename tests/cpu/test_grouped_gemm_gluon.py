"""Gluon backend of the MXFP8 grouped GEMMs on CPU: dispatch and refusals (the interpreter does not run Gluon's
wgmma/TMA), plus a compile-only check of the kernels for sm_90a with triton's bundled ptxas: the mainloop
must keep a wgmma in flight while it promotes (wait_group 1), without spills and without ptxas serializing
the wgmmas (its C7510-C7520 "Potential Performance Loss" notes). The numbers are checked on the GPU
(tests/gpu/test_grouped_gemm_gluon_gpu.py)."""
import re

import pytest
import torch

from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad
from kernels.grouped_gemm.quant import to_mxfp8_blocked


def _operands(wtile=128):
    M, K, N, E = 96, 128, 128, 2
    ad, as_ = to_mxfp8_blocked(torch.randn(M, K), -1, 32, 1)
    wd, ws = to_mxfp8_blocked(torch.randn(E, N, K), -1, 32, wtile)
    offs = torch.tensor([40, 96], dtype=torch.int32)
    return ad, as_, wd, ws, offs


def test_unknown_backend_raises_naming_it():
    ad, as_, wd, ws, offs = _operands()
    with pytest.raises(ValueError, match="backend='cutlas'"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, w_tile=128, backend="cutlas")


def test_gluon_needs_tiled_scales():
    ad, as_, wd, ws, offs = _operands(wtile=1)
    with pytest.raises(ValueError, match="w_tile=1"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, backend="gluon")
    wtd, wts = to_mxfp8_blocked(torch.randn(2, 128, 128), -1, 32, 1)
    dd, ds = to_mxfp8_blocked(torch.randn(96, 128), -1, 32, 1)
    with pytest.raises(ValueError, match="w_tile=1"):
        mxfp8_grouped_mm_dgrad(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs, backend="gluon")
    xt, xs = to_mxfp8_blocked(torch.randn(128, 96), -1, 32, 1)
    with pytest.raises(ValueError, match="a_tile=1"):
        mxfp8_grouped_mm_wgrad(xt, xs, xt, xs, offs, backend="gluon")


def test_gluon_refuses_cpu_tensors_instead_of_falling_back():
    ad, as_, wd, ws, offs = _operands()
    with pytest.raises(ValueError, match="Gluon kernels need a CUDA device"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, w_tile=128, backend="gluon", validate=False)
    xt, xs = to_mxfp8_blocked(torch.randn(128, 96), -1, 32, 128)
    with pytest.raises(ValueError, match="Gluon kernels need a CUDA device"):
        mxfp8_grouped_mm_wgrad(xt, xs, xt, xs, offs, a_tile=128, backend="gluon", validate=False)


@pytest.mark.parametrize("kernel,out", [("nt", "bf16"), ("wgrad", "fp32")])
def test_gluon_kernels_compile_for_sm90_with_wgmma_in_flight(kernel, out):
    from kernels.grouped_gemm.gluon_mx import compile_sm90
    ptx, log = compile_sm90(kernel, out_dtype=out)
    assert "wgmma.mma_async" in ptx
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx), "no wgmma left in flight during promotion"
    assert "C75" not in log and "Potential Performance Loss" not in log, log
    assert "0 bytes spill stores" in log, log


def test_sync_schedule_never_waits_with_one_in_flight():
    """The guard above can fail: the comparison schedule (MODE 0) waits for every wgmma."""
    from kernels.grouped_gemm.gluon_mx import DEFAULT_CONFIG, compile_sm90
    ptx, _ = compile_sm90("nt", DEFAULT_CONFIG[:4] + (0,) + DEFAULT_CONFIG[5:])
    assert not re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)
