"""MXFP8 grouped GEMMs (kernels/grouped_gemm) and the experts autograd op (titan_fp8/float8/experts.py).

Triton kernels run interpreted on CPU (TRITON_INTERPRET=1, set by tests/conftest.py) at tiny shapes; every
result is compared with the float64 dequantize-then-matmul references on fresh random data. Shapes are
chosen so that no size is a multiple of the kernels' tiles, groups are uneven, some are empty, and
offs[-1] < M (padding rows, filled with NaN to prove they are never read into a real row).
"""
import pytest
import torch

from kernels.grouped_gemm import (
    _launch_nt,
    _launch_wgrad,
    grouped_mm_dgrad_reference,
    grouped_mm_fprop_reference,
    grouped_mm_wgrad_reference,
    mxfp8_grouped_mm_dgrad,
    mxfp8_grouped_mm_fprop,
    mxfp8_grouped_mm_wgrad,
)
from kernels.grouped_gemm.quant import to_mxfp8_blocked
from kernels.mxfp8 import from_mxfp8, to_mxfp8

TOL_BF16 = 3e-3  # norm-wise, bf16 output (bf16 rounding alone gives ~1.7e-3)
TOL_FP32 = 1e-5  # fp32 output: only fp32 accumulation order differs from the float64 reference


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def offs_t(v):
    return torch.tensor(v, dtype=torch.int32)


# ------------------------------------------------------------------------------------------ quantization
@pytest.mark.parametrize("dim", [-1, -2])
def test_blocked_32x1_is_plain_mxfp8(dim):
    x = torch.randn(3, 64, 96) * torch.exp(torch.randn(3, 64, 1) * 3)
    x[0, :32, :32] = 0.0  # an all-zero block
    d, s = to_mxfp8_blocked(x, dim, 32, 1)
    d0, s0 = to_mxfp8(x, dim, backend="reference")
    assert torch.equal(d.view(torch.uint8), d0.view(torch.uint8)) and torch.equal(s, s0)


@pytest.mark.parametrize("block,tile", [(128, 1), (64, 128), (128, 128)])
def test_blocked_shares_the_largest_fine_scale(block, tile):
    x = torch.randn(160, 224) * torch.exp(torch.randn(160, 1) * 2)  # 224 % 128 != 0: a partial run
    d, s = to_mxfp8_blocked(x, -1, block, tile)
    _, s32 = to_mxfp8(x, -1, backend="reference")
    # the shared scale is the max of the 1x32 scales it covers (e is monotone in amax) ...
    run = block // 32
    for r0 in range(0, 160, tile):
        for c0 in range(0, s.shape[1], run):
            region = s[r0:r0 + tile, c0:c0 + run]
            assert (region == region.flatten()[0]).all()
            assert region.flatten()[0] == s32[r0:r0 + tile, c0:c0 + run].max()
    # ... and the pair decodes like any MXFP8 tensor, within e4m3's error
    assert rel(from_mxfp8(d, s), x) < 0.04


def _eq_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _token_major_reference(x, limit, block, tile):
    rows = torch.arange(x.shape[0])
    x = torch.where((rows < limit)[:, None], x, torch.zeros((), dtype=x.dtype))
    x = torch.nn.functional.pad(x, (0, 0, 0, (-x.shape[0]) % 32))
    return to_mxfp8_blocked(x.t(), -1, block, tile)


