"""CUDA C++ grouped GEMMs (kernels/grouped_gemm/cuda_mx.py: fprop / dgrad, mx32 and mx128) on an sm_90 GPU: against
the float64 reference at awkward group sizes with NaN/inf/huge/subnormal blocks; mx32 bit for bit against the Gluon
kernel (same promotion order) with E8M0 0/1/254/255 in every byte position of the scale words, mx128 bit for bit
against the CUTLASS backend (same 128-deep partials, same promotion) with E8M0 0/254/255 scales.

Skips without an sm_90 GPU or without the toolchain (nvcc + CUTLASS headers).
"""
import pytest
import torch

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                reason="needs an sm_90 GPU")

from grouped_gemm_gpu_helpers import (TOL_BF16, check_fprop_output, check_special_vs_reference, dgrad_operands,
                                      group_offs, nt_operands, poison_allocator, rel, special_scale_operands)

TOL_F32 = 2e-4  # fp32 output: the fp8 wgmma's own accumulation (measured 4.4e-5, as the Gluon fp32 wgrad)


@pytest.fixture(scope="module", autouse=True)
def _built():
    from kernels.grouped_gemm.cutlass_backend import CutlassUnavailable
    from kernels.grouped_gemm.cuda_mx import load
    try:
        load()
    except CutlassUnavailable as e:
        pytest.skip(f"the cuda mx kernels cannot build here: {e}")


# K = 512: 4 ring stages; 640: 5 (more stages than the ring: slots reused); 128: one stage. N (and dgrad's K):
# 128 one column tile (mx128: 64 columns past C), 256 (mx128: a 64-wide last tile), 384 (mx128: two 192-wide tiles,
# the second across two weight tiles at its column 64), 224 columns past C inside a tile (fprop only: dgrad reduces
# over N, which must be a multiple of 128)
@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("K,N", [(512, 384), (640, 128), (640, 256), (128, 224)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_cuda_fprop_dgrad(block, K, N, out_dtype):
    from kernels.grouped_gemm import grouped_mm_dgrad_reference, grouped_mm_fprop_reference
    from kernels.grouped_gemm.cuda_mx import launch_nt
    tol = TOL_BF16 if out_dtype == torch.bfloat16 else TOL_F32
    o = nt_operands(K, N, block=block)
    offs, pad = o["offs"], o["pad"]
    poison_allocator()
    out = launch_nt(o["ad"], o["as_"], o["wd"], o["ws"], offs, out_dtype, block=block)
    ref = grouped_mm_fprop_reference(o["ad"], o["as_"], o["wd"], o["ws"], offs, out_dtype=torch.float64)
    check_fprop_output(out, o, ref, tol)
    if N % 128:
        return
    # dgrad as the op calls it: W^T contiguous [E, K, N], its scales through the transposed view (strided steps)
    dd, ds = dgrad_operands(o["M"], N, pad, block=block)
    poison_allocator()
    dx = launch_nt(dd, ds, o["wtd"], o["wts"], offs, out_dtype, block=block)
    refd = grouped_mm_dgrad_reference(dd, ds, o["wtd"].transpose(1, 2), o["wts"].transpose(1, 2), offs,
                                      out_dtype=torch.float64)
    assert torch.equal(dx[-pad:], torch.zeros_like(dx[-pad:]))
    assert rel(dx[:-pad], refd[:-pad]) < tol
    # strided weight-scale steps give the same bits as contiguous ones
    wts_strided = o["wts"].transpose(1, 2).contiguous().transpose(1, 2)
    assert wts_strided.stride(2) != 1
    torch.testing.assert_close(launch_nt(dd, ds, o["wtd"], wts_strided, offs, out_dtype, block=block), dx, rtol=0,
                               atol=0, equal_nan=True)


@pytest.mark.parametrize("K", [512, 640])
def test_cuda_mx32_bit_exact_with_gluon_on_special_scales(K):
    """Same factors (exact E8M0 decode: 0 -> 2^-127, 255 -> NaN) and the same promotion order as the Gluon
    kernel: equal bit for bit (NaN where it has NaN); finite entries also match the float64 reference."""
    from kernels.grouped_gemm.cuda_mx import launch_nt
    from kernels.grouped_gemm.gluon_mx import launch_nt as gluon_nt
    ad, as_, wd, ws, offs = special_scale_operands(K)
    ref = gluon_nt(ad, as_, wd, ws, offs, torch.bfloat16)
    poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    check_special_vs_reference(out, ad, as_, wd, ws, offs)


def test_cuda_mx32_rejects_what_it_cannot_serve():
    from kernels.grouped_gemm.cuda_mx import launch_nt
    offs = group_offs([64, 64])
    a = torch.zeros(128, 160, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.zeros(128, 5, dtype=torch.uint8, device="cuda")
    b = torch.zeros(2, 128, 160, device="cuda").to(torch.float8_e4m3fn)
    sb = torch.zeros(2, 128, 5, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="reduction length 160"):
        launch_nt(a, sa, b, sb, offs, torch.bfloat16)


def _cutlass_or_skip():
    from kernels.grouped_gemm.cutlass_backend import CutlassUnavailable, load
    try:
        load()
    except CutlassUnavailable as e:
        pytest.skip(f"the CUTLASS backend cannot build here: {e}")


@pytest.mark.parametrize("K,N", [(512, 384), (640, 256)])
def test_cuda_mx128_equals_cutlass_bit_for_bit(K, N):
    """fprop and dgrad: the CUTLASS backend's bits (bf16 out), on the awkward groups with NaN/huge/subnormal
    blocks and on E8M0 0/254/255 activation and weight-tile scales (NaN where CUTLASS has NaN)."""
    _cutlass_or_skip()
    from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop
    from kernels.grouped_gemm.cuda_mx import launch_nt
    o = nt_operands(K, N, block=128)
    offs = o["offs"]
    kw = dict(block=128, w_tile=128, validate=False, backend="cutlass")
    ref = mxfp8_grouped_mm_fprop(o["ad"], o["as_"], o["wd"], o["ws"], offs, **kw)
    out = launch_nt(o["ad"], o["as_"], o["wd"], o["ws"], offs, torch.bfloat16, block=128)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    dd, ds = dgrad_operands(o["M"], N, o["pad"], block=128)
    refd = mxfp8_grouped_mm_dgrad(dd, ds, o["wtd"].transpose(1, 2), o["wts"].transpose(1, 2), offs, **kw)
    outd = launch_nt(dd, ds, o["wtd"], o["wts"], offs, torch.bfloat16, block=128)
    torch.testing.assert_close(outd, refd, rtol=0, atol=0, equal_nan=True)
    ad, as_, wd, ws, offs = special_scale_operands(K, N, block=128)
    ref = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, **kw)
    out = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, block=128)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    check_special_vs_reference(out, ad, as_, wd, ws, offs)
