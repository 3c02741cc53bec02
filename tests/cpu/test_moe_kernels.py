"""kernels/moe (contract 2 of issue 9): the Triton kernels (TRITON_INTERPRET=1 here; the interpreter path rounds
onto the e4m3 grid with integer ops, FACTS.md) byte for byte against the plain PyTorch reference, and the
reference against float64 definitions at stated tolerances, on fresh random data with zeros, subnormals, huge
values, inf/NaN rows, empty experts, all tokens on one expert, padding rows (src == N) and uneven groups.
Tiny shapes (the interpreter runs every program in numpy)."""
import math

import pytest
import torch
import triton
import triton.language as tl

import kernels.moe as km
from kernels.moe import reference as ref
from kernels.moe.triton import _pow2_scale
from kernels.mxfp8 import from_mxfp8
from titan_fp8.models.moe import dispatch_plan

E4M3 = torch.float8_e4m3fn
U8 = torch.uint8
CASES = [("mxfp8", 32), ("mxfp8", 128), ("fp8_rowwise", 32)]
ALIGN = {("mxfp8", 32): 32, ("mxfp8", 128): 128, ("fp8_rowwise", 32): 16}


def plan_for(kind, N, k, E, align, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "one_expert":  # every (token, slot) on expert 1; the others empty
        experts = torch.ones(N, k, dtype=torch.int64)
    else:  # uneven: skewed choice, expert E-1 never chosen (empty), E-2 rare
        p = torch.tensor([8.0, 3.0] + [1.0] * (E - 4) + [0.2, 0.0])[:E]
        experts = torch.multinomial(p.expand(N, E), k, replacement=False, generator=g)
    return dispatch_plan(experts, E, align)


def special(M, D, dtype, seed):
    """Random rows with dynamic range, plus a zero row, a NaN row, an inf row, subnormals and huge values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, D, generator=g) * torch.logspace(-6, 6, D)[torch.randperm(D, generator=g)]
    x[1] = 0
    if M > 5:
        x[3, 5] = float("nan")
        x[4, 7] = float("-inf")
        x[5, :4] = torch.tensor([1e-40, -3e-39, 2e-38, 1e-45])  # fp32 subnormals (bf16 keeps the larger ones)
        x[2, 9] = 3e38
    return x.to(dtype)


def same(a, b, what):
    if a.dtype in (E4M3, U8):
        assert a.shape == b.shape, (what, a.shape, b.shape)
        bad = (a.view(U8) != b.view(U8))
        assert not bool(bad.any()), f"{what}: {int(bad.sum())} bytes differ, first at {bad.nonzero()[0].tolist()}"
    else:
        assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
        assert torch.equal(a.isnan(), b.isnan()), what
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"{what}: max diff {(a - b).abs().max()}"
    assert a.stride() == b.stride(), (what, a.stride(), b.stride())


def both(fn, *args):
    return fn(*args, backend="triton"), fn(*args, backend="reference")


# ------------------------------------------------------------------------------------------ Triton == reference

def same_dweights(got, want, dout, y, pos):
    """combine backward's dweights [N, k]: a dot over D in the kernel's summation order, so the same non-finite
    entries and the finite ones within 1e-5 of the sum of |dout * y| over the features (fp32 rounding)."""
    N, k = want.shape
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got))
    scale = (dout.float().abs()[:, None, :] * y.index_select(0, pos).view(N, k, -1).float().abs()).sum(-1)
    assert bool(((got - want).abs()[fin] <= 1e-5 * scale[fin] + 1e-30).all())

@pytest.mark.parametrize("recipe,block", CASES)
@pytest.mark.parametrize("kind", ["uneven", "one_expert"])
def test_dispatch_and_combine_triton_equal_reference(recipe, block, kind):
    N, k, E = 12, 2 if kind == "uneven" else 1, 4
    plan = plan_for(kind, N, k, E, ALIGN[recipe, block], seed=N * E)
    D = 128 if block == 128 else 64
    P = plan.src.shape[0]
    assert bool((plan.src == N).any())  # padding rows present
    x = special(N, D, torch.bfloat16, seed=1)
    got, want = both(km.dispatch_quantize, x, plan.src, plan.offs, recipe, block)
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"dispatch out {i}")
    y = special(P, D, torch.bfloat16, seed=2)
    w8 = torch.rand(N, k)
    w8[0, 0] = 0.0
    same(*both(km.combine, y, plan.pos, w8), "combine")
    dout = special(N, D, torch.bfloat16, seed=3)
    got, want = both(km.combine_backward, dout, y, plan.pos, w8, plan.src, plan.offs, recipe, block)
    for i in range(4):
        same(got[i], want[i], f"combine_backward out {i}")
    same_dweights(got[4], want[4], dout, y, plan.pos)


@pytest.mark.parametrize("recipe,block,col_tile",
                         [(r, b, 1) for r, b in CASES] + [("mxfp8", 32, 128), ("mxfp8", 128, 128)])
def test_dispatch_one_copy_only(recipe, block, col_tile):
    """outputs=ROWS / TOKEN_MAJOR: the copy made is the BOTH call's, byte for byte (Triton and reference); the one
    left out comes back as reference.unmade_* in both (shape, dtype and strides), so fake and real agree."""
    N, k, E = 12, 2, 4
    plan = plan_for("uneven", N, k, E, ALIGN[recipe, block], seed=41)
    D = 128 if block == 128 or col_tile == 128 else 64
    x = special(N, D, torch.bfloat16, seed=42)
    full = km.dispatch_quantize(x, plan.src, plan.offs, recipe, block, backend="reference", col_tile=col_tile)
    for outputs, made in ((km.ROWS, (0, 1)), (km.TOKEN_MAJOR, (2, 3))):
        unmade = (ref.unmade_token_major(x, D, recipe) if outputs == km.ROWS else ref.unmade_rows(x, D, recipe))
        for backend in ("triton", "reference"):
            got = km.dispatch_quantize(x, plan.src, plan.offs, recipe, block, backend=backend, col_tile=col_tile,
                                       outputs=outputs)
            left = [i for i in range(4) if i not in made]
            for i in made:
                same(got[i], full[i], f"{backend} outputs={outputs} out {i}")
            for i, u in zip(left, unmade):
                assert (got[i].shape, got[i].dtype, got[i].stride()) == (u.shape, u.dtype, u.stride()), (backend, i)
    for bad in (0, 4):
        with pytest.raises(ValueError, match="outputs="):
            km.dispatch_quantize(x, plan.src, plan.offs, recipe, block, outputs=bad)


@pytest.mark.parametrize("recipe,block", CASES)
def test_swiglu_triton_equal_reference(recipe, block):
    N, k, E = 10, 2, 4
    plan = plan_for("uneven", N, k, E, ALIGN[recipe, block], seed=7)
    P, H = plan.src.shape[0], (128 if block == 128 else 64)
    h13 = special(P, 2 * H, torch.bfloat16, seed=4)
    h13[8] = (torch.randn(2 * H) * 30).to(torch.bfloat16)  # saturating sigmoid both ways
    h13[9, :3] = torch.tensor([float("inf"), float("-inf"), -200.0])
    got, want = both(km.swiglu_quantize, h13, plan.offs, recipe, block)
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"swiglu out {i}")
    da = special(P, H, torch.bfloat16, seed=5)
    got, want = both(km.swiglu_quantize_backward, da, h13, plan.offs, recipe, block)
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"swiglu backward out {i}")


def test_fp32_inputs_and_no_tokens():
    plan = plan_for("uneven", 6, 2, 4, 32, seed=3)
    x = special(6, 64, torch.float32, seed=9)
    for i, (g, w) in enumerate(zip(*both(km.dispatch_quantize, x, plan.src, plan.offs, "mxfp8", 32))):
        same(g, w, f"fp32 dispatch out {i}")
    y = special(plan.src.shape[0], 64, torch.float32, seed=8)
    same(*both(km.combine, y, plan.pos, torch.rand(6, 2)), "fp32 combine")
    # no tokens at all: every buffer row is padding
    empty = dispatch_plan(torch.zeros(0, 2, dtype=torch.int64), 4, 32)
    x0 = torch.zeros(0, 64, dtype=torch.bfloat16)
    for recipe in ("mxfp8", "fp8_rowwise"):
        outs = both(km.dispatch_quantize, x0, empty.src, empty.offs, recipe, 32)
        for i, (g, w) in enumerate(zip(*outs)):
            same(g, w, f"empty {recipe} out {i}")
    # ...and its backward (an EP rank that receives no rows: k = 1, every row padding)
    empty1 = dispatch_plan(torch.zeros(0, 1, dtype=torch.int64), 4, 16)
    y0 = torch.zeros(empty1.src.shape[0], 64, dtype=torch.bfloat16)
    outs = both(km.combine_backward, x0, y0, empty1.pos, torch.zeros(0, 1), empty1.src, empty1.offs, "fp8_rowwise")
    for i, (g, w) in enumerate(zip(*outs)):
        same(g, w, f"empty combine_backward out {i}")
    assert outs[1][4].shape == (0, 1)


# ------------------------------------------------------------------------------------------ reference vs float64
def dequant_rows(q, s, recipe):
    if recipe == "mxfp8":
        return from_mxfp8(q, s, -1, torch.float64)
    return q.double() / s.double()[:, None]


def dequant_token_major(qt, st, offs, recipe):
    if recipe == "mxfp8":
        return from_mxfp8(qt, st.contiguous(), -1, torch.float64).t()
    g = ref.row_group(offs, qt.shape[1])
    return qt.double().t() / st.double()[g.clamp(max=offs.shape[0] - 1)]


def check_quantized(v64, outs, offs, recipe, block, what):
    """Both copies decode to the float64 values within e4m3 rounding (half a grid step: 2^-4 relative for
    normals, plus half the smallest subnormal step of the scale group), and scales are the largest powers of two
    that keep every group in range."""
    q, s, qt, st = outs
    E = offs.shape[0]
    g = ref.row_group(offs, v64.shape[0])
    finite_rows = torch.isfinite(v64).all(1)
    if recipe == "mxfp8":
        grid_r = from_mxfp8(torch.full_like(q.view(U8), 1).view(E4M3), s, -1, torch.float64)  # 2^-9 * scale
        grid_c = from_mxfp8(torch.full_like(qt.view(U8), 1).view(E4M3), st.contiguous(), -1, torch.float64).t()
    else:
        grid_r = 2.0 ** -9 / s.double()[:, None].expand_as(v64)
        grid_c = 2.0 ** -9 / st.double()[g.clamp(max=E - 1)]
    for deq, grid, rows_ok, name in ((dequant_rows(q, s, recipe), grid_r, finite_rows, "rows"),
                                     (dequant_token_major(qt, st, offs, recipe), grid_c, None, "token-major")):
        ok = torch.isfinite(deq) & torch.isfinite(v64)
        if rows_ok is not None:
            ok &= rows_ok[:, None]
        err = (deq - v64).abs()
        assert bool((err[ok] <= v64.abs()[ok] * 2.0 ** -4 + grid[ok] / 2 * 1.000001).all()), f"{what} {name}"
    # non-finite values poison their whole scale group (visible NaN, never silent zeros)
    bad_rows = ~finite_rows
    assert bool(dequant_rows(q, s, recipe)[bad_rows].isnan().any(1).all()), f"{what}: non-finite rows"
    if recipe == "fp8_rowwise":
        a = v64.abs()
        for e in range(E):
            rows = g == e
            if not bool(rows.any()):
                continue
            amax = a[rows].amax(0)
            fin = torch.isfinite(amax) & (amax > 0)
            sc = st[e].double()
            assert bool((torch.log2(sc[fin]) == torch.log2(sc[fin]).round()).all())
            assert bool((amax[fin] * sc[fin] <= 448).all() and (amax[fin] * sc[fin] * 2 > 448).all()), what
            assert bool(sc[~torch.isfinite(amax)].isnan().all()), what


@pytest.mark.parametrize("recipe,block", CASES)
def test_reference_against_float64(recipe, block):
    N, k, E = 24, 2, 5
    plan = plan_for("uneven", N, k, E, ALIGN[recipe, block], seed=11)
    D = 128
    P = plan.src.shape[0]
    x = special(N, D, torch.bfloat16, seed=12)
    x64 = torch.cat([x.double(), torch.zeros(1, D, dtype=torch.float64)])[plan.src]  # gathered, padding zero
    outs = km.dispatch_quantize(x, plan.src, plan.offs, recipe, block, backend="reference")
    check_quantized(x64, outs, plan.offs, recipe, block, "dispatch")
    assert bool((outs[0].view(U8)[plan.src == N] == 0).all())  # padding rows: zero bytes
    # SQNR of the row copy on plain Gaussian rows: e4m3 keeps ~30 dB
    r = torch.randn(N, D, dtype=torch.bfloat16)
    q, s, qt, st = km.dispatch_quantize(r, plan.src, plan.offs, recipe, block, backend="reference")
    r64 = torch.cat([r.double(), torch.zeros(1, D, dtype=torch.float64)])[plan.src]
    for deq in (dequant_rows(q, s, recipe), dequant_token_major(qt, st, plan.offs, recipe)):
        sqnr = 10 * math.log10((r64 ** 2).sum() / ((deq - r64) ** 2).sum())
        assert sqnr > 28, (recipe, block, sqnr)
    # combine: float64 weighted sum, one bf16 rounding (2^-8 relative) plus fp32 sum rounding
    y = special(P, D, torch.bfloat16, seed=13)
    y[~torch.isfinite(y.float()).all(1)] = 1.0
    w = torch.rand(N, k)
    out = km.combine(y, plan.pos, w, backend="reference").double()
    want = (y.double().index_select(0, plan.pos).view(N, k, D) * w.double()[..., None]).sum(1)
    mag = (y.double().abs().index_select(0, plan.pos).view(N, k, D) * w.double()[..., None]).sum(1)
    assert bool(((out - want).abs() <= want.abs() * 2.0 ** -8 + mag * 2.0 ** -22 + 1e-38).all())
    # combine backward: dy = w * dout on the pair's row, zero on padding; dweights = float64 dots
    dout = special(N, D, torch.bfloat16, seed=14)
    dout[~torch.isfinite(dout.float()).all(1)] = 0.5
    dout[2, 9] = 1e30
    res = km.combine_backward(dout, y, plan.pos, w, plan.src, plan.offs, recipe, block, backend="reference")
    pair = torch.full((P,), -1, dtype=torch.int64)
    pair[plan.pos] = torch.arange(N * k)
    dy64 = torch.zeros(P, D, dtype=torch.float64)
    real = pair >= 0
    dy64[real] = w.double().reshape(-1)[pair[real], None] * dout.double()[pair[real] // k]
    check_quantized(dy64, res[:4], plan.offs, recipe, block, "combine_backward")
    dw64 = (dout.double()[:, None, :] * y.double().index_select(0, plan.pos).view(N, k, D)).sum(-1)
    dmag = (dout.double().abs()[:, None, :] * y.double().abs().index_select(0, plan.pos).view(N, k, D)).sum(-1)
    in_range = dmag < 1e38  # fp32 sums past that overflow (the float64 one does not)
    assert bool(((res[4].double() - dw64).abs() <= dmag * 1e-6)[in_range].all())


def test_sigmoid_and_swiglu_against_float64():
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.randn(5000) * 4, torch.tensor([0.0, -0.0, 1e-30, -1e-30,
                                                                                           88.7, -88.7, 1e-40])])
    s = ref._sigmoid(x).double()
    want = torch.sigmoid(x.double())
    normal = (want >= 2.0 ** -126) & (x > -87)  # below x = -88 the clamped exponent gives ~2^-127, not smaller
    # a few fp32 ulp, plus the fp32 rounding of t = x * -log2(e) carried through 2^t (|x| * 2^-24 relative)
    excess = ((s - want).abs() / want - x.double().abs() * 2.0 ** -23)[normal].max().item()
    assert excess < 2.0 ** -21, excess
    left = x < -87
    assert ((s - want).abs() * x.double().abs())[left].max().item() < 1e-36  # silu's absolute error at the far left
    assert bool(ref._sigmoid(torch.tensor([float("nan")])).isnan().all())
    assert ref._sigmoid(torch.tensor([float("inf")])).item() == 1.0
    # forward and backward values vs float64 autograd of silu(h1) * h3 (finite inputs)
    P, H = 64, 96
    h13 = (torch.randn(P, 2 * H) * 3).to(torch.bfloat16)
    da = torch.randn(P, H).to(torch.bfloat16)
    h = h13.double().requires_grad_(True)
    a64 = torch.nn.functional.silu(h[:, :H]) * h[:, H:]
    a64.backward(da.double())
    a = ref.swiglu_values(h13).double()
    assert bool(((a - a64.detach()).abs() <= a64.detach().abs() * 2.0 ** -20 + 1e-30).all())
    gr = ref.swiglu_grad_values(da, h13).double()
    mag = (da.double().abs() * (h13.double()[:, H:].abs() + h13.double()[:, :H].abs() + 1)).repeat(1, 2)
    assert bool(((gr - h.grad).abs() <= mag * 2.0 ** -19).all())
    # quantized outputs decode to those values
    for recipe, block in (("mxfp8", 32), ("fp8_rowwise", 32)):
        align = ALIGN[recipe, block]
        pl = plan_for("uneven", 20, 2, 4, align, seed=1)
        hh = (torch.randn(pl.src.shape[0], 2 * H) * 3).to(torch.bfloat16)
        check_quantized(ref.swiglu_values(hh).double(), km.swiglu_quantize(hh, pl.offs, recipe, block,
                                                                           backend="reference"),
                        pl.offs, recipe, block, "swiglu")
        dd = torch.randn(pl.src.shape[0], H).to(torch.bfloat16)
        check_quantized(ref.swiglu_grad_values(dd, hh).double(),
                        km.swiglu_quantize_backward(dd, hh, pl.offs, recipe, block, backend="reference"),
                        pl.offs, recipe, block, "swiglu backward")


# ------------------------------------------------------------------------------------------ ops, compile, errors
def test_triton_ops_trace_under_compile():
    plan = plan_for("uneven", 8, 2, 4, 32, seed=5)
    x = special(8, 64, torch.bfloat16, seed=6)
    P = plan.src.shape[0]
    y, h13 = torch.randn(P, 64, dtype=torch.bfloat16), torch.randn(P, 64, dtype=torch.bfloat16)
    ops = torch.ops.titan_fp8
    xf = torch.randn(8, 64, dtype=torch.bfloat16)  # finite: opcheck compares outputs with ==, and NaN != NaN
    checks = [(ops.moe_dispatch_quantize.default, (xf, plan.src, plan.offs, "mxfp8", 32, 1, km.BOTH)),
              (ops.moe_dispatch_quantize.default, (xf, plan.src, plan.offs, "fp8_rowwise", 32, 1, km.BOTH)),
              (ops.moe_dispatch_quantize.default, (xf, plan.src, plan.offs, "mxfp8", 32, 1, km.ROWS)),
              (ops.moe_dispatch_quantize.default, (xf, plan.src, plan.offs, "fp8_rowwise", 32, 1, km.TOKEN_MAJOR)),
              (ops.moe_combine_backward.default, (xf, y, plan.pos, torch.rand(8, 2), plan.src, plan.offs, "mxfp8", 32)),
              (ops.moe_swiglu_quantize.default, (h13, plan.offs, "mxfp8", 32, 1)),
              (ops.moe_swiglu_quantize_backward.default, (h13[:, :32], h13, plan.offs, "mxfp8", 32))]
    for op, args in checks:
        # fake impl == real shapes/strides/dtypes, and the schema (the aot_dispatch checks take minutes in the
        # interpreter; the torch.compile runs below and in tests/gpu cover tracing)
        res = torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
        assert all(v == "SUCCESS" for v in res.values()), (op, res)
    res = torch.library.opcheck(ops.moe_combine.default, (y, plan.pos, torch.rand(8, 2)),
                                test_utils=("test_schema", "test_faketensor"))
    assert all(v == "SUCCESS" for v in res.values()), res
    f = torch.compile(lambda t: km.dispatch_quantize(t, plan.src, plan.offs, "mxfp8", 32, backend="triton"),
                      backend="aot_eager", fullgraph=True)
    for i, (g, w) in enumerate(zip(f(x), km.dispatch_quantize(x, plan.src, plan.offs, "mxfp8", 32,
                                                              backend="reference"))):
        same(g, w, f"compiled dispatch out {i}")
    y = special(plan.src.shape[0], 64, torch.bfloat16, seed=7)
    w = torch.rand(8, 2)
    fc = torch.compile(lambda a: km.combine(a, plan.pos, w, backend="triton"), backend="aot_eager", fullgraph=True)
    same(fc(y), km.combine(y, plan.pos, w, backend="reference"), "compiled combine")


def test_outputs_never_require_grad():
    plan = plan_for("uneven", 8, 2, 4, 32, seed=5)
    x = torch.randn(8, 64, requires_grad=True)
    for backend in ("reference", "triton"):
        outs = km.dispatch_quantize(x, plan.src, plan.offs, "mxfp8", 32, backend=backend)
        assert not any(t.requires_grad for t in outs), backend


def test_bad_input_is_named():
    plan = plan_for("uneven", 8, 2, 4, 32, seed=5)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="recipe='tensorwise'"):
        km.dispatch_quantize(x, plan.src, plan.offs, "tensorwise", 32)
    with pytest.raises(ValueError, match="block=64"):
        km.dispatch_quantize(x, plan.src, plan.offs, "mxfp8", 64)
    with pytest.raises(ValueError, match="x.shape\\[1\\] \\(D\\) = 48"):
        km.dispatch_quantize(torch.randn(8, 48, dtype=torch.bfloat16), plan.src, plan.offs, "mxfp8", 32)
    with pytest.raises(ValueError, match="P = 100 buffer rows"):
        km.dispatch_quantize(x, plan.src[:100], plan.offs, "mxfp8", 32)
    with pytest.raises(ValueError, match="x.dtype is torch.float16"):
        km.dispatch_quantize(x.half(), plan.src, plan.offs, "mxfp8", 32)
    with pytest.raises(ValueError, match="src must be a 1-D torch.int64"):
        km.dispatch_quantize(x, plan.src.int(), plan.offs, "mxfp8", 32)
    with pytest.raises(ValueError, match="offs must be a 1-D torch.int32"):
        km.dispatch_quantize(x, plan.src, plan.offs.long(), "mxfp8", 32)
    with pytest.raises(ValueError, match="backend='cuda'"):
        km.dispatch_quantize(x, plan.src, plan.offs, "mxfp8", 32, backend="cuda")
    y = torch.randn(plan.src.shape[0], 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weights must be a 2-D torch.float32"):
        km.combine(y, plan.pos, torch.rand(8, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="pos has 15 elements; expected 16"):
        km.combine(y, plan.pos[:15], torch.rand(8, 2))
    with pytest.raises(ValueError, match="y.dtype torch.float32 != dout.dtype torch.bfloat16"):
        km.combine_backward(x, y.float(), plan.pos, torch.rand(8, 2), plan.src, plan.offs, "mxfp8", 32)
    with pytest.raises(ValueError, match="da is"):
        km.swiglu_quantize_backward(y[:, :16], y, plan.offs, "mxfp8", 32)
    with pytest.raises(ValueError, match="must be even"):
        km.swiglu_quantize(y[:, :63], plan.offs, "mxfp8", 32)


def test_fp8_rowwise_groups_not_aligned_to_tiles():
    """fp8_rowwise takes any group boundaries: tiles that straddle several groups (align 4 < the 16-row tile)."""
    plan = plan_for("uneven", 20, 2, 5, 4, seed=21)
    assert bool((plan.offs % 16 != 0).any())
    x = special(20, 64, torch.bfloat16, seed=22)
    for i, (g, w) in enumerate(zip(*both(km.dispatch_quantize, x, plan.src, plan.offs, "fp8_rowwise", 32))):
        same(g, w, f"straddling dispatch out {i}")
    x64 = torch.cat([x.double(), torch.zeros(1, 64, dtype=torch.float64)])[plan.src]
    outs = km.dispatch_quantize(x, plan.src, plan.offs, "fp8_rowwise", 32, backend="reference")
    check_quantized(x64, outs, plan.offs, "fp8_rowwise", 32, "straddling dispatch")
    # the other modes too: both passes see tiles (and pass 1 row ranges) holding several groups
    P = plan.src.shape[0]
    y, dout = special(P, 64, torch.bfloat16, seed=23), special(20, 64, torch.bfloat16, seed=24)
    w = torch.rand(20, 2)
    got, want = both(km.combine_backward, dout, y, plan.pos, w, plan.src, plan.offs, "fp8_rowwise", 32)
    for i in range(4):
        same(got[i], want[i], f"straddling combine_backward out {i}")
    h13, da = special(P, 128, torch.bfloat16, seed=25), special(P, 64, torch.bfloat16, seed=26)
    for name, fn, args in (("swiglu", km.swiglu_quantize, (h13, plan.offs)),
                           ("swiglu_backward", km.swiglu_quantize_backward, (da, h13, plan.offs))):
        for i, (g, w_) in enumerate(zip(*both(fn, *args, "fp8_rowwise", 32))):
            same(g, w_, f"straddling {name} out {i}")


@pytest.mark.parametrize("block", [32, 128])
def test_col_tile_128_token_major_copy(block):
    """col_tile=128: the token-major copy shares one scale per block tokens x 128 features (the weight-tiled wgrad's
    operand); Triton == reference, and the reference is kernels.grouped_gemm.quant.to_mxfp8_blocked's rule."""
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    plan = plan_for("uneven", 12, 2, 4, block, seed=31)
    x = special(12, 256, torch.bfloat16, seed=32)
    got, want = both(lambda *a, backend: km.dispatch_quantize(*a, backend=backend, col_tile=128),
                     x, plan.src, plan.offs, "mxfp8", block)
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"col_tile dispatch out {i}")
    v = ref.gather_rows(x, plan.src)
    d, sc = to_mxfp8_blocked(v.t(), -1, block, 128)
    same(want[2], d, "token-major data")
    assert torch.equal(want[3], sc)
    h13 = special(plan.src.shape[0], 256, torch.bfloat16, seed=33)
    got, want = both(lambda *a, backend: km.swiglu_quantize(*a, backend=backend, col_tile=128),
                     h13, plan.offs, "mxfp8", block)
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, f"col_tile swiglu out {i}")
    with pytest.raises(ValueError, match="col_tile=128 applies to mxfp8 only"):
        km.dispatch_quantize(x, plan.src, plan.offs, "fp8_rowwise", 32, col_tile=128)
    with pytest.raises(ValueError, match="col_tile=64"):
        km.dispatch_quantize(x, plan.src, plan.offs, "mxfp8", block, col_tile=64)