@pytest.mark.parametrize("amax_on_int_bits", [True, False], ids=["int32_amax", "storage_amax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rb,cb,ct,limit", [(128, 128, 128, 150), (32, 32, 1, 200), (64, 32, 128, 199),
                                            (32, 64, 1, 150)])
def test_triton_blocked_quantizer_is_bit_identical(dtype, rb, cb, ct, limit, amax_on_int_bits, monkeypatch):
    """One read of x -> row copy (1 x rb) and token-major copy (cb x ct tiles, rows >= limit zeroed,
    tokens padded to 32): the same bytes as quant.py's plain PyTorch (subnormal, zero, NaN, padding).
    storage_amax: the amax the compiled kernels take (bf16: the integer max of the 16-bit magnitude bits;
    fp32: the NaN-propagating float max), not the interpreter's default int32 max of the widened values."""
    import triton.language as tl

    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    from kernels.mxfp8 import triton as tk
    monkeypatch.setattr(tk, "_AMAX_ON_INT_BITS", tl.constexpr(amax_on_int_bits))
    torch.manual_seed(rb + cb + ct)
    x = (torch.randn(200, 224) * torch.exp(torch.randn(200, 1) * 3)).to(dtype)
    x[3, 5] = float("nan")
    x[7] = 0.0
    x[9, :4] = 1e-40
    x[150:] = float("nan")
    qr, sr, qc, sc = to_mxfp8_blocked_rowcol(x, row_block=rb, col_block=cb, col_tile=ct,
                                             limit=torch.tensor([limit], dtype=torch.int32))
    rd, rs = to_mxfp8_blocked(x, -1, rb, 1)
    cd, cs = _token_major_reference(x, limit, cb, ct)
    assert qc.shape == (224, 224) and sc.shape == (224, 7)
    assert _eq_bytes(qr, rd) and torch.equal(sr, rs) and _eq_bytes(qc, cd) and torch.equal(sc, cs)
    # quant.py's twin of the whole call (what the emulated paths run) writes the same four tensors
    from kernels.grouped_gemm.quant import to_mxfp8_blocked_rowcol_reference
    twin = to_mxfp8_blocked_rowcol_reference(x, row_block=rb, col_block=cb, col_tile=ct,
                                             limit=torch.tensor([limit], dtype=torch.int32))
    for got, want in zip(twin, (qr, sr, qc, sc)):
        assert got.shape == want.shape and _eq_bytes(got, want)
    assert to_mxfp8_blocked_rowcol_reference(x, do_row=False)[:2] == (None, None)


@pytest.mark.parametrize("block,tile", [(128, 128), (32, 128), (32, 1)])
def test_triton_blocked_quantizer_weights(block, tile):
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    w = torch.randn(3, 256, 160) * torch.exp(torch.randn(3, 256, 1))
    qr, sr, _, _ = to_mxfp8_blocked_rowcol(w, row_block=block, row_tile=tile, do_col=False)
    _, _, qc, sc = to_mxfp8_blocked_rowcol(w, col_block=block, col_tile=tile, do_row=False)
    rd, rs = to_mxfp8_blocked(w, -1, block, tile)
    cd, cs = to_mxfp8_blocked(w.transpose(1, 2), -1, block, tile)  # W^T [E, K, N] along N (dgrad)
    assert _eq_bytes(qr, rd) and torch.equal(sr, rs) and _eq_bytes(qc, cd) and torch.equal(sc, cs)


# ------------------------------------------------------------------------------------------ fprop / dgrad
def _rows_with_nan_padding(M, K, offs_last):
    x = torch.randn(M, K) * torch.exp(torch.randn(M, 1))
    x[offs_last:] = float("nan")
    return x


@pytest.mark.parametrize("block,tile", [(32, 1), (32, 128), (64, 1), (128, 128)])
def test_fprop_matches_reference(block, tile):
    torch.manual_seed(block + tile)
    M, K, N, E = 100, 224, 160, 4   # K % 128 != 0, N % 128 != 0, M % 64 != 0
    offs = offs_t([10, 10, 45, 90])  # uneven, one empty, rows 90.. are padding
    x = _rows_with_nan_padding(M, K, 90)
    w = torch.randn(E, N, K) * 0.05
    ad, as_ = to_mxfp8_blocked(x, -1, block, 1)
    wd, ws = to_mxfp8_blocked(w, -1, block, tile)
    out = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=block, w_tile=tile)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    ref = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    assert torch.equal(out[90:], torch.zeros_like(out[90:]))  # padding rows: zeros, not NaN
    assert rel(out[:90], ref[:90]) < TOL_BF16
    out32 = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, torch.float32, block=block, w_tile=tile)
    assert rel(out32[:90], ref[:90]) < TOL_FP32


