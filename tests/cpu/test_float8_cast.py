"""kernels/float8_cast: the Triton casts (TRITON_INTERPRET=1 here) bit for bit against the plain PyTorch
reference, and the reference against the definition in float64 (power-of-two scales that fit the group in
range, nearest-even rounding, SQNR), on fresh random data with zeros, subnormals, huge values and
non-finite rows and columns; plus the errors bad input gets."""
import pytest
import torch

from kernels import float8_cast as fc
from kernels.float8_cast import reference as ref

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def special(M, N, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g) * torch.logspace(-25, 25, N)[None, :]
    x[1] = 0
    x[:, 2] = 0
    x[3, 5] = float("nan")
    x[4, 7] = float("-inf")
    x[6, 8] = 1e-40  # fp32 subnormal
    x[7, 9] = 3e38
    return x.to(dtype)


def same_bits(a, b):
    if a.dtype in (E4M3, E5M2):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and torch.equal(a.isnan(), b.isnan())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,N", [(64, 96), (33, 48), (16, 160)])
def test_triton_rowwise_and_colwise_equal_reference(M, N, dtype):
    x = special(M, N, dtype, seed=M * N)
    got, want = fc.to_float8_rowwise(x, backend="triton"), fc.to_float8_rowwise_reference(x)
    assert [t.shape for t in got] == [(M, N), (M, 1), (N,)]
    assert all(same_bits(a, b) for a, b in zip(got, want))
    got_c = fc.to_float8_colwise_transposed(x, got[2], backend="triton")
    want_c = fc.to_float8_colwise_transposed_reference(x, want[2])
    assert got_c[0].shape == (N, M) and got_c[0].is_contiguous() and got_c[1].shape == (1, N)
    assert all(same_bits(a, b) for a, b in zip(got_c, want_c))


@pytest.mark.parametrize("f8", [E4M3, E5M2])
@pytest.mark.parametrize("scale", [None, 1e6, float("nan")])  # from amax / saturating / non-finite amax
def test_triton_tensorwise_transposes_equal_reference(f8, scale):
    x = (torch.randn(48, 80) * torch.logspace(-12, 12, 80)).to(torch.bfloat16)
    x[2, 3] = 0
    s = fc.amax_to_scale(x.abs().max().float(), f8) if scale is None else torch.tensor(scale)
    data, data_t = fc.to_float8_with_transpose(x, s, f8, backend="triton")
    want = fc.to_float8(x, s, f8)
    assert same_bits(data, want) and same_bits(data_t, want.t().contiguous())
    assert same_bits(fc.to_float8_transposed(x, s, f8, backend="triton"), want.t().contiguous())
    assert same_bits(fc.to_float8_transposed(x, s, f8, backend="reference"), want.t().contiguous())


@pytest.mark.parametrize("f8", [E4M3, E5M2])
@pytest.mark.parametrize("scale", ["amax", "amax_nan", 1e6, float("nan")])
@pytest.mark.parametrize("dtype,shape", [(torch.bfloat16, (3, 50, 70)), (torch.float32, (37, 41)),
                                         (torch.bfloat16, (129,))])
def test_triton_tensorwise_cast_equals_reference(f8, scale, dtype, shape):
    """The eager one-pass cast (FSDP2's weight casts) equals to_float8 bit for bit, any shape (odd sizes leave
    a partial block), with zeros, subnormals, huge and infinite values; scales from the amax, saturating, NaN.
    A NaN element comes with the scale of its own amax ("amax_nan": NaN counted as inf -> NaN scale -> every
    byte NaN), as the tensorwise recipe makes it; the interpreter's integer encoding (FACTS.md) has no NaN
    path of its own for a NaN element under a finite scale, which the recipe never asks for."""
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=g) * torch.logspace(-30, 30, shape[-1])
    flat = x.view(-1)
    flat[:6] = torch.tensor([0.0, -0.0, 1e-40, 3e38, float("inf"), -float("inf")])
    if scale == "amax_nan":
        flat[7] = float("nan")
    x = x.to(dtype)
    if scale in ("amax", "amax_nan"):
        amax = x.float().abs().nan_to_num(float("inf"))
        s = fc.amax_to_scale(amax.nan_to_num(0, 0, 0).max() if scale == "amax" else amax.max(), f8)
    else:
        s = torch.tensor(scale)
    got = fc.to_float8_tensorwise(x, s, f8, backend="triton")
    assert got.shape == x.shape and got.dtype == f8
    assert same_bits(got, fc.to_float8(x, s, f8))
    assert same_bits(fc.to_float8_tensorwise(x, s, f8, backend="reference"), fc.to_float8(x, s, f8))
    assert fc.to_float8_tensorwise(x[:0], s, f8, backend="triton").shape == x[:0].shape


def test_tensorwise_cast_bad_input_is_named():
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match="scale must be ONE fp32"):
        fc.to_float8_tensorwise(x, torch.ones(2))
    with pytest.raises(ValueError, match="float8_dtype"):
        fc.to_float8_tensorwise(x, torch.tensor(1.0), torch.bfloat16)
    with pytest.raises(ValueError, match="high-precision"):
        fc.to_float8_tensorwise(x.to(E4M3), torch.tensor(1.0))