@pytest.mark.parametrize("block", [32, 128])
def test_mx_swiglu_backward_both_halves_layouts(block, monkeypatch):
    """mxfp8 swiglu_quantize_backward with HALVES (one program writes dh1's and dh3's columns) and without (each
    output column computes both halves): both equal the reference byte for byte."""
    from kernels.moe import triton as kt
    plan = plan_for("uneven", 10, 2, 4, block, seed=41)
    P, H = plan.src.shape[0], 128
    h13, da = special(P, 2 * H, torch.bfloat16, seed=42), special(P, H, torch.bfloat16, seed=43)
    want = km.swiglu_quantize_backward(da, h13, plan.offs, "mxfp8", block, backend="reference")
    for halves in (True, False):
        bm, bd, warps, _ = kt._MX_INTERP[block]
        monkeypatch.setitem(kt._MX_INTERP, block, (bm, bd, warps, halves))
        got = km.swiglu_quantize_backward(da, h13, plan.offs, "mxfp8", block, backend="triton")
        for i in range(4):
            same(got[i], want[i], f"halves={halves} out {i}")


@pytest.mark.parametrize("block", [32, 128])
def test_mx_amax_first_either_way(block, monkeypatch):
    """_mx_kernel with AMAX_FIRST on and off (kernels.moe.triton.MX_AMAX_FIRST: both amaxes before the row copy is
    encoded) for every mxfp8 op, col_tile 1 and 128, several row and column tiles: equal to the reference byte for
    byte (the col_tile=128 token-major scale comes from the row amaxes there)."""
    from kernels.moe import triton as kt
    N, k, E, D = 40 if block == 128 else 12, 2, 4, 256
    plan = plan_for("uneven", N, k, E, block, seed=51)
    P = plan.src.shape[0]
    assert P >= 2 * block
    x, dout, y = (special(N, D, torch.bfloat16, seed=52), special(N, D, torch.bfloat16, seed=53),
                  special(P, D, torch.bfloat16, seed=54))
    h13, da = special(P, 2 * D, torch.bfloat16, seed=55), special(P, D, torch.bfloat16, seed=56)
    w8 = torch.rand(N, k, generator=torch.Generator().manual_seed(57))
    for first in (True, False):
        monkeypatch.setattr(kt, "MX_AMAX_FIRST", {(block, m) for m in range(4)} if first else set())
        for ct in (1, 128):
            for name, fn, args in (("dispatch", km.dispatch_quantize, (x, plan.src, plan.offs, "mxfp8", block)),
                                   ("swiglu", km.swiglu_quantize, (h13, plan.offs, "mxfp8", block))):
                got, want = fn(*args, backend="triton", col_tile=ct), fn(*args, backend="reference", col_tile=ct)
                for i in range(4):
                    same(got[i], want[i], f"amax_first={first} {name} col_tile {ct} out {i}")
        got, want = both(km.combine_backward, dout, y, plan.pos, w8, plan.src, plan.offs, "mxfp8", block)
        for i in range(4):
            same(got[i], want[i], f"amax_first={first} combine_backward out {i}")
        same_dweights(got[4], want[4], dout, y, plan.pos)
        got, want = both(km.swiglu_quantize_backward, da, h13, plan.offs, "mxfp8", block)
        for i in range(4):
            same(got[i], want[i], f"amax_first={first} swiglu backward out {i}")