@pytest.mark.parametrize("block,tile", [(32, 128), (128, 128), (32, 1)])
def test_dgrad_matches_reference(block, tile):
    torch.manual_seed(7 + block + tile)
    M, N, K, E = 70, 160, 96, 3
    offs = offs_t([0, 33, 61])
    do = _rows_with_nan_padding(M, N, 61)
    w = torch.randn(E, N, K) * 0.05
    dd, ds = to_mxfp8_blocked(do, -1, block, 1)
    wd, ws = to_mxfp8_blocked(w, -2, block, tile)  # W scaled along N: scale [E, N/32, K]
    out = mxfp8_grouped_mm_dgrad(dd, ds, wd, ws, offs, block=block, w_tile=tile)
    ref = grouped_mm_dgrad_reference(dd, ds, wd, ws, offs, out_dtype=torch.float64)
    assert out.shape == (M, K)
    assert torch.equal(out[61:], torch.zeros_like(out[61:]))
    assert rel(out[:61], ref[:61]) < TOL_BF16


def test_fprop_tma_and_pipelined_paths():
    """The GPU defaults use TMA descriptors; the interpreter runs the same code path."""
    torch.manual_seed(3)
    M, K, N, E = 150, 256, 256, 3
    offs = offs_t([40, 40, 130])
    x = _rows_with_nan_padding(M, K, 130)
    w = torch.randn(E, N, K) * 0.05
    for block in (32, 128):
        ad, as_ = to_mxfp8_blocked(x, -1, block, 1)
        wd, ws = to_mxfp8_blocked(w, -1, block, 128)
        ref = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
        for extra in ({"USE_TMA": True}, {"PIPE": True, "USE_TMA": True}):
            out = _launch_nt(ad, as_, wd, ws, offs, torch.float32, block, True, (64, 128, 1, 4, 3, 8, extra))
            assert rel(out[:130], ref[:130]) < TOL_FP32, extra
            assert torch.equal(out[130:], torch.zeros_like(out[130:]))


def test_fprop_zeros_and_nonfinite():
    M, K, N, E = 64, 64, 128, 2
    offs = offs_t([20, 64])
    x = torch.zeros(M, K)
    x[5, 3] = float("inf")  # row 5's first block -> NaN scale -> row 5 NaN, no other row touched
    w = torch.randn(E, N, K)
    w[1, :, 32:] = 0.0  # zero blocks in expert 1 (scale byte 0 = 2^-127)
    ad, as_ = to_mxfp8_blocked(x, -1, 32, 1)
    wd, ws = to_mxfp8_blocked(w, -1, 32, 1)
    out = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs)
    assert torch.isnan(out[5]).all()
    others = torch.cat([out[:5], out[6:]])
    assert torch.equal(others, torch.zeros_like(others))


# ------------------------------------------------------------------------------------------ wgrad
@pytest.mark.parametrize("block,tile", [(32, 1), (128, 1), (128, 128), (32, 128)])
def test_wgrad_matches_reference(block, tile):
    torch.manual_seed(11 + block + tile)
    M, K, N = 320, 160, 96
    offs = offs_t([10, 10, 45, 170, 250])  # boundaries inside 32- and 128-token blocks; one empty group
    x = torch.randn(M, K)
    do = torch.randn(M, N) * torch.exp(torch.randn(M, 1))
    x[256:] = float("nan")  # whole 32-blocks past offs[-1]: never read into any group
    do[256:] = float("nan")
    xt, xs = to_mxfp8_blocked(x.t(), -1, block, tile)
    dt, ds = to_mxfp8_blocked(do.t(), -1, block, 1)
    out = mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, block=block, a_tile=tile)
    assert out.shape == (5, N, K) and out.dtype == torch.float32
    ref = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # empty group
    assert rel(out, ref) < TOL_FP32
    outb = mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, torch.bfloat16, block=block, a_tile=tile)
    assert rel(outb, ref) < TOL_BF16


def test_wgrad_tma_path():
    torch.manual_seed(5)
    M, K, N = 384, 128, 128
    offs = offs_t([100, 256, 300])
    x, do = torch.randn(M, K), torch.randn(M, N)
    xt, xs = to_mxfp8_blocked(x.t(), -1, 128, 128)
    dt, ds = to_mxfp8_blocked(do.t(), -1, 128, 1)
    out = _launch_wgrad(dt, ds, xt, xs, offs, torch.float32, 128, True, (64, 128, 4, 4, 8, {"USE_TMA": True}))
    ref = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    assert rel(out, ref) < TOL_FP32


