"""The MXFP8 Linear with linear_granularity = "mx128" (recipe_name = "mxfp8"): config, conversion, numerics of the
emulated twin against float64, its one-read Triton quantizers (interpreted) against their plain PyTorch twin, the
Triton path under torch.compile, and FSDP2 float8 all-gather of its 128x128-tile weights (2 and 1 gloo processes;
"mx32", whose weight bytes are the same, on 2).
The cuBLAS argument layouts are checked in tests/cpu/test_float8_blockwise_layout.py (the same autograd function).
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from kernels.grouped_gemm.quant import to_mx128_blockwise_reference, to_mxfp8_blocked
from kernels.mxfp8 import from_mxfp8
from titan_fp8.config import ConfigError, load_config
from titan_fp8.float8 import Float8Config, Float8Linear, convert_to_float8_training
from titan_fp8.float8 import linear as f8linear

HERE = os.path.dirname(os.path.abspath(__file__))
MX128 = dict(recipe_name="mxfp8", linear_granularity="mx128", emulate=True)
# the emulated GEMMs accumulate the dequantized operands in fp32; the reference in float64
TOL_EXACT = 1e-5
# against the UNquantized float64 product: e4m3 rounding (2^-4 relative at worst, ~3.7% norm-wise here)
TOL_QUANT = 0.06


# ------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs", [
    dict(recipe_name="tensorwise", linear_granularity="mx128"),
    dict(recipe_name="blockwise", linear_granularity="mx32"),
    dict(recipe_name="mxfp8", linear_granularity="mx64"),
    dict(recipe_name="mxfp8", linear_granularity=128),
])
def test_config_errors_name_the_key(kwargs):
    with pytest.raises(ValueError) as e:
        Float8Config(**kwargs)
    msg = str(e.value)
    assert msg.startswith("linear_granularity:") and "\n" not in msg, msg


def test_config_defaults():
    assert Float8Config(recipe_name="mxfp8").linear_granularity == "mx32_tile32"
    assert Float8Config(recipe_name="tensorwise").linear_granularity is None
    c = Float8Config(**MX128)
    assert c.mx128_linear and c.linear_dim_multiple == 128
    assert Float8Config(recipe_name="mxfp8").linear_dim_multiple == 32  # the default "mx32_tile32"
    assert Float8Config(recipe_name="mxfp8", linear_granularity="mx32").linear_dim_multiple == 128


def test_toml_and_cli(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[float8]\nenable = true\nrecipe_name = "mxfp8"\nemulate = true\n')
    cfg = load_config(str(p), ["--float8.linear_granularity=mx128"], world_size=1)
    assert cfg.float8.linear_granularity == "mx128"
    p.write_text('[float8]\nenable = true\nrecipe_name = "tensorwise"\nlinear_granularity = "mx128"\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(p), [], world_size=1)
    assert "[float8] linear_granularity: " in str(e.value) and "\n" not in str(e.value)


def test_dims_not_multiples_of_128_are_a_startup_error_naming_the_layer():
    def model():
        return nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 160, bias=False),
                             nn.Linear(256, 100, bias=False))  # 100: not even mxfp8-eligible (skipped)
    with pytest.raises(ValueError, match=r"^linear_granularity: 1 \[in_features=256, out_features=160\]"):
        convert_to_float8_training(model(), Float8Config(**MX128))
    m = convert_to_float8_training(model(), Float8Config(**MX128, filter_fqns=["1"]))
    assert [type(c) for c in m] == [Float8Linear, nn.Linear, nn.Linear]
    m = convert_to_float8_training(model(), Float8Config(recipe_name="mxfp8", linear_granularity="mx32_tile32",
                                                         emulate=True))  # mx32_tile32 takes 160
    assert [type(c) for c in m] == [Float8Linear, Float8Linear, nn.Linear]


def test_all_gather_needs_128_rows_per_shard():
    from titan_fp8.float8 import check_float8_all_gather
    cfg = Float8Config(**MX128, enable_fsdp_float8_all_gather=True)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(128, 256, bias=False)), cfg)
    check_float8_all_gather(m, 2)  # 128 rows per rank
    with pytest.raises(ValueError, match=r"enable_fsdp_float8_all_gather: .*0 \[out_features=256\] \(mx128\)"):
        check_float8_all_gather(m, 4)  # 64 rows per rank: tiles straddle shards


# ------------------------------------------------------------------------------------------ numerics
def _data(rows, cols, gen, tile_rows=1, huge=True):
    """Random values whose 1x128 blocks (or 128x128 tiles) span many decades, with an all-zero row, a block of
    fp32 subnormals and (huge) a block near 1e25 times the rest."""
    t = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    mag = torch.pow(10.0, torch.empty(-(-rows // tile_rows), cols // 128, dtype=torch.float64).uniform_(-4, 4,
                                                                                                      generator=gen))
    t = t * mag.repeat_interleave(tile_rows, 0)[:rows].repeat_interleave(128, 1)
    t[1] = 0
    if huge:
        t[2, :128] *= 1e25
    t[3, 128:256] = t[3, 128:256].sign() * 1e-40
    return t.float()


def _deq_rows(t, tile):  # MXFP8 shared over 1x128 (or 128x128) along the last dim, decoded in float64
    q, s = to_mxfp8_blocked(t, -1, 128, 128 if tile else 1)
    return from_mxfp8(q, s, -1, torch.float64)


def _deq_cols(t):  # shared over 128x1 along the first dim
    q, s = to_mxfp8_blocked(t, 0, 128, 1)
    return from_mxfp8(q, s, 0, torch.float64)


def _run(x, w, g, emulate=True, pow2=True, xt_tile=False):
    xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = f8linear._BlockwiseMM.apply(xq, wq, emulate, pow2, True, xt_tile)
    y.backward(g)
    return y, xq.grad, wq.grad


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("xt_tile", [False, True], ids=["wgrad_x_1x128", "wgrad_x_tiles"])
@pytest.mark.parametrize("M,K,N", [(256, 384, 640), (384, 128, 256), (128, 1152, 384)])
def test_numerics_against_float64(M, K, N, xt_tile):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    x, w, g = _data(M, K, gen), _data(N, K, gen, 128, huge=False) * 1e-2, _data(M, N, gen, huge=False) * 1e-3
    y, gx, gw = _run(x, w, g, xt_tile=xt_tile)
    x_wgrad = _deq_rows(x, True) if xt_tile else _deq_cols(x)
    assert (y[1] == 0).all() and (gx[1] == 0).all()
    # rows far below the huge one must not hide in the norm: the ordinary rows on their own too
    rows = [i for i in range(M) if i not in (1, 2, 3)]
    assert rel(y[rows], (_deq_rows(x, False) @ _deq_rows(w, True).t())[rows]) < TOL_EXACT
    # exact: the dequantized operands (quantized here independently, with kernels.grouped_gemm.quant's rule)
    # multiplied in float64; only the fp32 accumulation order differs
    for what, got, ref in (("y", y, _deq_rows(x, False) @ _deq_rows(w, True).t()),
                           ("grad_x", gx, _deq_rows(g, False) @ _deq_rows(w, True)),
                           ("grad_w", gw, _deq_cols(g).t() @ x_wgrad)):
        assert torch.isfinite(got).all(), what
        assert rel(got, ref) < TOL_EXACT, (what, rel(got, ref))
    # and, without the huge outlier (which legitimately flushes its 128-token blocks of x^T to zero), close to
    # the unquantized product
    x = _data(M, K, gen, huge=False)
    y, gx, gw = _run(x, w, g, xt_tile=xt_tile)
    xd, wd, gd = x.double(), w.double(), g.double()
    for what, got, ref in (("y", y, xd @ wd.t()), ("grad_x", gx, gd @ wd), ("grad_w", gw, gd.t() @ xd)):
        assert rel(got, ref) < TOL_QUANT, (what, rel(got, ref))
    assert (y[1] == 0).all() and (gx[1] == 0).all()


def test_nan_and_inf_propagate():
    gen = torch.Generator().manual_seed(5)
    M, K, N = 256, 256, 256
    x, w, g = _data(M, K, gen), _data(N, K, gen, 128, huge=False) * 1e-2, _data(M, N, gen, huge=False) * 1e-3
    x[10, 5] = float("nan")      # its 1x128 block (row 10, k < 128): y[10, :] NaN; x^T block: grad_w[:, 5]
    x[200, 130] = float("inf")   # y[200, :] NaN (an inf block is NaN, never saturated); grad_w[:, 130]
    g[20, 3] = float("nan")      # grad_x[20, :]; g^T block (n = 3, tokens 0..127): grad_w[3, :]
    y, gx, gw = _run(x, w, g)
    assert y[10].isnan().all() and y[200].isnan().all()
    assert torch.isfinite(y[[i for i in range(M) if i not in (10, 200)]]).all()
    assert gx[20].isnan().all()
    assert gw[:, 5].isnan().all() and gw[:, 130].isnan().all() and gw[3].isnan().all()
    w2 = w.clone()
    w2[1, 1] = float("nan")      # tile (0, 0): y[:, :128] NaN, y[:, 128:] not (except the NaN rows)
    y2, _, _ = _run(torch.randn(M, K), w2, g)
    assert y2[:, :128].isnan().all() and torch.isfinite(y2[:, 128:]).all()


def test_module_forward_eval_takes_any_token_count():
    torch.manual_seed(0)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(256, 128, bias=True)), Float8Config(**MX128))
    x = torch.randn(3, 7, 256)
    with torch.no_grad():
        y = m(x)  # 21 tokens: no backward copies, no 128-token blocks needed
    ref = x.double() @ m[0].weight.double().t() + m[0].bias.double()
    assert y.shape == (3, 7, 128) and rel(y, ref) < TOL_QUANT
    with pytest.raises(ValueError, match="number of tokens .* is 21; it must be a multiple of 128"):
        m(x.requires_grad_())


# ------------------------------------------------------------------------------------------ Triton quantizers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile,col_tile", [(False, False), (True, True), (False, True)])
def test_triton_quantizer_equals_reference(dtype, tile, col_tile):
    from kernels.grouped_gemm.quant_triton import to_mx128_blockwise
    gen = torch.Generator().manual_seed(7)
    x = _data(256, 640, gen, 128 if tile else 1)
    x[4, 7] = float("nan")
    x[130, 200] = float("-inf")
    x = x.to(dtype)
    for do_row, do_col in ((True, True), (True, False), (False, True)):
        got = to_mx128_blockwise(x, tile, col_tile=col_tile, do_row=do_row, do_col=do_col)
        ref = to_mx128_blockwise_reference(x, tile, do_row, do_col, col_tile)
        for (qg, sg), (qr, sr) in zip(got, ref):
            if qr is None:
                assert qg is None and sg is None
                continue
            assert qg.shape == qr.shape and sg.shape == sr.shape and sg.stride() == sr.stride()
            assert torch.equal(qg.view(torch.uint8), qr.view(torch.uint8))
            assert torch.equal(sg.view(torch.int32), sr.view(torch.int32))  # NaN bits included


@pytest.fixture
def triton_quantizers(monkeypatch):
    monkeypatch.setattr(f8linear, "_uses_triton_quantizers", lambda t, emulate: True)


@pytest.mark.parametrize("xt_tile", [False, True], ids=["wgrad_x_1x128", "wgrad_x_tiles"])
def test_linear_with_triton_quantizers_equals_reference_path(triton_quantizers, xt_tile):
    gen = torch.Generator().manual_seed(3)
    x, w, g = _data(256, 384, gen), _data(256, 384, gen, 128, False) * 1e-2, _data(256, 256, gen, 1, False) * 1e-3
    got = _run(x, w, g, emulate=False, xt_tile=xt_tile)  # (interpreted) Triton quantizers, GEMMs emulated on CPU
    ref = _run(x, w, g, emulate=True, xt_tile=xt_tile)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def test_triton_path_compiles_in_one_graph(triton_quantizers):
    """fullgraph: no graph break around the Triton quantizer op or the scale views (aot_eager: dynamo + AOT
    autograd, what inductor would get)."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(4)
    x, w = _data(256, 256, gen), _data(128, 256, gen, 128, False) * 1e-2

    def step(f):
        xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = f(xq, wq)
        y.square().sum().backward()
        return y, xq.grad, wq.grad

    def fwd(x, w):
        return f8linear._BlockwiseMM.apply(x, w, False, True)
    eager = step(fwd)
    compiled = step(torch.compile(fwd, backend="aot_eager", fullgraph=True))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------ float8 all-gather
