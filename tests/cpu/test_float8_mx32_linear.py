"""The MXFP8 Linear with linear_granularity = "mx32" (recipe_name = "mxfp8"): 1x32 blocks on x and
grad_out, 128x128 weight tiles, grad-weight's operands along tokens (g^T 1x32, x^T 32 tokens x 128 features). Its
emulated twin against float64; its kernel path (kernels.grouped_gemm with one group; on CPU the interpreted Triton
kernels and quantizers) against the twin; the float8-all-gathered weight; config and conversion. GPU (Gluon):
tests/gpu/test_float8_mx32_linear_gpu.py.
"""
import pytest
import torch
import torch.nn as nn

from kernels.grouped_gemm.quant import to_mxfp8_blocked
from kernels.mxfp8 import from_mxfp8
from titan_fp8.float8 import Float8Config, Float8Linear, convert_to_float8_training
from titan_fp8.float8 import linear as f8linear

MX32 = dict(recipe_name="mxfp8", linear_granularity="mx32", emulate=True)
# the emulated GEMMs multiply the decoded operands in fp32; the reference in float64
TOL_EXACT = 1e-5
# against the UNquantized float64 product: e4m3 rounding (2^-4 relative at worst per element); norm-wise over many
# rows ~3.8% (400 seeds of this file's data at 33 and 97 tokens: max 4.6%). One token's row does not average: its
# few outputs can cancel, and its error reached 11.1% (p99 8.0%) over the same 400 seeds at 1 x 256 -> 128.
TOL_QUANT = 0.06
TOL_QUANT_ONE_ROW = 0.15


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def _data(rows, cols, gen, huge=True):
    """Random values whose 1x32 blocks span many decades, with an all-zero row, a block of fp32 subnormals and
    (huge) a block near 1e25 times the rest."""
    t = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    mag = torch.pow(10.0, torch.empty(rows, cols // 32, dtype=torch.float64).uniform_(-3, 3, generator=gen))
    t = t * mag.repeat_interleave(32, 1)
    if rows > 3:
        t[1] = 0
        if huge:
            t[2, :32] *= 1e25
        t[3, 32:64] = t[3, 32:64].sign() * 1e-40
    return t.float()


def _deq(t, dim, block, tile):  # MXFP8 of t shared over block (along dim) x tile, decoded in float64
    q, s = to_mxfp8_blocked(t, dim, block, tile)
    return from_mxfp8(q, s, dim, torch.float64)


def _deq_tokens(t, tile):  # t [M, C] along tokens in blocks of 32 from token 0, shared over `tile` features
    pad = (-t.shape[0]) % 32
    return _deq(torch.nn.functional.pad(t, (0, 0, 0, pad)).t().contiguous(), -1, 32, tile).t()[:t.shape[0]]


def _run(x, w, g, emulate=True):
    xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = f8linear._MXFP8MM.apply(xq, wq, emulate)
    y.backward(g)
    return y, xq.grad, wq.grad


# ------------------------------------------------------------------------------------------ config
def test_config_default_and_dims():
    c = Float8Config(**MX32)
    assert c.linear_granularity == "mx32" and c.linear_dim_multiple == 128 and not c.mx128_linear
    c = Float8Config(recipe_name="mxfp8")  # the default: 32x32 weight tiles
    assert c.linear_granularity == "mx32_tile32" and c.linear_dim_multiple == 32


def test_dims_not_multiples_of_128_are_a_startup_error_naming_the_layer():
    def model():
        return nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 160, bias=False),
                             nn.Linear(256, 100, bias=False))  # 100: not even mxfp8-eligible (skipped)
    with pytest.raises(ValueError, match=r"^linear_granularity: 1 \[in_features=256, out_features=160\] .*'mx32'.*"
                                         r"multiples of 128.*'mx32_tile32'") as e:
        convert_to_float8_training(model(), Float8Config(**MX32))
    assert "\n" not in str(e.value)
    m = convert_to_float8_training(model(), Float8Config(**MX32, filter_fqns=["1"]))
    assert [type(c) for c in m] == [Float8Linear, nn.Linear, nn.Linear]
    m = convert_to_float8_training(model(), Float8Config(recipe_name="mxfp8", emulate=True))  # default mx32_tile32
    assert [type(c) for c in m] == [Float8Linear, Float8Linear, nn.Linear]


