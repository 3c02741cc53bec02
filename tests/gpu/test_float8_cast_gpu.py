"""kernels/float8_cast on a GPU: the Triton casts bit for bit against the reference at the model's shapes (with
zeros, subnormals, huge values and non-finite rows/columns), and compiled (traced triton ops) equal to eager."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from kernels import float8_cast as fc  # noqa: E402


def special(M, N, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, N, device="cuda", generator=g) * torch.logspace(-20, 20, N, device="cuda")
    x[1] = 0
    x[:, 2] = 0
    x[3, 5] = float("nan")
    x[4, 7] = float("-inf")
    x[6, 8] = 1e-40  # fp32 subnormal (0 in bf16)
    x[7, 9] = 3e38
    return x.to(dtype)


def bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype.itemsize == 1 else t


def assert_same(got, want):
    for a, b in zip(got, want):
        if a.is_floating_point() and a.dtype.itemsize == 4:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,N", [(8192, 4096), (8192, 1024), (4096, 2816), (1000, 16384), (48, 80)])
def test_triton_equals_reference(M, N, dtype):
    x = special(M, N, dtype)
    got = fc.to_float8_rowwise(x, backend="triton")
    want = fc.to_float8_rowwise_reference(x)
    assert_same(got, want)
    assert_same(fc.to_float8_colwise_transposed(x, got[2], backend="triton"),
                fc.to_float8_colwise_transposed_reference(x, want[2]))
    scale = fc.amax_to_scale(torch.tensor(1000.0, device="cuda"), fc.E4M3)
    assert torch.equal(bits(fc.to_float8_transposed(x, scale, backend="triton")),
                       bits(fc.to_float8_transposed(x, scale, backend="reference")))


def test_compiled_equals_eager():
    x = special(2048, 1024, torch.bfloat16, seed=1)

    def f(x):
        q, s, c = fc.to_float8_rowwise(x)
        qt, st = fc.to_float8_colwise_transposed(x, c)
        return q, s, c, qt, st, fc.to_float8_transposed(x, s[0])

    assert_same(torch.compile(f, fullgraph=True)(x), f(x))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_triton_casts_add_nothing_to_saved_for_backward(monkeypatch):
    """tests/cpu/test_float8_memory.py's compiled partitioner count with the Triton casts in the graph, against
    the same graph with every cast as plain torch ops (what the CPU runs): the Triton casts must not make the
    partitioner save more. (A Triton cast of the saved x in backward once made it save the bf16 input of every
    linear, +1.4 MB on this block: linear.SAVED.)"""
    import functools
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
    from test_float8_memory import compiled_saved
    import titan_fp8.float8.linear as lin

    with_triton = {m: compiled_saved(m, device="cuda") for m in ("ours", "ours_ag", "ours_rowwise")}
    for name in ("to_float8_rowwise", "to_float8_colwise_transposed", "to_float8_transposed",
                 "to_float8_with_transpose"):
        monkeypatch.setattr(lin, name, functools.partial(getattr(fc, name), backend="reference"))
    # rowwise: the forward's one-read cast also hands backward the fp32 column amax of x and w (4 bytes per
    # input feature, twice per linear: 6 linears of D inputs, one of H), which the plain ops recompute
    from test_float8_memory import D, H
    amax_bytes = {"ours": 0, "ours_ag": 0, "ours_rowwise": 4 * 2 * (6 * D + H)}
    for mode, (nbytes, f8) in with_triton.items():
        ref_bytes, ref_f8 = compiled_saved(mode, device="cuda")
        assert nbytes <= ref_bytes + amax_bytes[mode] and len(f8) <= len(ref_f8), (mode, nbytes, ref_bytes, f8,
                                                                                    ref_f8)


@pytest.mark.parametrize("f8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype,shape", [(torch.bfloat16, (4096, 1024)), (torch.float32, (3, 1000, 77)),
                                         (torch.bfloat16, (8, 5632, 4096))])
def test_tensorwise_cast_equals_reference(f8, dtype, shape):
    """The eager one-pass cast FSDP2's float8 all-gather runs on every tensorwise weight shard: bit for bit
    to_float8, hardware cast, with zeros, subnormals, huge and infinite values, scales from the amax and
    saturating / NaN ones."""
    x = special(shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1], dtype).reshape(shape)
    x = torch.where(x.isnan(), torch.zeros_like(x), x)  # a NaN element would make the amax scale NaN (below)
    amax = x.float().abs().nan_to_num(0, 0, 0).amax()
    for s in (fc.amax_to_scale(amax, f8), torch.tensor(1e6, device="cuda"), torch.tensor(float("nan"), device="cuda")):
        got = fc.to_float8_tensorwise(x, s, f8)
        want = fc.to_float8(x, s, f8)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (f8, dtype, shape, float(s))


@pytest.mark.parametrize("f8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tensorwise_many_equals_one_cast_each(f8, dtype):
    """One launch for a llama_moe block's tensorwise weight shards over 2 ranks (wq, wk, wv, wo, shared w1, w3, w2)
    plus odd sizes: each tensor bit for bit to_float8 with its own scale (from the amax, saturating, NaN), and a
    second call on the same storage (the cached launch table) sees the new values."""
    shapes = [(2048, 4096), (512, 4096), (512, 4096), (2048, 4096), (1408, 4096), (1408, 4096), (2048, 2816),
              (3, 1000, 77), (5,)]
    xs = [special(s[0] * (s[1] if len(s) == 3 else 1), s[-1], dtype, seed=i).reshape(s) if len(s) > 1
          else torch.randn(s, device="cuda", dtype=dtype) for i, s in enumerate(shapes)]
    xs = [torch.where(x.isnan(), torch.zeros_like(x), x) for x in xs]
    scales = torch.stack([fc.amax_to_scale(x.float().abs().nan_to_num(0, 0, 0).amax(), f8) for x in xs])
    scales[1], scales[2] = 1e6, float("nan")
    for _ in range(2):
        got = fc.to_float8_tensorwise_many(xs, scales, f8)
        for i, (t, x) in enumerate(zip(got, xs)):
            want = fc.to_float8(x, scales[i], f8)
            assert t.shape == x.shape and torch.equal(t.view(torch.uint8), want.view(torch.uint8)), (i, f8, dtype)
        for x in xs:
            x.mul_(-0.5)
