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


# candidates of 2026-11-25 (not measured on a GPU yet): MODE 5 = MODE 4 with the stage-wise E8M0 decode (one PRMT
# per step), MODE 6 = the static ring (MODE 3) with it; WS=1 with 8 warps = one consumer partition running the same
# mainloop code on both warpgroups (one copy: half the instruction-cache footprint of WS=2), persistent or not
NEW_NT = [(128, 128, 4, 8, 5, 8, 4, 4, 2, 1), (128, 128, 4, 8, 5, 8, 4, 4, 2), (128, 128, 4, 8, 5, 8, 4, 8, 1, 1),
          (128, 128, 4, 8, 5, 16, 4, 8, 1, 1), (128, 128, 4, 8, 6, 16, 4, 8, 1, 1), (128, 128, 4, 8, 6, 16, 4, 8, 1)]
NEW_WGRAD = [(128, 128, 4, 8, 5, 8, 4, 4, 2), (128, 128, 4, 8, 5, 8, 4, 8, 1), (128, 128, 4, 8, 5, 16, 4, 8, 1)]


@pytest.mark.parametrize("kernel,config", [("nt", c) for c in NEW_NT] + [("wgrad", c) for c in NEW_WGRAD])
def test_new_configs_compile_clean(kernel, config):
    from kernels.grouped_gemm.gluon_mx import compile_sm90
    ptx, log = compile_sm90(kernel, config, "bf16" if kernel == "nt" else "fp32")
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx), "no wgmma left in flight during promotion"
    assert "C75" not in log and "Potential Performance Loss" not in log, log
    assert "0 bytes spill stores" in log, log
    # the per-step decode is one byte permute per scale word: selectors [hi_i, lo_i, 0, 0] for steps 0-3
    for i in range(4):
        assert "prmt.b32" in ptx and str((i << 12) | ((4 + i) << 8) | 0x88) in ptx, i


def test_stagewise_e8m0_decode_is_exact():
    """MODE 5/6's SWAR decode (mirrored in Python by e8m0_prep_reference) gives the bits of _e8m0_to_f32 for every
    byte value in every position of the word, next to every kind of neighbour (0, 255, 1, 254, random)."""
    import random

    from kernels.grouped_gemm.gluon_mx import e8m0_prep_reference

    def bits(b):  # _e8m0_to_f32
        return (b << 23) | ((((b - 1) | (b + 1)) & 0x100) << 14)

    assert bits(0) == 0x00400000 and bits(255) == 0x7FC00000 and bits(127) == 0x3F800000
    rng = random.Random(0)
    for pos in range(4):
        for b in range(256):
            for _ in range(24):
                word = [rng.choice([0, 255, 1, 254, 127, rng.randrange(256)]) for _ in range(4)]
                word[pos] = b
                w = sum(v << (8 * i) for i, v in enumerate(word))
                assert e8m0_prep_reference(w) == [bits(v) for v in word], (hex(w), pos)
    # signed int32 words (the kernel loads int32): the same bits
    assert e8m0_prep_reference(-1) == [0x7FC00000] * 4
    assert e8m0_prep_reference(0) == [0x00400000] * 4


def test_new_configs_leave_the_defaults_alone():
    from kernels.grouped_gemm.gluon_mx import DEFAULT_CONFIG, WGRAD_DEFAULT_CONFIG
    assert DEFAULT_CONFIG == (128, 128, 4, 8, 4, 8, 4, 4, 2, 1)
    assert WGRAD_DEFAULT_CONFIG == (128, 128, 4, 8, 4, 8, 4, 4, 2)
