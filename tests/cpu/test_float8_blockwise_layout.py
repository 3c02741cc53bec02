"""The blockwise recipe's cuBLAS path, checked on CPU; also mxfp8 with linear_granularity="mx128", which runs the same
autograd function with power-of-two scales that its quantizers write straight into cuBLAS's layouts (pow2=True).

On the GPU the blockwise GEMMs go through torch.nn.functional.scaled_mm (BlockWise1x128 x BlockWise128x128 for
the forward and grad-input GEMMs, BlockWise1x128 x BlockWise1x128 for the weight gradient). Here the autograd
function is forced onto that path with F.scaled_mm replaced by a recorder that
  (a) runs a transcription of the argument checks of torch 2.11, the GPU image (aten/src/ATen/native/cuda/
      ScaledBlas.cpp: _scaled_mm_cuda_v2, check_deepseek_recipe, _scaled_block1x128_block128x128,
      _scaled_block1x128_block1x128). The messages are the C++ ones, so a failure reads like the GPU log;
  (b) runs this torch's own meta kernel for _scaled_mm_v2 (torch/_meta_registrations.py) on the same sizes
      and strides;
  (c) with real data, multiplies the operands reading every scale where cuBLAS reads it (the layout the checks
      pin down), so the whole forward/backward must reproduce the emulate path.
(a) and (b) run at the model's real shapes on the meta device (no memory, no FLOPs); (c) at small shapes whose
block counts are not multiples of 4 (the padded 128x128 scale layout).
"""
import pytest
import torch
import torch.nn.functional as F

from kernels.grouped_gemm import cublas_blockwise
from titan_fp8.float8 import linear as f8linear

ScalingType = getattr(F, "ScalingType", None)
pytestmark = pytest.mark.skipif(ScalingType is None or not hasattr(F, "scaled_mm"),
                                reason="torch.nn.functional.scaled_mm / ScalingType not in this torch")

BLOCK = 128