@pytest.fixture(scope="module", params=[(2, "mx128"), (1, "mx128"), (2, "mx32")],
                ids=["2ranks", "1rank", "2ranks_mx32"])
def gather_runs(request, tmp_path_factory):
    world, gran = request.param
    out = tmp_path_factory.mktemp(f"{gran}_fsdp{world}")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "float8_mx128_fsdp_worker.py"), str(out), str(world),
                           gran], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def test_all_gather_equals_quantize_after_gather(gather_runs):
    for r in gather_runs:
        on, off = r["on"], r["off"]
        assert on["losses"] == off["losses"]  # bit for bit, every step
        assert on["max_allreduce"] == 0  # 128x128 tiles inside each shard: no AMAX all-reduce
        assert set(on["seen"]) == {"w1", "w2"}
        for name, seen in on["seen"].items():
            full = on["full"][name + ".weight"]
            ref = from_mxfp8(*to_mxfp8_blocked(full, -1, 128, 128), -1, full.dtype)
            assert torch.equal(seen.view(torch.int32), ref.view(torch.int32)), name
            assert torch.equal(off["seen"][name], off["full"][name + ".weight"])  # off: the plain weight
    if len(gather_runs) == 2:  # fp32 params: float8 data + E8M0 bytes are under a third of the fp32 bytes
        assert 0 < gather_runs[0]["on"]["ag_bytes"] < gather_runs[0]["off"]["ag_bytes"] / 3