def test_all_gather_needs_128_rows_per_shard():
    from titan_fp8.float8 import check_float8_all_gather
    cfg = Float8Config(**MX32, enable_fsdp_float8_all_gather=True)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(128, 256, bias=False)), cfg)
    check_float8_all_gather(m, 2)
    with pytest.raises(ValueError, match=r"enable_fsdp_float8_all_gather: .*0 \[out_features=256\] \(mx32\)"):
        check_float8_all_gather(m, 4)


# ------------------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("M,K,N", [(256, 384, 640), (97, 128, 256), (33, 1152, 384), (1, 256, 128)])
def test_numerics_against_float64(M, K, N):
    """Every operand quantized here independently with kernels.grouped_gemm.quant's rule and multiplied in
    float64: x and g 1x32 along the contracted dim, w 128x128 tiles (both GEMMs), grad-weight's g^T 1x32 and x^T
    32 x 128 along tokens. Token counts that are not multiples of 32 (97, 33, 1) work: the token-major copies get
    zero tokens appended."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    x = _data(M, K, gen)
    w = _data(N, K, gen, huge=False) * 1e-2
    g = _data(M, N, gen, huge=False) * 1e-3
    y, gx, gw = _run(x, w, g)
    wd = _deq(w, -1, 128, 128)
    refs = (("y", y, _deq(x, -1, 32, 1) @ wd.t()),
            ("grad_x", gx, _deq(g, -1, 32, 1) @ wd),
            ("grad_w", gw, _deq_tokens(g, 1).t() @ _deq_tokens(x, 128)))
    for what, got, ref in refs:
        assert got.dtype == torch.float32 and torch.isfinite(got).all(), what
        assert rel(got, ref) < TOL_EXACT, (what, rel(got, ref), seed)
    if M > 3:
        assert (y[1] == 0).all() and (gx[1] == 0).all()
    # without the huge outlier: close to the unquantized product
    x = _data(M, K, gen, huge=False)
    y, gx, gw = _run(x, w, g)
    xd, wd, gd = x.double(), w.double(), g.double()
    tol = TOL_QUANT if M >= 32 else TOL_QUANT_ONE_ROW
    for what, got, ref in (("y", y, xd @ wd.t()), ("grad_x", gx, gd @ wd), ("grad_w", gw, gd.t() @ xd)):
        assert rel(got, ref) < tol, (what, rel(got, ref), seed)


def test_nan_and_inf_propagate():
    gen = torch.Generator().manual_seed(5)
    M, K, N = 256, 256, 256
    x, w, g = _data(M, K, gen), _data(N, K, gen, huge=False) * 1e-2, _data(M, N, gen, huge=False) * 1e-3
    x[10, 5] = float("nan")      # its 1x32 block: y[10, :] NaN; x^T tile (tokens 0..31, features 0..127)
    x[200, 130] = float("inf")   # y[200, :] NaN (an inf block is NaN, never saturated); x^T tile (192..223, 128..)
    g[20, 3] = float("nan")      # grad_x[20, :]; g^T block (n = 3, tokens 0..31): grad_w[3, :]
    y, gx, gw = _run(x, w, g)
    assert y[10].isnan().all() and y[200].isnan().all()
    assert torch.isfinite(y[[i for i in range(M) if i not in (10, 200)]]).all()
    assert gx[20].isnan().all() and torch.isfinite(gx[[i for i in range(M) if i != 20]]).all()
    assert gw[:, :256].isnan().all()  # x^T's NaN tiles cover features 0..255 (and g's NaN block row 3)
    w2 = w.clone()
    w2[1, 1] = float("nan")      # tile (0, 0): y[:, :128] NaN, y[:, 128:] not
    y2, _, _ = _run(torch.randn(M, K), w2, g)
    assert y2[:, :128].isnan().all() and torch.isfinite(y2[:, 128:]).all()


def test_module_eval_and_training_take_any_token_count():
    torch.manual_seed(0)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(256, 128, bias=True)), Float8Config(**MX32))
    x = torch.randn(3, 7, 256)
    with torch.no_grad():
        y = m(x)
    ref = x.double() @ m[0].weight.double().t() + m[0].bias.double()
    assert y.shape == (3, 7, 128) and rel(y, ref) < TOL_QUANT
    xr = x.clone().requires_grad_()
    m(xr).square().sum().backward()  # 21 tokens train too
    assert xr.grad.shape == x.shape and m[0].weight.grad.shape == (128, 256)
    assert torch.isfinite(xr.grad).all() and torch.isfinite(m[0].weight.grad).all()


# ------------------------------------------------------------------------------------------ kernel path
@pytest.fixture
def kernel_path(monkeypatch):
    """The GPU path on CPU for emulate=False: the one-read Triton quantizers and kernels.grouped_gemm's Triton
    kernels (backend "auto" picks them off sm_90), all under TRITON_INTERPRET=1; emulate=True keeps the twin's
    plain PyTorch quantizers and fp32 GEMMs. Returns the list of kernel launches."""
    from kernels.mxfp8.triton import _INTERPRET
    if not _INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    import kernels.grouped_gemm as gg
    monkeypatch.setattr(f8linear, "_uses_triton_quantizers", lambda t, emulate: not emulate)
    monkeypatch.setattr(f8linear, "_mx32_gemms_on_kernels", lambda t, emulate: not emulate)
    launches = []
    for name in ("_launch_nt", "_launch_wgrad"):
        def spy(*args, _real=getattr(gg, name), _name=name, **kwargs):
            launches.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(gg, name, spy)
    return launches


@pytest.mark.parametrize("M", [64, 33])
def test_kernel_path_equals_emulated_twin(kernel_path, M):
    """Same operands (the Triton quantizers are bit-identical to the plain PyTorch rule), the kernels' fp32
    sums against the twin's fp32 matmul: equal up to summation order; fp32 output and gradients."""
    gen = torch.Generator().manual_seed(3)
    K, N = 256, 128
    x, w, g = _data(M, K, gen), _data(N, K, gen, huge=False) * 1e-2, _data(M, N, gen, huge=False) * 1e-3
    got = _run(x, w, g, emulate=False)
    assert kernel_path == ["_launch_nt", "_launch_nt", "_launch_wgrad"]  # fprop, dgrad, wgrad on the kernels
    twin = _run(x, w, g, emulate=True)
    assert len(kernel_path) == 3
    for what, a, b in zip(("y", "grad_x", "grad_w"), got, twin):
        assert a.dtype == b.dtype == torch.float32 and torch.isfinite(a).all(), what
        assert rel(a, b) < TOL_EXACT, (what, rel(a, b))


