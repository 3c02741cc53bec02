"""CUDA C++ mx32 grouped GEMM (kernels/grouped_gemm/cuda_mx32.py: fprop / dgrad) on an sm_90 GPU: against the float64
reference at awkward group sizes with NaN/inf/huge/subnormal blocks, and bit for bit against the Gluon kernel (same
promotion order) with E8M0 0/1/254/255 in every byte position of the scale words.

Skips without an sm_90 GPU or without the toolchain (nvcc + CUTLASS headers).
"""
import pytest
import torch

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                reason="needs an sm_90 GPU")

TOL_BF16 = 3e-3
TOL_F32 = 2e-4  # fp32 output: the fp8 wgmma's own accumulation (measured 4.4e-5, as the Gluon fp32 wgrad)
SIZES = [0, 1, 31, 33, 127, 129, 1000, 2431]


@pytest.fixture(scope="module", autouse=True)
def _built():
    from kernels.grouped_gemm.cutlass_backend import CutlassUnavailable
    from kernels.grouped_gemm.cuda_mx32 import load
    try:
        load()
    except CutlassUnavailable as e:
        pytest.skip(f"cuda mx32 cannot build here: {e}")


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def _offs(sizes):
    return torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)


def _poison_allocator():
    t = torch.full((64 << 20,), float("nan"), device="cuda")
    del t


def _quant(x, block_tile):
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    return to_mxfp8_blocked(x, -1, *block_tile)


# K = 512: 4 stages (two unrolled 2-stage blocks); 640: 5 (a 1-stage remainder); 128: one stage; N = 200: a
# 2 column tiles
@pytest.mark.parametrize("K,N", [(512, 384), (640, 128), (128, 256)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_cuda_mx32_fprop_dgrad(K, N, out_dtype):
    from kernels.grouped_gemm import grouped_mm_dgrad_reference, grouped_mm_fprop_reference
    from kernels.grouped_gemm.cuda_mx32 import launch_nt
    torch.manual_seed(0)
    E, pad = len(SIZES), 77
    offs = _offs(SIZES)
    M = sum(SIZES) + pad
    x = torch.randn(M, K, device="cuda")
    x[-pad:] = float("nan")
    x[40, 64:96] = float("nan")  # a NaN block in a real row: that row's output is NaN, the others are not
    x[41, :32] *= 1e4            # a huge block next to normal ones
    x[42, 32:64] = 1e-30         # subnormal-range block
    w = torch.randn(E, N, K, device="cuda") * 0.02
    ad, as_ = _quant(x, (32, 1))
    wd, ws = _quant(w, (32, 128))
    _poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, out_dtype)
    ref = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    assert torch.equal(out[-pad:], torch.zeros_like(out[-pad:]))
    assert torch.isnan(out[40]).all() and torch.isfinite(out[:40]).all() and torch.isfinite(out[41:-pad]).all()
    keep = torch.ones(M, dtype=torch.bool, device="cuda")
    keep[40] = False
    keep[-pad:] = False
    assert rel(out[keep], ref[keep]) < (TOL_BF16 if out_dtype == torch.bfloat16 else TOL_F32)
    # dgrad as the op calls it: W^T contiguous [E, K, N], its scales through the transposed view (strided steps)
    do = torch.randn(M, N, device="cuda")
    do[-pad:] = float("inf")
    dd, ds = _quant(do, (32, 1))
    wtd, wts = _quant(w.transpose(1, 2).contiguous(), (32, 128))
    if N % 128 == 0:
        _poison_allocator()
        dx = launch_nt(dd, ds, wtd, wts, offs, out_dtype)
        refd = grouped_mm_dgrad_reference(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs,
                                          out_dtype=torch.float64)
        assert torch.equal(dx[-pad:], torch.zeros_like(dx[-pad:]))
        assert rel(dx[:-pad], refd[:-pad]) < (TOL_BF16 if out_dtype == torch.bfloat16 else TOL_F32)
        # strided weight-scale steps give the same bits as contiguous ones
        wts_strided = wts.transpose(1, 2).contiguous().transpose(1, 2)
        assert wts_strided.stride(2) != 1
        torch.testing.assert_close(launch_nt(dd, ds, wtd, wts_strided, offs, out_dtype), dx, rtol=0, atol=0,
                                   equal_nan=True)


def _special_scales(scale, rows, first_block):
    pats = [[0, 1, 254, 255], [255, 0, 0, 255], [0, 0, 0, 0], [127, 0, 130, 1], [254, 126, 0, 128]]
    for i, r in enumerate(rows):
        p = pats[i % len(pats)]
        p = p[i % 4:] + p[:i % 4]
        scale[r, first_block:first_block + 4] = torch.tensor(p, dtype=scale.dtype, device=scale.device)


@pytest.mark.parametrize("K", [512, 640])
def test_cuda_mx32_bit_exact_with_gluon_on_special_scales(K):
    """Same factors (exact E8M0 decode: 0 -> 2^-127, 255 -> NaN) and the same promotion order as the Gluon
    kernel: equal bit for bit (NaN where it has NaN); finite entries also match the float64 reference."""
    from kernels.grouped_gemm import grouped_mm_fprop_reference
    from kernels.grouped_gemm.cuda_mx32 import launch_nt
    from kernels.grouped_gemm.gluon_mx import launch_nt as gluon_nt
    torch.manual_seed(5)
    sizes = [0, 33, 129, 300, 1, 31, 200, 127]
    offs = _offs(sizes)
    M, N = sum(sizes) + 40, 256
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(len(sizes), N, K, device="cuda") * 0.02
    ad, as_ = _quant(x, (32, 1))
    wd, ws = _quant(w, (32, 128))
    _special_scales(as_, list(range(40, 60)), 0)
    _special_scales(as_, list(range(200, 210)), 8)
    _special_scales(as_, list(range(500, 505)), 12)
    ws[3, 0:128, 5] = 0
    ws[3, 128:256, 6] = 254
    ws[6, 0:128, 2] = 255
    ref = gluon_nt(ad, as_, wd, ws, offs, torch.bfloat16)
    _poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    r64 = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    fin = torch.isfinite(r64) & torch.isfinite(out.double())
    assert fin.double().mean() > 0.5
    assert rel(out[fin], r64[fin]) < TOL_BF16


def test_cuda_mx32_rejects_what_it_cannot_serve():
    from kernels.grouped_gemm.cuda_mx32 import launch_nt
    offs = _offs([64, 64])
    a = torch.zeros(128, 160, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.zeros(128, 5, dtype=torch.uint8, device="cuda")
    b = torch.zeros(2, 128, 160, device="cuda").to(torch.float8_e4m3fn)
    sb = torch.zeros(2, 128, 5, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="reduction length 160"):
        launch_nt(a, sa, b, sb, offs, torch.bfloat16)