def test_all_gathered_weight_stays_float8_and_is_never_quantized_again(gather_runs):
    """The Linears get the Float8GatheredWeight FSDP2's post-all-gather built (forward, and backward's regather
    through the `out=` path) and never quantize a weight themselves; gradients equal the all-gather-off run's bit
    for bit."""
    for r in gather_runs:
        on, off = r["on"], r["off"]
        assert on["seen_types"] == {"w1": "Float8GatheredWeight", "w2": "Float8GatheredWeight"}
        assert off["seen_types"] == {"w1": "Parameter", "w2": "Parameter"}
        assert on["weight_quantizations"] == 0
        # per step: forward w of w1 and w2, backward w^T of w2 (w1's input needs no gradient)
        assert off["weight_quantizations"] == 3 * (2 + 1)
        assert set(on["grads"]) == set(off["grads"]) == {"w1.weight", "w2.weight", "output.weight"}
        for name, g in on["grads"].items():
            assert torch.equal(g, off["grads"][name]), name


# ------------------------------------------------------------------------------------------ gathered weights
def _edge_weight(N, K, gen, dtype):
    """A weight whose 128x128 tiles span decades, with an all-zero tile, a tile of fp32 subnormals, a tile near
    1e36, and NaN and inf tiles (both in the first 128 input features, so grad-input's other columns stay
    finite)."""
    w = _data(N, K, gen, 128, huge=False) * 1e-2
    w[128:256, 128:256] = 0
    w[:128, 256:384] = torch.randn(128, 128, generator=gen) * 1e-40
    w[128:256, 256:384] *= 1e36
    w[:128, 5] = float("nan")
    w[256:384, 7] = float("inf")
    return w.to(dtype)


