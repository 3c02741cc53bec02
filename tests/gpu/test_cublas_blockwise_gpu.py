"""titan_fp8::blockwise_scaled_mm's C++ kernel on a Hopper GPU: bit for bit the Python kernel (F.scaled_mm on the
same layouts) for every operand form the float8 Linears pass (mx128's factors in cuBLAS's layouts, the blockwise
recipe's scales; 128x128 and 1x128 b), eager and inside a compiled function, and the mx128 Linear on it against
the float64 product of its own quantized operands."""
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0) or not hasattr(F, "scaled_mm"),
    reason="needs a CUDA GPU with cuBLAS fp8 blockwise GEMMs (sm_90) and torch.nn.functional.scaled_mm")

from kernels.grouped_gemm import cublas_blockwise as cb  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cpp_kernel():
    assert cb.load_backend() == "cpp", "the C++ kernel did not build here (see the warning above)"


def _operands(M, K, N, b_is_tile, inverse, seed):
    """fp8 data with power-of-two factors spanning 2^-20..2^20 per block (a scale read from the wrong block is off by
    orders of magnitude), laid out as the Linears pass them."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kb = K // 128
    a_q = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b_q = torch.randn(N, K, device="cuda", generator=g).to(torch.float8_e4m3fn)

    def p2(*shape):
        return torch.exp2(torch.randint(-20, 21, shape, device="cuda", generator=g).float())
    a_s = p2(kb, M).t() if inverse else p2(M, kb)
    if b_is_tile:
        b_s = cb.pad_tile_factors(p2(N // 128, kb)) if inverse else p2(N // 128, kb)
    else:
        b_s = p2(kb, N).t() if inverse else p2(N, kb)
    return a_q, a_s, b_q, b_s


def _reference(a_q, a_s, b_q, b_s, b_is_tile, inverse):
    """float64 a @ b.T of the dequantized operands."""
    M, K = a_q.shape
    N = b_q.shape[0]
    fa = a_s if inverse else 1 / a_s
    fb = b_s[:, : K // 128] if (b_is_tile and inverse) else b_s
    fb = fb if inverse else 1 / fb
    a = a_q.double() * fa.double().repeat_interleave(128, 1)
    rows = fb.double().repeat_interleave(128, 0)[:N] if b_is_tile else fb.double()
    b = b_q.double() * rows.repeat_interleave(128, 1)
    return a @ b.t()


CASES = [(256, 384, 640), (1024, 2816, 1024), (8192, 4096, 2816), (384, 640, 256)]


@pytest.mark.parametrize("inverse", [True, False], ids=["factors", "our_scales"])
@pytest.mark.parametrize("b_is_tile", [True, False], ids=["128x128", "1x128"])
@pytest.mark.parametrize("M,K,N", CASES)
def test_cpp_kernel_equals_python_kernel(M, K, N, b_is_tile, inverse):
    ops = _operands(M, K, N, b_is_tile, inverse, seed=M + K + N)
    got = cb.blockwise_scaled_mm(*ops, b_is_tile, inverse)
    want = cb.cublas_blockwise_mm(*ops, b_is_tile, inverse)
    assert got.dtype == torch.bfloat16 and got.shape == (M, N)
    assert torch.equal(got, want)
    ref = _reference(*ops, b_is_tile, inverse)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < 3e-3, err  # bf16 output rounding (fp32 accumulation in cuBLAS)


def test_cpp_kernel_inside_a_compiled_function():
    ops = _operands(512, 1152, 768, True, True, seed=7)

    def f(a_q, a_s, b_q, b_s):
        return cb.blockwise_scaled_mm(a_q, a_s, b_q, b_s, True, True) * 2

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(*ops)
    assert torch.equal(got, cb.cublas_blockwise_mm(*ops, True, True) * 2)


def test_nonfinite_blocks_stay_nonfinite():
    a_q, a_s, b_q, b_s = _operands(256, 256, 256, True, True, seed=3)
    a_s[5, 1] = float("nan")   # row 5's second K-block: NaN factor (an MXFP8 NaN block)
    got = cb.blockwise_scaled_mm(a_q, a_s, b_q, b_s, True, True)
    assert torch.isnan(got[5]).all() and torch.isfinite(got[torch.arange(256, device="cuda") != 5]).all()