def test_kernel_path_takes_fp16(kernel_path):
    """An fp16 model: the kernels write fp32 (their tested outputs) and the Linear casts once to fp16."""
    gen = torch.Generator().manual_seed(8)
    x, w = (_data(64, 256, gen, huge=False) * 1e-2).half(), (_data(128, 256, gen, huge=False) * 1e-2).half()
    g = (_data(64, 128, gen, huge=False) * 1e-3).half()
    got = _run(x, w, g, emulate=False)
    assert len(kernel_path) == 3
    twin = _run(x, w, g, emulate=True)
    for what, a, b in zip(("y", "grad_x", "grad_w"), got, twin):
        assert a.dtype == b.dtype == torch.float16 and torch.isfinite(a).all(), what
        assert rel(a, b) < 1e-3, (what, rel(a, b))  # fp16 rounding of the same fp32 sums


# ------------------------------------------------------------------------------------------ gathered weights
def _edge_weight(N, K, gen):
    """128x128 tiles spanning decades, an all-zero tile, a tile of fp32 subnormals, a huge tile, NaN and inf tiles
    (both in the first 128 input features)."""
    w = _data(N, K, gen, huge=False) * 1e-2
    w[128:256, 128:256] = 0
    w[:128, 256:384] = torch.randn(128, 128, generator=gen) * 1e-40
    w[128:256, 256:384] *= 1e30
    w[:128, 5] = float("nan")
    w[256:384, 7] = float("inf")
    return w