def test_pow2_scale_equals_amax_to_scale_on_every_binade():
    """The fp8_rowwise pass 2 makes its scales in-kernel from the amax bits (kernels.moe.triton._pow2_scale, an
    integer form): bit for bit kernels.float8_cast's amax_to_scale(round_to_pow2=True) on every fp32 binade
    (mantissas around the 1.75 boundary where the power drops), zero, subnormals, values around EPS, the largest
    finite value, inf and NaN (given as inf bits, as pass 1 stores them)."""
    from kernels.float8_cast.reference import amax_to_scale

    mant = torch.tensor([0, 1, 0x2AAAAA, 0x5FFFFF, 0x600000, 0x600001, 0x600002, 0x7FFFFE, 0x7FFFFF],
                        dtype=torch.int64)
    exps = torch.arange(0, 255, dtype=torch.int64)  # biased exponent 0 (zero / subnormals) .. 254 (max finite)
    bits = ((exps[:, None] << 23) | mant[None, :]).reshape(-1)
    eps_bits = torch.tensor([1e-12, 9.9999e-13, 1.00001e-12], dtype=torch.float32).view(torch.int32).to(torch.int64)
    rnd = torch.randint(0, 0x7F800000, (4096,), generator=torch.Generator().manual_seed(7))
    bits = torch.cat([bits, eps_bits, rnd, torch.tensor([0x7F800000])]).to(torch.int32)  # + inf (NaN's stand-in)
    got = torch.empty(bits.shape, dtype=torch.float32)
    _pow2_scale_kernel[(triton.cdiv(bits.numel(), 256),)](bits, got, bits.numel(), BLOCK=256)
    want = amax_to_scale(bits.view(torch.float32), torch.float8_e4m3fn, round_to_pow2=True)
    assert torch.equal(got.isnan(), want.isnan())
    bad = got.nan_to_num(1.0).view(torch.int32) != want.nan_to_num(1.0).view(torch.int32)
    assert not bool(bad.any()), (f"{int(bad.sum())} scales differ, e.g. amax bits {hex(int(bits[bad][0]))}: "
                                 f"{got[bad][0].item()} vs {want[bad][0].item()}")