def test_reference_against_float64_definition():
    torch.manual_seed(0)
    x = special(96, 64, torch.float32, seed=5)
    data, scale, col_amax = fc.to_float8_rowwise_reference(x)
    x64 = x.double()
    finite_rows = torch.isfinite(x64).all(1)
    amax = x64.abs().amax(1)
    s = scale[:, 0].double()
    # power of two, the largest one keeping the row inside e4m3's range (amax 0 -> EPS)
    rows = finite_rows
    assert torch.equal(torch.log2(s[rows]), torch.log2(s[rows]).round())
    a = amax[rows].clamp(min=ref.EPS)
    assert bool((a * s[rows] <= 448).all()) and bool((a * s[rows] * 2 > 448).all())
    # non-finite rows: NaN scale, every element NaN
    assert bool(scale[~finite_rows].isnan().all()) and bool(data[~finite_rows].float().isnan().all())
    # zero row: exact zeros, finite scale
    assert torch.isfinite(scale[1]).all() and bool((data[1].float() == 0).all())
    # nearest rounding onto the e4m3 grid (no value moves more than half a grid step), SQNR on a normal row
    deq = data[rows].double() / s[rows, None]
    assert bool(((deq - x64[rows]).abs() <= (x64[rows].abs() * 2.0 ** -4 + 2.0 ** -10 / s[rows, None])).all())
    r = torch.randn(256, 512, dtype=torch.float64)
    d, sc, _ = fc.to_float8_rowwise_reference(r.float())
    err = r - d.double() / sc.double()
    assert 20 * torch.log10(r.norm() / err.norm()) >= 28  # e4m3 with power-of-two row scales: ~30-31 dB
    # column amax: max |x| per column, NaN counted as inf
    want = torch.where(x64.isnan(), float("inf"), x64.abs()).amax(0).float()
    assert torch.equal(col_amax, want)


def test_empty_and_long_rows_take_the_reference():
    x = torch.zeros(0, 64, dtype=torch.bfloat16)
    data, scale, col_amax = fc.to_float8_rowwise(x, backend="triton")  # empty: reference, no kernel
    assert data.shape == (0, 64) and scale.shape == (0, 1) and torch.equal(col_amax, torch.zeros(64))
    from kernels.float8_cast import triton as tk
    assert fc._MAX_ROW == tk._MAX_ROW
    assert not fc._use_triton(torch.zeros(2, fc._MAX_ROW + 16), "auto", fc._MAX_ROW + 16)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="2-D"):
        fc.to_float8_rowwise(torch.zeros(4))
    with pytest.raises(ValueError, match="high-precision"):
        fc.to_float8_rowwise(torch.zeros(4, 4, dtype=E4M3))
    with pytest.raises(ValueError, match=r"col_amax must be fp32 \[8\]"):
        fc.to_float8_colwise_transposed(torch.zeros(4, 8), torch.zeros(4))
    with pytest.raises(ValueError, match="ONE fp32"):
        fc.to_float8_transposed(torch.zeros(4, 8), torch.ones(2))
    with pytest.raises(ValueError, match="float8_dtype"):
        fc.to_float8_with_transpose(torch.zeros(4, 8), torch.ones(()), torch.bfloat16)
    with pytest.raises(ValueError, match="backend"):
        fc.to_float8_rowwise(torch.zeros(4, 8), backend="cuda")


@pytest.mark.parametrize("f8", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_tensorwise_many_equals_one_cast_each(f8, dtype):
    """One launch over several tensors (a block's weight shards in FSDP2's all-gather) equals to_float8 of each
    with its own scale, bit for bit: uneven sizes (partial blocks, a tensor smaller than one block, an empty
    one), zeros, subnormals, huge and infinite values; scales from the amax, saturating, and NaN (a NaN element
    counted in its amax). A second call with the same tensors reuses the launch table and sees new values."""
    g = torch.Generator().manual_seed(7)
    shapes = [(37, 41), (129,), (0, 5), (3, 7, 11), (2,)]
    xs = [torch.randn(*s, generator=g) * (10.0 ** (6 * i - 12)) for i, s in enumerate(shapes)]
    xs[0].view(-1)[:6] = torch.tensor([0.0, -0.0, 1e-40, 3e38, float("inf"), -float("inf")])
    xs[3].view(-1)[5] = float("nan")
    xs = [x.to(dtype) for x in xs]
    amax = [x.float().abs().nan_to_num(float("inf")).max() if x.numel() else torch.tensor(0.0) for x in xs]
    scales = torch.stack([fc.amax_to_scale(a, f8) for a in amax])
    scales[1] = 1e6  # saturating
    for _ in range(2):
        got = fc.to_float8_tensorwise_many(xs, scales, f8, backend="triton")
        assert [t.shape for t in got] == [x.shape for x in xs] and all(t.dtype == f8 for t in got)
        for i, (t, x) in enumerate(zip(got, xs)):
            assert same_bits(t, fc.to_float8(x, scales[i], f8)), i
        assert bool(got[3].float().isnan().all())  # the NaN tensor's scale is NaN: all of it NaN
        assert got[0].untyped_storage().data_ptr() == got[4].untyped_storage().data_ptr()  # one buffer
        xs[4].mul_(-3)
    ref = fc.to_float8_tensorwise_many(xs, scales, f8, backend="reference")
    assert all(same_bits(a, fc.to_float8(x, scales[i], f8)) for i, (a, x) in enumerate(zip(ref, xs)))


def test_tensorwise_many_bad_input_is_named():
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match="non-empty list"):
        fc.to_float8_tensorwise_many([], torch.ones(0))
    with pytest.raises(ValueError, match="one dtype and device"):
        fc.to_float8_tensorwise_many([x, x.bfloat16()], torch.ones(2))
    with pytest.raises(ValueError, match=r"scales must be fp32 \[2\]"):
        fc.to_float8_tensorwise_many([x, x], torch.ones(3))
    with pytest.raises(ValueError, match="high-precision"):
        fc.to_float8_tensorwise_many([x.to(E4M3)], torch.ones(1))
