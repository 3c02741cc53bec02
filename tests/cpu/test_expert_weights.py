"""Contract 1 (titan_fp8/float8/expert_weights.py): the float8 operands of 3-D expert weights, bit for bit
against the project's existing quantizers, and cached once per optimizer step."""
import pytest
import torch

from kernels.float8_cast.reference import to_float8_rowwise_reference
from kernels.grouped_gemm.quant import to_mxfp8_blocked
from titan_fp8.float8.expert_weights import (
    expert_weight_operands,
    group_grid,
    local_group_amax,
    quantize_expert_weight,
    quantize_part,
)

U8 = torch.uint8


def weight(E, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(E, N, K, generator=g) * torch.logspace(-3, 3, E).view(E, 1, 1)
    w[0, :3, :5] = 0.0
    w[0, 3, 3] = 1e-40  # fp32 subnormal
    w[-1, 7, 2] = 3e4   # huge
    if E > 2:
        w[1] = 0.0      # an all-zero expert
    return w


def same(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(U8), b.contiguous().view(U8))


@pytest.mark.parametrize("gran", ["mx128", "mx32"])
@pytest.mark.parametrize("shape", [(3, 256, 128), (2, 160, 96), (1, 32, 32)])
def test_mxfp8_square_tiles_equal_blocked_quantizer_both_ways(gran, shape):
    w = weight(*shape)
    w[-1, 0, 0] = float("nan")  # one non-finite tile: NaN scale and bytes, others untouched
    w[-1, -1, -1] = float("inf")
    ops = quantize_expert_weight(w, "mxfp8", gran)
    d, s = to_mxfp8_blocked(w, -1, 128, 128)
    assert same(ops.fwd_data, d) and torch.equal(ops.fwd_scale, s)
    dt, st = to_mxfp8_blocked(w.transpose(1, 2), -1, 128, 128)
    assert same(ops.bwd_data, dt) and ops.bwd_data.is_contiguous()
    assert torch.equal(ops.bwd_scale, st.transpose(1, 2)) and ops.bwd_scale.shape == (shape[0], shape[1] // 32, shape[2])
    assert (ops.fwd_scale == 255).any()


def test_mxfp8_plain_two_copies():
    w = weight(2, 64, 96)
    ops = quantize_expert_weight(w, "mxfp8", "mx32_plain")
    d, s = to_mxfp8_blocked(w, -1, 32, 1)
    dt, st = to_mxfp8_blocked(w.transpose(1, 2), -1, 32, 1)
    assert same(ops.fwd_data, d) and torch.equal(ops.fwd_scale, s)
    assert same(ops.bwd_data, dt) and torch.equal(ops.bwd_scale, st.transpose(1, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_rowwise_one_scale_per_expert_is_the_rowwise_rule(dtype):
    w = weight(4, 48, 32).to(dtype)
    ops = quantize_expert_weight(w, "fp8_rowwise", None)
    # the rowwise Linear's cast of each expert flattened to one row: same bytes, same power-of-two scale
    rd, rs, _ = to_float8_rowwise_reference(w.reshape(4, -1))
    assert same(ops.fwd_data.reshape(4, -1), rd)
    assert torch.equal(ops.fwd_scale, rs.expand(4, 48)) and ops.fwd_scale.dtype == torch.float32
    assert torch.equal(ops.bwd_scale, rs.expand(4, 32))
    assert same(ops.bwd_data, ops.fwd_data.transpose(1, 2)) and ops.bwd_data.is_contiguous()
    # decode error against float64: e4m3 relative precision 2^-4 (subnormals / zeros absolute)
    deq = ops.fwd_data.double() / ops.fwd_scale.double().unsqueeze(-1)
    ref = w.double()
    assert torch.all((deq - ref).abs() <= ref.abs() * 2**-4 + 2**-9 / ops.fwd_scale.double().unsqueeze(-1))


def test_nonfinite_expert_is_nan_not_silently_finite():
    w = weight(3, 32, 32)
    w[2, 1, 1] = float("nan")
    ops = quantize_expert_weight(w, "fp8_rowwise", None)
    assert torch.isnan(ops.fwd_scale[2]).all() and torch.isfinite(ops.fwd_scale[:2]).all()


@pytest.mark.parametrize("recipe", ["fp8_rowwise", "mxfp8"])
def test_parts_with_global_amax_equal_whole_quantization(recipe):
    """What FSDP2 shards see: any split (experts, or rows through the middle of tiles) quantized with the
    global groups' amax (the MAX of the parts' local amax) gives the whole tensor's bytes."""
    E, N, K = 3, 192, 128
    w = weight(E, N, K)
    whole = quantize_expert_weight(w, recipe, None if recipe == "fp8_rowwise" else "mx128").fwd_data
    for dim, cuts in ((0, [0, 1, 3]), (0, [0, 0, 3]), (1, [0, 96, 192]), (1, [0, 64, 160, 192])):
        parts = [(w.narrow(dim, a, b - a), tuple(a if d == dim else 0 for d in range(3)))
                 for a, b in zip(cuts[:-1], cuts[1:])]
        amax = torch.stack([local_group_amax(p, o, w.shape, recipe) for p, o in parts]).amax(0)
        assert amax.shape == group_grid(w.shape, recipe)
        got = torch.cat([quantize_part(p, o, w.shape, amax, recipe) for p, o in parts], dim)
        assert same(got, whole), (dim, cuts)


def test_cached_once_per_optimizer_step_and_on_in_place_change():
    w = torch.nn.Parameter(weight(2, 64, 64))
    a = expert_weight_operands(w, "mxfp8", "mx128")
    assert expert_weight_operands(w, "mxfp8", "mx128") is a
    opt = torch.optim.SGD([w], lr=0.1)
    w.grad = torch.ones_like(w)
    opt.step()  # bumps the optimizer generation
    b = expert_weight_operands(w, "mxfp8", "mx128")
    assert b is not a and not same(b.fwd_data, a.fwd_data)
    with torch.no_grad():
        w.mul_(2)  # an in-place edit bumps the version
    c = expert_weight_operands(w, "mxfp8", "mx128")
    assert c is not b


@pytest.mark.parametrize("args, match", [
    (("fp8_rowwise", "mx128"), "granularity"),
    (("mxfp8", None), "granularity"),
    (("mxfp4", None), "moe_recipe"),
])
def test_bad_arguments_are_one_line_errors(args, match):
    with pytest.raises(ValueError, match=match):
        quantize_expert_weight(torch.zeros(1, 32, 32), *args)


@pytest.mark.parametrize("recipe, gran", [("mxfp8", "mx128"), ("fp8_rowwise", None)])
def test_gathered_weight_is_a_parameter_autograd_and_torch_compile_see_through(recipe, gran):
    """The object FSDP2's post-all-gather builds: an nn.Parameter whose gradient comes back as a plain tensor of
    its dtype, traced by torch.compile(fullgraph=True) through __tensor_flatten__ / __tensor_unflatten__."""
    from titan_fp8.float8.expert_weights import (
        WEIGHT_TILE,
        Float8GatheredWeight,
        dequantize_operands,
        operands_from_compact,
        quantize_whole,
    )

    w = weight(2, 256, 128)
    data, scale = quantize_whole(w, recipe)
    p = torch.nn.Parameter(Float8GatheredWeight(data, scale, recipe, gran, torch.float32, WEIGHT_TILE))
    ref_ops = quantize_expert_weight(w, recipe, gran)
    got = expert_weight_operands(p, recipe, gran)
    for a, b in zip(got, ref_ops):
        assert same(a, b) and a.stride() == b.stride()
    assert expert_weight_operands(p, recipe, gran, which="fwd").bwd_data is None

    class MM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            ops = expert_weight_operands(w, recipe, gran, which="fwd")
            return torch.bmm(x, dequantize_operands(ops, recipe).transpose(1, 2))

        @staticmethod
        def backward(ctx, d):
            x, w = ctx.saved_tensors
            ops = expert_weight_operands(w, recipe, gran, which="bwd")
            wt = operands_from_compact(ops.bwd_data.transpose(1, 2).contiguous(), w._scale, recipe, "fwd")
            return torch.bmm(d, dequantize_operands(wt, recipe)), torch.bmm(d.transpose(1, 2), x)

    def f(x, w):
        return MM.apply(x, w).sum()

    x = torch.randn(2, 8, 128, requires_grad=True)
    f(x, p).backward()
    g_eager, gx_eager = p.grad, x.grad
    assert type(g_eager) is torch.Tensor and g_eager.dtype == torch.float32 and g_eager.shape == p.shape
    p.grad = x.grad = None
    torch.compile(f, fullgraph=True, backend="aot_eager")(x, p).backward()
    assert torch.equal(p.grad, g_eager) and torch.equal(x.grad, gx_eager)


def test_triton_whole_weight_quantizer_equals_reference(monkeypatch):
    """The CUDA path of quantize_whole (one-read Triton tile quantizer) under the interpreter: same bytes and
    compact tile scales as the plain PyTorch groups (values pre-rounded to bf16 so the interpreter's cast
    rounding bugs, FACTS.md, cannot differ)."""
    import importlib

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    qt = importlib.import_module("kernels.grouped_gemm.quant_triton")
    monkeypatch.setattr(qt, "_INTERPRET", True)
    from titan_fp8.float8.expert_weights import quantize_whole
    w = weight(2, 256, 160).to(torch.bfloat16).float()
    d_ref, s_ref = quantize_whole(w, "mxfp8", backend="reference")
    d_tri, s_tri = quantize_whole(w, "mxfp8", backend="triton")
    assert torch.equal(s_tri, s_ref) and s_ref.shape == (2, 2, 2)
    assert same(d_tri, d_ref)