# ------------------------------------------------------------------------------------------ errors
def test_bad_inputs_name_the_culprit():
    x = torch.randn(64, 64)
    ad, as_ = to_mxfp8(x, -1, backend="reference")
    wd, ws = to_mxfp8(torch.randn(2, 128, 64), -1, backend="reference")
    offs = offs_t([32, 64])
    with pytest.raises(ValueError, match="a_data must be a torch.float8_e4m3fn"):
        mxfp8_grouped_mm_fprop(x, as_, wd, ws, offs)
    with pytest.raises(ValueError, match="w_scale.shape"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws[:, :, :1], offs)
    with pytest.raises(ValueError, match="offs must be a 1-D torch.int32"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs.long())
    with pytest.raises(ValueError, match="offs has 3 groups"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs_t([1, 2, 3]))
    with pytest.raises(ValueError, match="block=48"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=48)
    d40 = torch.zeros(16, 40, dtype=torch.float8_e4m3fn)
    s40 = torch.zeros(16, 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="M=40 tokens is not a multiple of 32"):
        mxfp8_grouped_mm_wgrad(d40, s40, d40, s40, offs)


def test_declared_sharing_is_checked():
    """block=128 / w_tile=128 on plain 1x32 operands must fail loudly (device-side assert), not compute."""
    torch.manual_seed(0)
    x = torch.randn(64, 256) * torch.exp(torch.randn(64, 8).repeat_interleave(32, 1) * 3)
    ad, as_ = to_mxfp8(x, -1, backend="reference")
    wd, ws = to_mxfp8_blocked(torch.randn(2, 128, 256), -1, 128, 128)
    with pytest.raises(RuntimeError, match="not constant over runs"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs_t([32, 64]), block=128, w_tile=128)


def test_fake_impls_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        ad = torch.empty(96, 64, dtype=torch.float8_e4m3fn)
        as_ = torch.empty(96, 2, dtype=torch.uint8)
        wd = torch.empty(3, 128, 64, dtype=torch.float8_e4m3fn)
        ws = torch.empty(3, 128, 2, dtype=torch.uint8)
        offs = torch.empty(3, dtype=torch.int32)
        assert mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, validate=False).shape == (96, 128)
        wsn = torch.empty(3, 4, 64, dtype=torch.uint8)
        dd = torch.empty(96, 128, dtype=torch.float8_e4m3fn)
        dsc = torch.empty(96, 4, dtype=torch.uint8)
        assert mxfp8_grouped_mm_dgrad(dd, dsc, wd, wsn, offs, validate=False).shape == (96, 64)
        xt = torch.empty(64, 96, dtype=torch.float8_e4m3fn)
        xts = torch.empty(64, 3, dtype=torch.uint8)
        dt = torch.empty(128, 96, dtype=torch.float8_e4m3fn)
        dts = torch.empty(128, 3, dtype=torch.uint8)
        assert mxfp8_grouped_mm_wgrad(dt, dts, xt, xts, offs, validate=False).shape == (3, 128, 64)
        from kernels.grouped_gemm.quant_triton import _blocked_rowcol_op
        x = torch.empty(1, 100, 64, dtype=torch.bfloat16)
        qr, sr, qc, sc = _blocked_rowcol_op(x, offs[-1:], 128, 1, 128, 128, True, True)
        assert (qr.shape, sr.shape, qc.shape, sc.shape) == ((1, 100, 64), (1, 100, 2), (1, 64, 128), (1, 64, 4))
        assert qr.dtype == qc.dtype == torch.float8_e4m3fn and sr.dtype == sc.dtype == torch.uint8


# ------------------------------------------------------------------------------------------ autograd op
def _hp_grouped(x, w, offs):
    out = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype)
    s = 0
    for e, t in enumerate(offs.tolist()):
        out[s:t] = x[s:t] @ w[e].t()
        s = t
    return out