def _same_bits(a, b):
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(torch.where(nan, 0, a), torch.where(nan, 0, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathered_weight_is_read_not_requantized_and_equals_quantize_after_gather(monkeypatch, dtype):
    """The float8 all-gather's weight (one rank's pre- and post-all-gather hooks) reaches the GEMMs as its bytes
    and 128x128 tile bytes (grad-input: transposed): no weight quantization, and output and both gradients
    bit-equal to the plain weight's."""
    from kernels.grouped_gemm import quant
    from titan_fp8.float8.gathered import Float8GatheredWeight
    from titan_fp8.float8.weights import gather_on_one_rank
    calls = []
    real = quant.to_mxfp8_blocked

    def counting(t, dim=-1, block=32, tile=1):
        calls.append((block, tile))
        return real(t, dim, block, tile)
    monkeypatch.setattr(quant, "to_mxfp8_blocked", counting)
    gen = torch.Generator().manual_seed(11)
    cfg = Float8Config(**MX32, enable_fsdp_float8_all_gather=True)
    M, K, N = 96, 384, 384
    w = _edge_weight(N, K, gen).to(dtype)
    x, g = _data(M, K, gen, huge=False).to(dtype), (_data(M, N, gen, huge=False) * 1e-3).to(dtype)
    gathered = gather_on_one_rank(w, cfg)
    assert type(gathered) is Float8GatheredWeight and gathered._scale.shape == (N // 128, K // 128)
    calls.clear()
    got = f8linear.float8_linear(xg := x.clone().requires_grad_(), wg := nn.Parameter(gathered), cfg)
    del wg
    got.backward(g)
    assert (128, 128) not in calls, calls  # x / g / x^T / g^T only
    xp, wp = x.clone().requires_grad_(), nn.Parameter(w.clone())
    ref = f8linear.float8_linear(xp, wp, cfg)
    ref.backward(g)
    assert calls.count((128, 128)) == 2  # the plain weight: w in forward, w^T in backward
    assert _same_bits(got, ref) and _same_bits(xg.grad, xp.grad)
    y = got
    assert y[:, :128].isnan().all() and y[:, 256:].isnan().all() and torch.isfinite(y[:, 128:256]).all()
    assert xg.grad[:, :128].isnan().all() and torch.isfinite(xg.grad[:, 128:]).all()


def test_gathered_operands_are_the_quantizers_operands_bit_for_bit():
    """What _mx32_weight reads from a gathered weight (forward: w [N, K] with scale [N, K/32]; grad-input: w^T
    [K, N] with scale [K, N/32]) is byte for byte what it quantizes for the full weight."""
    from titan_fp8.float8.weights import gather_on_one_rank
    gen = torch.Generator().manual_seed(12)
    w = _edge_weight(384, 640, gen)
    w[300, 600] = 3.3e38
    gathered = gather_on_one_rank(w, Float8Config(**MX32, enable_fsdp_float8_all_gather=True))
    g = torch.zeros(1, 1)
    for got, ref in ((f8linear._mx32_weight(gathered, True), f8linear._mx32_weight(w, True)),
                     (f8linear._mx32_weight(gathered, True, g), f8linear._mx32_weight(w, True, g))):
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous() and b.is_contiguous()
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