@triton.jit
def _pow2_scale_kernel(a_ptr, s_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(s_ptr + i, _pow2_scale(tl.load(a_ptr + i, mask=m, other=0)), mask=m)


def test_traced_twins_run_eagerly_like_the_opaque_ops():
    """The triton_op twins (titan_fp8::moe_*_traced, TRACED_LAUNCH on the GPU) run the same body with their
    launches through torch.library.wrap_triton: called eagerly here (the interpreter cannot be traced; tests/gpu
    compiles them), every output equals the opaque op's byte for byte, both recipes."""
    plan = plan_for("uneven", 8, 2, 4, 32, seed=5)
    P = plan.src.shape[0]
    x = special(8, 64, torch.bfloat16, seed=6)
    y, dout = special(P, 64, torch.bfloat16, seed=7), special(8, 64, torch.bfloat16, seed=8)
    h13, da = special(P, 64, torch.bfloat16, seed=9) / 1e3, special(P, 32, torch.bfloat16, seed=10)
    w = torch.rand(8, 2)
    for recipe in ("mxfp8", "fp8_rowwise"):
        pairs = [(km._dispatch_op, km._dispatch_traced, (x, plan.src, plan.offs, recipe, 32, 1, km.BOTH)),
                 (km._dispatch_op, km._dispatch_traced, (x, plan.src, plan.offs, recipe, 32, 1, km.TOKEN_MAJOR)),
                 (km._combine_backward_op, km._combine_backward_traced,
                  (dout, y, plan.pos, w, plan.src, plan.offs, recipe, 32)),
                 (km._swiglu_op, km._swiglu_traced, (h13, plan.offs, recipe, 32, 1)),
                 (km._swiglu_backward_op, km._swiglu_backward_traced, (da, h13, plan.offs, recipe, 32))]
        for opaque, traced, args in pairs:
            for i, (a, b) in enumerate(zip(traced(*args), opaque(*args))):
                same(a, b, f"{recipe} {traced._name} out {i}")
    same(km._combine_traced(y, plan.pos, w), km._combine_op(y, plan.pos, w), "combine")


def test_traced_launch_choice_per_recipe(monkeypatch):
    """TRACED_LAUNCH names the recipes whose ops launch through the triton_op twins (default: mxfp8 only, the one
    measured faster on the GPU); the environment value is checked, and a bad one names the variable."""
    assert km._traced_recipes("mxfp8") == {"mxfp8"}
    assert km._traced_recipes("none") == frozenset() == km._traced_recipes("0") == km._traced_recipes(" ")
    for refused in ("all", "1", "fp8_rowwise", "mxfp8,fp8_rowwise"):  # wrong bytes on an H100 (session 13)
        with pytest.raises(ValueError, match="fp8_rowwise are disabled"):
            km._traced_recipes(refused)
    with pytest.raises(ValueError, match="TITAN_FP8_MOE_TRACED_LAUNCH='mx8'"):
        km._traced_recipes("mx8")
    a, b = object(), object()
    monkeypatch.setattr(km, "TRACED_LAUNCH", frozenset({"mxfp8"}))
    assert km._op(a, b, "mxfp8") is b and km._op(a, b, "fp8_rowwise") is a and km._op(a, b, None) is a
    monkeypatch.setattr(km, "TRACED_LAUNCH", frozenset({"mxfp8", "fp8_rowwise"}))
    assert km._op(a, b, None) is b
    monkeypatch.setattr(km, "TRACED_LAUNCH", False)
    assert km._op(a, b, "mxfp8") is a