@pytest.mark.parametrize("granularity", ["mx128", "mx32", "mx32_plain"])
def test_autograd_op_kernels_match_emulation_and_high_precision(granularity):
    from titan_fp8.float8.experts import mxfp8_grouped_mm
    torch.manual_seed(1)
    T, K, N, E = 200, 128, 160, 4
    offs = offs_t([30, 30, 130, 170])
    x = torch.randn(T, K).bfloat16()
    x[170:] = float("nan")  # padding rows (torch._grouped_mm leaves them uninitialised)
    w = (torch.randn(E, N, K) * 0.05).bfloat16()
    go = torch.randn(T, N).bfloat16()
    res = {}
    for backend in ("emulated", "triton"):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = mxfp8_grouped_mm(xr, wr, offs, granularity=granularity, backend=backend)
        out.backward(go)
        res[backend] = (out.detach(), xr.grad, wr.grad)
    xh = x.double().nan_to_num(0.0).requires_grad_()
    wh = w.double().requires_grad_()
    outh = _hp_grouped(xh, wh, offs)
    outh.backward(go.double())
    for i, ref in enumerate((outh.detach(), xh.grad, wh.grad)):
        emu, tri = res["emulated"][i], res["triton"][i]
        assert torch.isfinite(tri).all()
        assert rel(tri, emu) < 5e-3          # same quantized operands: only accumulation/rounding differs
        assert rel(tri, ref) < 0.06          # e4m3 quantization of two operands (~0.027 each)
    out, dx, _ = res["triton"]
    assert torch.equal(out[170:], torch.zeros_like(out[170:]))
    assert torch.equal(dx[170:], torch.zeros_like(dx[170:]))


def test_autograd_op_saves_float8_not_bf16():
    from titan_fp8.float8.experts import mxfp8_grouped_mm
    T, K, N, E = 64, 64, 128, 2
    x = torch.randn(T, K).bfloat16().requires_grad_()
    w = (torch.randn(E, N, K) * 0.05).bfloat16().requires_grad_()
    out = mxfp8_grouped_mm(x, w, offs_t([20, 64]), backend="emulated")
    saved = out.grad_fn.saved_tensors
    acts = [t for t in saved if t is not None and t.dim() == 2 and t.numel() >= T * K]
    assert acts and all(t.dtype == torch.float8_e4m3fn for t in acts)
    assert not any(t.dtype == torch.bfloat16 and t.dim() == 2 for t in saved if t is not None)


def test_autograd_op_rejects_bad_inputs():
    from titan_fp8.float8.experts import mxfp8_grouped_mm
    x, w = torch.randn(64, 64), torch.randn(2, 128, 64)
    with pytest.raises(ValueError, match="offs must be int32"):
        mxfp8_grouped_mm(x, w, torch.tensor([32, 64]))
    with pytest.raises(ValueError, match="granularity='mx16'"):
        mxfp8_grouped_mm(x, w, offs_t([32, 64]), granularity="mx16")
    with pytest.raises(ValueError, match="multiples of 32"):
        mxfp8_grouped_mm(torch.randn(64, 40), torch.randn(2, 128, 40), offs_t([32, 64]))