def _same_bits(a, b):
    """Bit-equal, NaN positions included (NaN payloads aside)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(torch.where(nan, 0, a), torch.where(nan, 0, b))


@pytest.fixture
def weight_quantizations(monkeypatch):
    """Counts the Linear's own weight quantizations: mx128 128x128-tile calls of _quantize_mx128 (x and g use
    1x128 blocks), mx32_tile32 calls of mx_quantize_weight."""
    count = [0]
    q128, q32 = f8linear._quantize_mx128, f8linear.mx_quantize_weight

    def mx128(t, tile, *args, **kwargs):
        count[0] += bool(tile)
        return q128(t, tile, *args, **kwargs)

    def mx32(w):
        count[0] += 1
        return q32(w)
    monkeypatch.setattr(f8linear, "_quantize_mx128", mx128)
    monkeypatch.setattr(f8linear, "mx_quantize_weight", mx32)
    return count


def _linear_step(x, w, g, cfg):
    xq, wp = x.clone().requires_grad_(), nn.Parameter(w)
    y = f8linear.float8_linear(xq, wp, cfg)
    y.backward(g)
    return y, xq.grad, wp.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gran", ["mx128", "mx32_tile32"])
def test_gathered_weight_is_read_not_requantized_and_equals_quantize_after_gather(weight_quantizations, gran,
                                                                                  dtype):
    """The float8 all-gather's weight (pre- and post-all-gather hooks on one rank) reaches the GEMMs as its bytes
    and tile scales: no weight quantization in forward or backward, and output and both gradients bit-equal to
    the plain weight's (quantize-after-gather), zero / subnormal / huge / NaN / inf tiles included."""
    from titan_fp8.float8.gathered import Float8GatheredWeight
    from titan_fp8.float8.weights import gather_on_one_rank
    gen = torch.Generator().manual_seed(11)
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity=gran, emulate=True, enable_fsdp_float8_all_gather=True)
    M, K, N = 256, 384, 384
    w = _edge_weight(N, K, gen, dtype)
    x, g = _data(M, K, gen, huge=False).to(dtype), (_data(M, N, gen, huge=False) * 1e-3).to(dtype)
    gathered = gather_on_one_rank(w, cfg)
    assert type(gathered) is Float8GatheredWeight and gathered.dtype == dtype and gathered.shape == w.shape
    tile = 128 if gran == "mx128" else 32
    assert gathered._scale.shape == (N // tile, K // tile) and gathered._scale.dtype == torch.uint8
    got = _linear_step(x, gathered, g, cfg)
    assert weight_quantizations[0] == 0
    ref = _linear_step(x, w.clone(), g, cfg)
    assert weight_quantizations[0] > 0  # the counter sees the plain weight's quantizations
    for what, a, b in zip(("output", "grad_input", "grad_weight"), got, ref):
        assert type(a) is torch.Tensor and a.dtype == dtype, what
        assert _same_bits(a, b), what
    y, gx, _ = got
    # NaN / inf tiles (output features :128 and 256:), both in input features :128: only their outputs are NaN
    assert y[:, :128].isnan().all() and y[:, 256:].isnan().all() and torch.isfinite(y[:, 128:256]).all()
    assert gx[:, :tile].isnan().all() and torch.isfinite(gx[:, tile:]).all()  # grad-input: their tiles' columns
    # any other op sees the decoded weight: the MXFP8 decode of the quantized full weight
    q, s = to_mxfp8_blocked(w, -1, 128, 128) if gran == "mx128" else to_mxfp8_blocked(w, -1, 32, 32)
    assert _same_bits(gathered.clone(), from_mxfp8(q, s, -1, dtype)) and _same_bits(gathered * 1, gathered.clone())


def test_gathered_operands_are_the_quantizers_operands_bit_for_bit():
    """The operands read from a gathered weight are, byte for byte and in the same layouts, what the Linear's own
    quantizers write for the full weight: mx128 forward w and grad-input's w^T (tile-factor buffers padded to a
    multiple of 4 blocks: 5 -> 8 and 3 -> 4 here), mx32_tile32's (data, scale_k). Edge tiles as above plus one
    value near the fp32 maximum (its tile decodes to inf: 256 * 2^120)."""
    from titan_fp8.float8.weights import gather_on_one_rank
    gen = torch.Generator().manual_seed(12)
    w = _edge_weight(384, 640, gen, torch.float32)
    w[300, 600] = 3.3e38
    mx128 = gather_on_one_rank(w, Float8Config(**MX128, enable_fsdp_float8_all_gather=True))
    (rq, rs), (cq, cs) = f8linear._quantize_mx128(w, True, True, True, True)
    g = torch.zeros(1, 1)
    for (q, s), (q_ref, s_ref) in ((f8linear._mx128_weight_from_gathered(mx128), (rq, rs)),
                                   (f8linear._mx128_weight_from_gathered(mx128, g), (cq, cs))):
        assert q.shape == q_ref.shape and q.stride() == q_ref.stride() and q.dtype == torch.float8_e4m3fn
        assert s.shape == s_ref.shape and s.stride() == s_ref.stride()
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32))  # NaN factors and 1.0 padding included
    mx32 = gather_on_one_rank(w, Float8Config(recipe_name="mxfp8", linear_granularity="mx32_tile32", emulate=True,
                                              enable_fsdp_float8_all_gather=True))
    for a, b in zip(f8linear._mx32_tile32_weight(mx32), f8linear.mx_quantize_weight(w)):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("gran", ["mx128", "mx32", "mx32_tile32"])