def ceil_div(a, b):
    return -(-a // b)


def round_up(a, b):
    return ceil_div(a, b) * b


def _is_row_major(t):
    return t.stride(0) > t.stride(1) and t.stride(1) == 1


def _is_col_major(t):
    return t.stride(0) == 1 and t.stride(1) > 1


def check_like_torch_2_11(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b):
    """torch 2.11 CUDA argument checks for the DeepSeek (1x128 / 128x128) recipes, in their order and with
    their messages (ValueError = TORCH_CHECK_VALUE)."""
    scale_a, scale_b = list(scale_a), list(scale_b)
    recipe_a = recipe_a if isinstance(recipe_a, list) else [recipe_a]
    recipe_b = recipe_b if isinstance(recipe_b, list) else [recipe_b]
    if mat_a.dim() != 2 or mat_b.dim() != 2 or mat_a.shape[1] != mat_b.shape[0]:
        raise ValueError(f"mat_a and mat_b shapes cannot be multiplied ({list(mat_a.shape)} and "
                         f"{list(mat_b.shape)})")
    M, K = mat_a.shape
    N = mat_b.shape[1]
    if M == 0 or K == 0 or N == 0:
        return  # _scaled_mm_cuda_v2 returns early
    if K % 16:
        raise ValueError(f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: "
                         f"({M}x{K}).")
    if K % 16 or N % 16:
        raise ValueError(f"mat2 shape ({K}x{N}) must be divisible by 16")
    # the cuBLASLt fp8 kernels take A row-major and B column-major ("TN"; what _scaled_mm's checks demand)
    if not _is_row_major(mat_a):
        raise ValueError(f"self must be row_major, got stride {mat_a.stride()}")
    if not _is_col_major(mat_b):
        raise ValueError(f"mat2 must be col_major, got stride {mat_b.stride()}")
    # scaled_blas::check_deepseek_recipe: e4m3fn data, one fp32 scale per operand
    if not (mat_a.dtype == mat_b.dtype == torch.float8_e4m3fn and len(scale_a) == len(scale_b) == 1
            and len(recipe_a) == len(recipe_b) == 1 and scale_a[0].dtype == scale_b[0].dtype == torch.float32
            and recipe_a[0] == ScalingType.BlockWise1x128
            and recipe_b[0] in (ScalingType.BlockWise1x128, ScalingType.BlockWise128x128)):
        raise ValueError("Invalid scaling configuration.")
    sa, sb = scale_a[0], scale_b[0]
    kb = ceil_div(K, BLOCK)
    # scale_a (same in both recipes): [M, ceil(K/128)], strides (1, M)
    if not (sa.dim() == 2 and sa.shape[0] == M and sa.shape[1] == kb):
        raise ValueError(f"scale_a must have shape {M} x {kb} Float elements, got {list(sa.shape)}")
    # (the 1x128 x 1x128 check of some versions tests scale_b.stride(1) in the size-1 exception: demand both)
    size1_ok = sa.shape[1] == 1 and sa.stride(1) == 1 and (recipe_b[0] == ScalingType.BlockWise128x128
                                                            or sb.stride(1) == 1)
    if not (sa.stride(0) == 1 and (sa.stride(1) == M or size1_ok)):
        raise ValueError(f"scale_a must have strides (1, {M}); got {list(sa.stride())}")
    if recipe_b[0] == ScalingType.BlockWise128x128:
        # _scaled_block1x128_block128x128: [round_up(ceil(K/128), 4), ceil(N/128)], strides (1, L4)
        L4 = round_up(kb, 4)
        if not (sb.dim() == 2 and sb.shape[0] == L4 and sb.shape[1] == ceil_div(N, BLOCK)):
            raise ValueError(f"scale_b must have shape {L4} x {ceil_div(N, BLOCK)} Float elements, got "
                             f"{list(sb.shape)}")
        if not (sb.stride(0) == 1 and (sb.stride(1) == L4 or (sb.shape[1] == 1 and sb.stride(1) == 1))):
            raise ValueError(f"scale_b must have strides (1, {L4}); got {list(sb.stride())}")
    else:
        # _scaled_block1x128_block1x128: [N, ceil(K/128)], strides (1, N)
        if not (sb.dim() == 2 and sb.shape[0] == N and sb.shape[1] == kb):
            raise ValueError(f"scale_b must have shape {N} x {kb} Float elements, got {list(sb.shape)}")
        if not (sb.stride(0) == 1 and (sb.stride(1) == N or (sb.shape[1] == 1 and sb.stride(1) == 1))):
            raise ValueError(f"scale_b strides must be (1, {N}); got: {list(sb.stride())}")


def cublas_blockwise_reference(mat_a, mat_b, sa, recipe_b, sb, out_dtype):
    """What cuBLAS computes from these arguments: out[m, n] = sum_k a[m,k] sa[m,k/128] b[k,n] sb(k, n), with
    sb(k, n) = sb[n, k/128] (1x128) or sb[k/128, n/128] (128x128; rows past ceil(K/128) are padding, never
    read). The checks above fixed the strides, so logical indices are the memory cuBLAS reads."""
    K, N = mat_b.shape
    kblk = torch.arange(K) // BLOCK
    a = mat_a.double() * sa.double()[:, kblk]
    if recipe_b == ScalingType.BlockWise1x128:
        b = mat_b.double() * sb.double()[:, kblk].t()
    else:
        b = mat_b.double() * sb.double()[kblk][:, torch.arange(N) // BLOCK]
    return (a @ b).to(out_dtype)


class ScaledMMRecorder:
    """Stands in for F.scaled_mm: checks the arguments as torch 2.11's CUDA kernel and this torch's meta
    kernel do, records them, and returns cuBLAS's result (or an empty meta tensor)."""

    def __init__(self, real_scaled_mm):
        self.real = real_scaled_mm
        self.calls = []

    def __call__(self, mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a=None,
                 swizzle_b=None, bias=None, output_dtype=torch.bfloat16, contraction_dim=(),
                 use_fast_accum=False):
        assert bias is None and not contraction_dim and swizzle_a is None and swizzle_b is None
        check_like_torch_2_11(mat_a, mat_b, scale_a if isinstance(scale_a, list) else [scale_a],
                              scale_recipe_a, scale_b if isinstance(scale_b, list) else [scale_b],
                              scale_recipe_b)
        self._check_with_meta_kernel(mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b,
                                     output_dtype)
        self.calls.append(dict(M=mat_a.shape[0], K=mat_a.shape[1], N=mat_b.shape[1], recipe_a=scale_recipe_a,
                               recipe_b=scale_recipe_b, scale_a=(tuple(scale_a.shape), scale_a.stride()),
                               scale_b=(tuple(scale_b.shape), scale_b.stride()), out_dtype=output_dtype))
        if mat_a.is_meta:
            return torch.empty(mat_a.shape[0], mat_b.shape[1], dtype=output_dtype, device="meta")
        return cublas_blockwise_reference(mat_a, mat_b, scale_a, scale_recipe_b, scale_b, output_dtype)

    def _check_with_meta_kernel(self, mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, out_dtype):
        def meta(t):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        try:
            out = self.real(meta(mat_a), meta(mat_b), meta(scale_a), recipe_a, meta(scale_b), recipe_b,
                            output_dtype=out_dtype)
        except NotImplementedError:  # no meta kernel in this torch: the 2.11 transcription still ran
            return
        assert tuple(out.shape) == (mat_a.shape[0], mat_b.shape[1])


@pytest.fixture
def recorder(monkeypatch):
    rec = ScaledMMRecorder(F.scaled_mm)
    monkeypatch.setattr(F, "scaled_mm", rec)
    monkeypatch.setattr(f8linear, "_blockwise_uses_scaled_mm", lambda t, emulate: not emulate)
    return rec


# (name, tokens M, in_features K, out_features N): the shapes the H200 run failed on
MODEL_SHAPES = [
    ("attn_wk_wv", 8192, 4096, 1024),
    ("shared_w1_w3", 8192, 4096, 2816),   # 2816 = 22 x 128: grad-input K-blocks padded 22 -> 24
    ("shared_w2", 8192, 2816, 4096),      # forward K-blocks padded 22 -> 24
    ("torchao_doc", 1024, 2048, 1024),
    ("large", 4096, 8192, 16384),
    ("one_block_each", 128, 128, 128),    # every scale dim is 1: the stride-1 exceptions
    ("three_k_blocks", 256, 384, 640),
]


# (pow2, xt_tile): the blockwise recipe; mx128; mx128 with grad-weight's x^T in 128x128 tiles
MODES = [(False, False), (True, False), (True, True)]
MODE_IDS = ["blockwise", "mx128", "mx128_xt_tiles"]


@pytest.mark.parametrize("pow2,xt_tile", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name,M,K,N", MODEL_SHAPES, ids=[s[0] for s in MODEL_SHAPES])
def test_scaled_mm_arguments_pass_the_gpu_checks(recorder, monkeypatch, name, M, K, N, pow2, xt_tile):
    """Forward, grad-input and grad-weight GEMM arguments at the real shapes (meta device: no data)."""
    # on meta tensors the custom op would answer from its fake kernel: call its body instead
    monkeypatch.setattr(cublas_blockwise, "blockwise_scaled_mm", cublas_blockwise.cublas_blockwise_mm)
    x = torch.empty(2, M // 2, K, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(N, K, device="meta", dtype=torch.bfloat16, requires_grad=True)
    y = f8linear._BlockwiseMM.apply(x, w, False, pow2, True, xt_tile)
    assert y.shape == (2, M // 2, N)
    y.backward(torch.empty_like(y))
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and w.grad.dtype == w.dtype
    tile, vec = ScalingType.BlockWise128x128, ScalingType.BlockWise1x128
    got = [(c["M"], c["K"], c["N"], c["recipe_a"], c["recipe_b"]) for c in recorder.calls]
    assert got == [(M, K, N, vec, tile),    # forward      y  = x @ w.T
                   (M, N, K, vec, tile),    # grad-input   dx = g @ w
                   (N, M, K, vec, tile if xt_tile else vec)]     # grad-weight  dw = g.T @ x


def _blocky(rows, cols, gen, tile_rows):
    """Random data whose blocks (1x128, or 128x128 when tile_rows) span 6 decades of magnitude: a scale
    read from the wrong block, or a padding slot read as data, is off by orders of magnitude."""
    t = torch.randn(rows, cols, generator=gen)
    mag = torch.pow(10.0, torch.empty(ceil_div(rows, tile_rows), cols // BLOCK).uniform_(-3, 3, generator=gen))
    return t * mag.repeat_interleave(tile_rows, 0)[:rows].repeat_interleave(BLOCK, 1)


def sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return (20 * torch.log10(ref.norm() / (ref - got).norm())).item()


@pytest.mark.parametrize("pow2,xt_tile", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("M,K,N", [(256, 384, 640), (384, 640, 256), (128, 1152, 384)])
def test_scaled_mm_path_reproduces_emulation(recorder, M, K, N, pow2, xt_tile):
    """Real data: the cuBLAS-path arguments, read where cuBLAS reads them, give the emulate path's forward and
    both gradients (only the bf16 rounding of cuBLAS's output differs)."""
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = _blocky(M, K, gen, 1)
    w = _blocky(N, K, gen, BLOCK) * 0.02
    g = _blocky(M, N, gen, 1) * 1e-3

    def fwd_bwd(emulate):
        xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = f8linear._BlockwiseMM.apply(xq, wq, emulate, pow2, True, xt_tile)
        y.backward(g)
        return y, xq.grad, wq.grad

    hw = fwd_bwd(False)
    assert len(recorder.calls) == 3
    em = fwd_bwd(True)
    assert len(recorder.calls) == 3  # the emulate path never calls scaled_mm
    for what, a, b in zip(("output", "grad_input", "grad_weight"), hw, em):
        assert torch.isfinite(a).all(), what
        # bf16 output rounding alone: ~59 dB; a misplaced scale: far below 0 dB with these magnitudes
        assert sqnr(b, a) >= 50.0, f"{what}: cuBLAS-path arguments vs emulation {sqnr(b, a):.1f} dB"


@pytest.mark.parametrize("pow2,xt_tile", MODES, ids=MODE_IDS)
def test_scaled_mm_path_under_torch_compile(recorder, pow2, xt_tile):
    """Under torch.compile (dynamo + AOT autograd; aot_eager, as inductor's CPU codegen is not what is tested
    here) the cuBLAS path traces in one graph through the op's fake kernel, and at run time passes the same
    checked arguments and gives eager's result. (The op is opaque to inductor on the GPU, so inductor cannot
    re-stride the scales either.)"""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = _blocky(256, 384, gen, 1)
    w = _blocky(640, 384, gen, BLOCK) * 0.02

    def fwd(x, w):
        return f8linear._BlockwiseMM.apply(x, w, False, pow2, True, xt_tile)

    def step(f):
        xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = f(xq, wq)
        y.square().sum().backward()  # the compiled backward graph runs here
        return y, xq.grad, wq.grad

    eager = step(fwd)
    n_eager = len(recorder.calls)
    compiled = step(torch.compile(fwd, backend="aot_eager", fullgraph=True))
    assert n_eager == 3 and len(recorder.calls) == 6
    for what, a, b in zip(("output", "grad_input", "grad_weight"), eager, compiled):
        assert sqnr(a, b) >= 50.0, f"{what}: compiled vs eager {sqnr(a, b):.1f} dB"


def test_mx128_scales_reach_cublas_without_a_copy(recorder, monkeypatch):
    """mx128's quantizers write the scale factors in exactly the layouts the checks demand, so the op passes
    them through as they are: no reciprocal, no transposing or padding copy inside the opaque op."""
    seen = []
    real_args = cublas_blockwise.blockwise_scaled_mm_args

    def spy(a_q, a_s, b_q, b_s, b_is_tile, inverse=False):
        out = real_args(a_q, a_s, b_q, b_s, b_is_tile, inverse)
        seen.append((out[2].data_ptr() == a_s.data_ptr(), out[4].data_ptr() == b_s.data_ptr(), inverse))
        return out
    monkeypatch.setattr(cublas_blockwise, "blockwise_scaled_mm_args", spy)
    gen = torch.Generator().manual_seed(2)
    x = _blocky(256, 384, gen, 1).requires_grad_()
    w = (_blocky(640, 384, gen, BLOCK) * 0.02).requires_grad_()
    for xt_tile in (False, True):
        seen.clear()
        f8linear._BlockwiseMM.apply(x, w, False, True, True, xt_tile).sum().backward()
        assert seen == [(True, True, True)] * 3


@pytest.mark.parametrize("M,K,N", [(256, 384, 640), (128, 1152, 384)])
def test_mx128_gathered_weight_on_the_cublas_path_equals_the_plain_weight(recorder, monkeypatch, M, K, N):
    """A float8-all-gathered mx128 weight (Float8GatheredWeight) on the cuBLAS path: the same checked arguments
    (shapes, strides, values: output and gradients bit-equal to the plain weight's, which quantizes itself), its
    tile factors passed to cuBLAS without a copy, and no quantization of the weight."""
    from titan_fp8.float8 import Float8Config
    from titan_fp8.float8.weights import gather_on_one_rank
    gen = torch.Generator().manual_seed(3)
    x = _blocky(M, K, gen, 1)
    w = _blocky(N, K, gen, BLOCK) * 0.02
    g = _blocky(M, N, gen, 1) * 1e-3
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity="mx128", emulate=True,
                       enable_fsdp_float8_all_gather=True)

    def fwd_bwd(weight):
        xq, wq = x.clone().requires_grad_(), torch.nn.Parameter(weight)
        y = f8linear._BlockwiseMM.apply(xq, wq, False, True, True, f8linear.MX128_WGRAD_X_TILES)
        y.backward(g)
        return y, xq.grad, wq.grad

    plain = fwd_bwd(w.clone())
    plain_calls = list(recorder.calls)
    seen = []
    real_args = cublas_blockwise.blockwise_scaled_mm_args

    def spy(a_q, a_s, b_q, b_s, b_is_tile, inverse=False):
        out = real_args(a_q, a_s, b_q, b_s, b_is_tile, inverse)
        seen.append(out[4].data_ptr() == b_s.data_ptr())
        return out
    monkeypatch.setattr(cublas_blockwise, "blockwise_scaled_mm_args", spy)
    q128 = f8linear._quantize_mx128
    monkeypatch.setattr(f8linear, "_quantize_mx128", lambda t, tile, *a, **k: (
        pytest.fail("the Linear quantized a gathered weight") if tile else q128(t, tile, *a, **k)))
    recorder.calls.clear()
    gathered = fwd_bwd(gather_on_one_rank(w, cfg))
    assert recorder.calls == plain_calls and seen == [True] * 3
    for what, a, b in zip(("output", "grad_input", "grad_weight"), gathered, plain):
        assert torch.isfinite(a).all() and torch.equal(a, b), what