def test_offs_past_the_tensor_are_clamped_not_followed():
    """offs is not checked on the host (that would sync); offs[-1] > M must still stay inside the tensors:
    the kernels clamp group ends to M, which is what the references' slicing does too."""
    torch.manual_seed(4)
    M, K, N = 96, 64, 128
    offs = offs_t([40, 500])
    x, w = torch.randn(M, K), torch.randn(2, N, K) * 0.05
    ad, as_ = to_mxfp8(x, -1, backend="reference")
    wd, ws = to_mxfp8(w, -1, backend="reference")
    out = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, torch.float32)
    assert rel(out, grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)) < TOL_FP32
    dt, ds = to_mxfp8(torch.randn(M, N).t().contiguous(), -1, backend="reference")
    xt, xs = to_mxfp8(x.t().contiguous(), -1, backend="reference")
    dw = mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs)
    assert rel(dw, grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)) < TOL_FP32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiles_many_equals_blocked_quantizer_per_tensor(dtype):
    """One launch over a block's MXFP8 weight shards (2-D Linear weights, a 3-D expert weight): each equals
    quant.to_mxfp8_blocked(x, -1, 128, 128) bit for bit, its scale one byte per 128x128 tile; tiles that are all
    zero, hold a subnormal, a huge value, an inf or a NaN included. A second call reuses the launch table and
    sees new values."""
    from kernels.grouped_gemm.quant_triton import to_mxfp8_tiles_many
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(256, 128, generator=g), torch.randn(2, 128, 256, generator=g) * 1e-3,
          torch.randn(128, 256, generator=g) * 1e4]
    xs[0][:128] = 0                      # an all-zero tile
    xs[0][130, 5] = 1e-40                # a subnormal (fp32; 0 in bf16)
    xs[1][0, 3, 200] = 3e38              # a huge value
    xs[1][1, 7, 9] = float("inf")        # a non-finite tile
    xs[2][100, 130] = float("nan")
    xs = [x.to(dtype) for x in xs]
    for _ in range(2):
        got = to_mxfp8_tiles_many(xs)
        for i, ((data, scale), x) in enumerate(zip(got, xs)):
            want_d, want_s = to_mxfp8_blocked(x, -1, 128, 128)
            assert data.shape == x.shape and scale.shape == (*x.shape[:-2], x.shape[-2] // 128, x.shape[-1] // 128)
            assert torch.equal(data.view(torch.uint8), want_d.view(torch.uint8)), i
            assert torch.equal(scale, want_s[..., ::128, ::4]), i
        xs[0].mul_(-2)
    with pytest.raises(ValueError, match="multiples of 128"):
        to_mxfp8_tiles_many([torch.randn(128, 96)])
    with pytest.raises(ValueError, match="one dtype and device"):
        to_mxfp8_tiles_many([xs[0], xs[0].half()])


_COMPILE_ROWCOL = r"""
import json, os, re, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1])
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.grouped_gemm.quant_triton import _blocked_rowcol_kernel

worker, workers = int(sys.argv[2]), int(sys.argv[3])  # this process compiles every workers-th case
out = {}
job = -1
for dt in ("bf16", "fp16", "fp32"):
    # name: (row block, row tile, column block, column tile, F32, program rows, warps)
    cases = {"x_mx128": (128, 1, 128, 128, False, 128, 8), "dO_mx128": (128, 1, 128, 1, False, 128, 8),
             "x_mx32": (32, 1, 32, 1, False, 128, 8), "linear_f32": (128, 128, 128, 128, True, 128, 8),
             "dO_mx32_64x128": (32, 1, 32, 1, False, 64, 2)}
    for name, (rb, rt, cb, ct, f32, bm, warps) in cases.items():
        job += 1
        if job % workers != worker:
            continue
        sig = dict(x_ptr="*" + dt, qr_ptr="*u8", sr_ptr="*fp32" if f32 else "*u8", qc_ptr="*u8",
                   sc_ptr="*fp32" if f32 else "*u8", limit_ptr="*i32", M="i32", K="i32", MC="i32", sxb="i64",
                   sqrb="i64", ssrb="i64", sqcb="i64", sscb="i64", sr0="i32", sr1="i32", sc0="i32", sc1="i32")
        cx = dict(BM=bm, BK=128, RB=rb, RT=rt, CB=cb, CT=ct, DO_ROW=True, DO_COL=True, USE_LIMIT=not f32,
                  HW_CAST=True, IS_BF16=False, F32=f32)
        names = list(sig)
        # what a real launch specializes on: 16-divisible pointers, sizes and strides (vectorized 16-byte access)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names[:14]}
        for k in cx:
            sig[k] = "constexpr"
        c = triton.compile(ASTSource(_blocked_rowcol_kernel, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=warps))
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "k.ptx"), "w") as f:
                f.write(c.asm["ptx"])
            log = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o",
                                  os.path.join(d, "k.cubin")], capture_output=True, text=True, check=True).stderr
        regs = int(re.search(r"Used (\d+) registers", log).group(1))
        out[f"{dt}/{name}"] = (regs, "0 bytes spill stores" in log)
print(json.dumps(out))
"""


def test_rowcol_quantizer_compiles_for_sm90_in_two_ctas_per_sm():
    """The quantizer compiled for sm_90 (triton's ptxas, no GPU) for bf16 / fp16 / fp32 input, as a launch
    specializes it (with rowcol_launch's program tile and warps: the mx32 dO copies 64 x 128 at 2 warps): no
    spills, and the bf16 mx128 copies (the expert op's activations and gradients) fit two 8-warp CTAs per SM
    (<= 128 registers). Holding the tile as fp32 took 163 registers (one CTA per SM) and ran
    those copies at 1.5 TB/s; in its storage type 101 and 1.9 TB/s (H100, benchmarks/results/issue10_s23/).
    In fresh processes without TRITON_INTERPRET (see tests/cpu/test_grouped_gemm_gluon.py's sm90 fixture), one per
    CPU core up to 4, each compiling every n-th of the 15 cases."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workers = max(1, min(4, len(os.sched_getaffinity(0))))
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_ROWCOL, root, str(w), str(workers)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(workers)]
    res = {}
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            res.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert len(res) == 15, sorted(res)
    assert all(no_spill for _, no_spill in res.values()), res
    assert res["bf16/x_mx128"][0] <= 128 and res["bf16/dO_mx128"][0] <= 128, res


def test_blocked_rowcol_launch_follows_the_layout(monkeypatch):
    """Fixed program tile and warps per layout (no autotuner): 64 x 128 at 2 warps for a 1x32 column copy beside the
    row copy and for a 32-token column copy alone (measured 1.18-1.37x / 1.03-1.05x faster on an H100), 128 x 128 at
    4 for the 32x128 column copy beside the row copy, 128 x 128 at ROWCOL_NUM_WARPS for every other layout (a row copy
    in 128-row tiles keeps 128 rows); explicit num_warps / tile win; the interpreter runs 4 warps, same tiles."""
    from kernels.grouped_gemm import quant_triton as qt
    monkeypatch.setattr(qt, "_INTERPRET", False)
    L = qt.rowcol_launch  # (row_tile, col_block, col_tile, do_row, do_col)
    assert L(1, 32, 1, True, True) == (64, 128, 2)  # the mx32 dO rows + dO^T
    assert L(1, 32, 128, False, True) == (64, 128, 2)  # the mx32 W^T alone
    assert L(1, 32, 128, True, True) == (128, 128, 4)  # the mx32 x rows + x^T tiles
    assert L(128, 32, 1, True, True) == (128, 128, 4)  # 128-row tiles of the row copy need 128 rows
    assert L(1, 128, 128, True, True) == L(128, 128, 128, False, True) == (128, 128, qt.ROWCOL_NUM_WARPS)
    assert L(128, 32, 1, True, False) == (128, 128, 8)  # rows only (col_block unused)
    monkeypatch.setattr(qt, "_INTERPRET", True)
    assert L(1, 128, 1, True, True) == (128, 128, 4) and L(1, 32, 1, True, True) == (64, 128, 4)
    seen = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((grid[0], kwargs["BM"], kwargs["num_warps"]))
    monkeypatch.setattr(qt, "_blocked_rowcol_kernel", FakeKernel())
    monkeypatch.setattr(qt, "_INTERPRET", False)
    monkeypatch.setattr(qt, "default_hw_cast", lambda dev: False)
    x3 = torch.zeros(1, 256, 128)
    qt._run(x3, None, 32, 1, 32, 128, True, True)
    qt._run(x3, None, 128, 1, 128, 1, True, True)
    qt._run(x3, None, 32, 1, 32, 128, True, True, num_warps=16)
    qt._run(x3, None, 32, 1, 32, 1, True, True)
    qt._run(x3, None, 32, 1, 32, 1, True, True, tile=(32, 64))
    assert seen == [(2, 128, 4), (2, 128, 8), (2, 128, 16), (4, 64, 2), (8, 32, 2)]
    with pytest.raises(ValueError, match="program tile"):  # a 128-row tile cannot fit a 64-row program
        qt._run(x3, None, 32, 128, 32, 1, True, True, tile=(64, 128))