def test_gathered_weight_compiles_in_one_graph(triton_quantizers, monkeypatch, gran):
    """torch.compile (aot_eager, fullgraph) takes the gathered weight as a graph input through
    __tensor_flatten__ and gives eager's output and gradients (mx128 with the interpreted Triton quantizers for
    x and g)."""
    from titan_fp8.float8.weights import gather_on_one_rank
    q128 = f8linear._quantize_mx128

    def no_weight_quantization(t, tile, *args, **kwargs):  # raises in eager and in traced code alike
        if tile:
            raise AssertionError("the Linear quantized a gathered weight")
        return q128(t, tile, *args, **kwargs)
    monkeypatch.setattr(f8linear, "_quantize_mx128", no_weight_quantization)
    monkeypatch.setattr(f8linear, "mx_quantize_weight", None)  # any call fails
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(4)
    cfg = Float8Config(recipe_name="mxfp8", linear_granularity=gran, emulate=True,
                       enable_fsdp_float8_all_gather=True)
    x, w = _data(256, 256, gen), _data(128, 256, gen, 128, False) * 1e-2
    gathered = gather_on_one_rank(w, cfg)

    def step(f):
        xq, wp = x.clone().requires_grad_(), nn.Parameter(gathered.detach())
        y = f(xq, wp)
        y.square().sum().backward()
        return y, xq.grad, wp.grad

    def fwd(x, w):  # mx128: emulate=False takes the Triton quantizers (GEMMs still emulated on CPU)
        if gran == "mx128":
            return f8linear._BlockwiseMM.apply(x, w, False, True, True, f8linear.MX128_WGRAD_X_TILES)
        if gran == "mx32":  # x and g through the (patched-in) Triton quantizers, GEMMs emulated
            return f8linear._MXFP8MM.apply(x, w, True)
        return f8linear._MXFP8Tile32MM.apply(x, w, True)
    eager = step(fwd)
    compiled = step(torch.compile(fwd, backend="aot_eager", fullgraph=True))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
