"""MXFP8 format (issue 4): the PyTorch reference against an independent float64 oracle of the spec, and every
Triton entry point (interpreted here, compiled in tests/gpu) against the reference, byte for byte.

The oracle is written from the issue's text with a different code path: Python floats, numpy fp32 division,
math.frexp per block, and e4m3 rounding by nearest-value search over the 127 finite magnitudes with exact
Fraction arithmetic for ties. The input suite (make_cases) is shared with tests/gpu/test_mxfp8_format_gpu.py.
"""
import bisect
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import kernels.mxfp8 as mx
from kernels.mxfp8 import reference as ref

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
U8 = torch.uint8


# ------------------------------------------------------------------------------------------------ oracle
def _e4m3_value(code):
    exp, man = code >> 3, code & 7
    return Fraction(man, 512) if exp == 0 else Fraction(8 + man, 8) * Fraction(2) ** (exp - 7)


_E4M3_VALUES = [_e4m3_value(c) for c in range(0x7F)]  # codes 0..0x7E: 0 .. 448, increasing


def oracle_e4m3_code(v: float) -> int:
    """e4m3fn byte of clamp(v, -448, 448), round to nearest, ties to the even code."""
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = min(Fraction(abs(v)), Fraction(448))
    i = bisect.bisect_left(_E4M3_VALUES, a)
    if i < len(_E4M3_VALUES) and _E4M3_VALUES[i] == a:
        return sign | i
    lo, hi = i - 1, i
    dl, dh = a - _E4M3_VALUES[lo], _E4M3_VALUES[hi] - a
    code = lo if dl < dh else hi if dh < dl else (lo if lo % 2 == 0 else hi)
    return sign | code


def oracle_block(vals):
    """One block (any length) of Python floats -> (list of data bytes, scale byte), straight from the spec."""
    if not all(math.isfinite(v) for v in vals):
        return [ref.E4M3_NAN_BYTE] * len(vals), 0xFF
    amax = max(abs(v) for v in vals)
    s = float(np.float32(amax) / np.float32(448.0))  # fp32, round to nearest even
    if s == 0.0:
        e = -127  # log2(0) = -inf, clamped
    else:
        m, ex = math.frexp(s)
        e = ex - 1 if m == 0.5 else ex
        e = max(-127, min(127, e))
    return [oracle_e4m3_code(math.ldexp(v, -e)) for v in vals], e + 127


def oracle_rows(x: torch.Tensor):
    """x 2-D [R, C] -> (data bytes [R, C], scales [R, C/32]) along the last dim, via oracle_block."""
    R, C = x.shape
    vals = x.double().reshape(-1, 32).tolist()
    out = [oracle_block(b) for b in vals]
    data = torch.tensor([c for codes, _ in out for c in codes], dtype=torch.int64).to(U8).reshape(R, C)
    scale = torch.tensor([s for _, s in out], dtype=torch.int64).to(U8).reshape(R, C // 32)
    return data, scale


def oracle_tiles(w: torch.Tensor):
    """w [N, K] -> (data bytes, tile scales [N/32, K/32]) with one scale per 32x32 tile."""
    N, K = w.shape
    t = w.double().reshape(N // 32, 32, K // 32, 32).permute(0, 2, 1, 3).reshape(-1, 1024)
    out = [oracle_block(b) for b in t.tolist()]
    data = torch.tensor([c for codes, _ in out for c in codes], dtype=torch.int64).to(U8)
    data = data.reshape(N // 32, K // 32, 32, 32).permute(0, 2, 1, 3).reshape(N, K)
    scale = torch.tensor([s for _, s in out], dtype=torch.int64).to(U8).reshape(N // 32, K // 32)
    return data, scale


# ------------------------------------------------------------------------------------------------ inputs
def _bits_dtype(dtype):
    return torch.int32 if dtype == torch.float32 else torch.int16


def _step(v: torch.Tensor, n: int) -> torch.Tensor:
    """Move positive finite values n ulps (in their own dtype)."""
    return (v.view(_bits_dtype(v.dtype)) + n).view(v.dtype)


def boundary_amaxes(dtype) -> torch.Tensor:
    """448 * 2^k exactly, and 1 and 2 ulps either side, for every k where they are finite and nonzero in dtype
    (fp32 / bf16: k from the subnormals to near the max; the clamps at e = -127 and the subnormal fp32
    quotient amax / 448 are in there)."""
    out = []
    fmax = torch.finfo(dtype).max
    for k in range(-160, 125):
        base64 = 448.0 * 2.0 ** k
        b = torch.tensor(base64, dtype=torch.float64).to(dtype)
        if b.item() != base64 or base64 > fmax or base64 == 0:
            continue
        for n in (-2, -1, 0, 1, 2):
            v = _step(b, n)
            if 0 < v.item() < math.inf:
                out.append(v)
    return torch.stack(out)


def blocks_with_amax(amax: torch.Tensor, width: int, gen: torch.Generator) -> torch.Tensor:
    """[n, width] blocks of amax's dtype: block i holds +-amax[i] once (random place and sign), the rest
    smaller random values of either sign."""
    n = amax.numel()
    dt = amax.dtype
    a = amax.double()
    rest = (torch.rand(n, width, generator=gen, dtype=torch.float64) * 2 - 1) * 0.99 * a[:, None]
    rest = rest.to(dt).double()
    rest = torch.where(rest.abs() > a[:, None], torch.zeros_like(rest), rest)
    pos = torch.randint(0, width, (n,), generator=gen)
    sgn = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    rest[torch.arange(n), pos] = a * sgn
    return rest.to(dt)


def _midpoint_block_values():
    """All e4m3 midpoints (incl. subnormal ones) and grid points, both signs, for a block whose amax is 448."""
    mids = [float((_E4M3_VALUES[i] + _E4M3_VALUES[i + 1]) / 2) for i in range(len(_E4M3_VALUES) - 1)]
    vals = mids + [float(v) for v in _E4M3_VALUES]
    vals = vals + [-v for v in vals]
    vals = vals + [0.0] * (-len(vals) % 31)
    return torch.tensor(vals, dtype=torch.float64).reshape(-1, 31)


def _to_2d(blocks: torch.Tensor, cols: int, gen) -> torch.Tensor:
    """[n, 32] blocks -> [R, cols] with R a multiple of 32 (padding with random blocks)."""
    per_row = cols // 32
    n = blocks.shape[0]
    total = -(-n // (32 * per_row)) * 32 * per_row
    if total > n:
        pad = torch.randn(total - n, 32, generator=gen, dtype=torch.float64).to(blocks.dtype)
        blocks = torch.cat([blocks, pad])
    return blocks.reshape(-1, cols)


def make_cases(dtype, seed: int = 0, cols: int = 128):
    """Named 2-D inputs [R, cols] (R, cols multiples of 32) covering the spec's corners, in `dtype`."""
    gen = torch.Generator().manual_seed(seed)
    fi = torch.finfo(dtype)
    cases = {}
    # random with per-row magnitudes over many binades
    mag = 2.0 ** torch.randint(-20, 21, (64, 1), generator=gen).double()
    cases["random"] = (torch.randn(64, cols, generator=gen, dtype=torch.float64) * mag).to(dtype)
    # zeros (+0 and -0) and blocks of one nonzero
    z = torch.zeros(64, cols, dtype=torch.float64)
    z[1::2] = -0.0
    z[5, 7] = 1e-3
    z[9, 40] = -3.0
    cases["zeros"] = z.to(dtype)
    # subnormals of the input dtype (all-subnormal blocks, and mixed with the smallest normals)
    tiny = fi.smallest_normal
    sub = torch.rand(64, cols, generator=gen, dtype=torch.float64) * tiny * 2 - tiny
    sub[::4] *= 2.0 ** -8
    sub[2::8, ::3] = tiny
    cases["subnormal"] = sub.to(dtype)
    if dtype != torch.float32:  # fp32 subnormals reach bf16 / fp16 only as smaller numbers; also cover them
        cases["fp32_range_small"] = (torch.rand(64, cols, generator=gen, dtype=torch.float64) * 2.0 ** -100
                                     ).to(dtype)
    # huge: up to the dtype's max
    hug = (torch.rand(64, cols, generator=gen, dtype=torch.float64) * 2 - 1) * fi.max
    hug[::3, ::5] = fi.max
    hug[1::3, ::7] = -fi.max
    cases["huge"] = hug.to(dtype)
    # boundaries: amax = 448 * 2^k and 1-2 ulps either side, every representable k
    cases["boundary"] = _to_2d(blocks_with_amax(boundary_amaxes(dtype), 32, gen), cols, gen)
    # round-to-nearest-even ties on the e4m3 grid, at block scales 2^0, 2^-6, 2^5 and the e = -127 clamp
    mids = _midpoint_block_values()
    tie_blocks = []
    for k in (0, -6, 5, -127 if dtype != torch.float16 else -20):
        t = torch.cat([mids, torch.full((mids.shape[0], 1), 448.0, dtype=torch.float64)], 1) * 2.0 ** k
        if torch.equal(t.to(dtype).double(), t):
            tie_blocks.append(t.to(dtype))
    cases["ties"] = _to_2d(torch.cat(tie_blocks), cols, gen)
    # non-finite: +inf, -inf, NaN, all-inf, inf+NaN blocks beside finite ones
    nf = torch.randn(64, cols, generator=gen, dtype=torch.float64)
    nf[0, 3] = math.inf
    nf[1, 40] = -math.inf
    nf[2, 77] = math.nan
    nf[3, 32:64] = math.inf
    nf[4, 0] = math.nan
    nf[4, 31] = -math.inf
    nf[5, 100] = -math.nan
    cases["nonfinite"] = nf.to(dtype)
    return cases


def tile_cases(dtype, seed: int = 1):
    """Inputs [N, K] whose 32x32 tiles have boundary amaxes, ties, subnormals, huge and non-finite values."""
    gen = torch.Generator().manual_seed(seed)
    amax = boundary_amaxes(dtype)
    amax = amax[torch.randperm(amax.numel(), generator=gen)[:64]]
    tiles = blocks_with_amax(amax, 1024, gen)  # [64, 1024] -> 8 x 8 tiles of 32 x 32
    w = tiles.reshape(8, 8, 32, 32).permute(0, 2, 1, 3).reshape(256, 256)
    cases = dict(tile_boundary=w)
    c = make_cases(dtype, seed, cols=128)
    for name in ("random", "subnormal", "huge", "ties", "nonfinite", "zeros"):
        cases["tile_" + name] = c[name][:64]
    return cases


def u8(t):
    return t.view(U8) if t.dtype == torch.float8_e4m3fn else t


def assert_bytes_equal(got, want, what):
    got, want = u8(got).cpu(), u8(want).cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} of {got.numel()} bytes differ; first at {i}: "
                             f"got {got[i].item():#04x}, want {want[i].item():#04x}")


CASE_NAMES = list(make_cases(torch.float32).keys())


# ------------------------------------------------------------------------------------------------ oracle vs reference
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_oracle(dtype):
    for name, x in make_cases(dtype).items():
        d, s = ref.to_mxfp8_reference(x, -1)
        od, os_ = oracle_rows(x)
        assert_bytes_equal(s, os_, f"{dtype} {name} scale")
        assert_bytes_equal(d, od, f"{dtype} {name} data")
        # along dim 0 of the transpose: the same blocks, so the same bytes, transposed
        dt, st = ref.to_mxfp8_reference(x.t().contiguous(), 0)
        assert_bytes_equal(dt.t(), od, f"{dtype} {name} data dim0")
        assert_bytes_equal(st.t(), os_, f"{dtype} {name} scale dim0")


def test_oracle_self_check():
    """The oracle itself on hand-worked values (so a wrong oracle can't bless a wrong reference)."""
    assert oracle_e4m3_code(1.0625) == 0x38  # tie between 1 and 1.125 -> even (1.0)
    assert oracle_e4m3_code(1.1875) == 0x3A  # tie between 1.125 and 1.25 -> even (1.25)
    assert oracle_e4m3_code(-17.0) == 0x80 | 0x58  # tie 16 / 18 -> 16 (exp field 11, mantissa 0)
    assert oracle_e4m3_code(464.0) == 0x7E and oracle_e4m3_code(1e9) == 0x7E  # clamp to 448
    assert oracle_e4m3_code(2.0 ** -10) == 0x00 and oracle_e4m3_code(3 * 2.0 ** -10) == 0x02  # subnormal ties
    assert oracle_e4m3_code(-1e-30) == 0x80
    # amax exactly 448 * 2^k -> e = k; one fp32 ulp above -> k + 1 (the case torchao's log2 path gets wrong)
    for k in (-20, 0, 7, 100):
        a = 448.0 * 2.0 ** k
        assert oracle_block([a] + [0.0] * 31)[1] == k + 127
        up = float(np.nextafter(np.float32(a), np.float32(np.inf)))
        assert oracle_block([up] + [0.0] * 31)[1] == k + 128
    # fp32 quotient subnormal: 448 * 2^-127 one ulp up rounds back down to 2^-127 (e -127), two ulps up -> -126
    a = np.float32(448.0 * 2.0 ** -127)
    assert oracle_block([float(np.nextafter(a, np.float32(1)))] + [0.0] * 31)[1] == 0
    a2 = np.nextafter(np.nextafter(a, np.float32(1)), np.float32(1))
    assert oracle_block([float(a2)] + [0.0] * 31)[1] == 1
    assert oracle_block([0.0] * 32)[1] == 0 and oracle_block([2.0 ** -149] * 32)[1] == 0
    assert oracle_block([1.0] * 31 + [math.inf]) == ([0x7F] * 32, 0xFF)


def test_reference_known_bytes():
    """A few blocks worked by hand, independent of both implementations."""
    x = torch.zeros(3, 32)
    x[0, :4] = torch.tensor([448.0, -448.0, 1.0, 1.0625])  # e = 0
    x[1, :2] = torch.tensor([1.0, 0.5])  # amax 1: s = 1/448 -> e = ceil(log2(0.00223)) = -8; data 256, 128
    x[2, 0] = 3.0e38  # near fp32 max: e = ceil(log2(3e38 / 448)) = 120
    d, s = ref.to_mxfp8_reference(x)
    assert s.reshape(-1).tolist() == [127, 119, 247]
    assert d.view(U8)[0, :4].tolist() == [0x7E, 0xFE, 0x38, 0x38]
    assert d.view(U8)[1, :2].tolist() == [0x78, 0x70]  # 256 = 2^8 -> exp 15 -> 0x78; 128 -> 0x70


# ------------------------------------------------------------------------------------------------ triton vs reference
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_rows_and_cols_match_reference(dtype):
    from kernels.mxfp8 import triton as tk
    for name, x in make_cases(dtype).items():
        for src, dim in ((x, -1), (x, 0), (x.t().contiguous(), 0)):
            want = ref.to_mxfp8_reference(src, dim)
            got = tk.to_mxfp8_triton(src, dim)
            assert_bytes_equal(got[0], want[0], f"{dtype} {name} dim={dim} data")
            assert_bytes_equal(got[1], want[1], f"{dtype} {name} dim={dim} scale")
        got = mx.to_mxfp8(x, -1, backend="triton")  # through the custom op
        assert_bytes_equal(got[0], ref.to_mxfp8_reference(x, -1)[0], f"{dtype} {name} op data")


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_rowcol_matches_reference(dtype):
    for name, x in make_cases(dtype).items():
        for xx in (x, x.t().contiguous()):  # boundary blocks along K, then along M
            for col_t in (True, False):
                want = ref.to_mxfp8_rowcol_reference(xx, col_t)
                got = mx.to_mxfp8_rowcol(xx, col_transposed=col_t, backend="triton")
                for g, w, what in zip(got, want, ("data_row", "scale_row", "data_col", "scale_col")):
                    assert_bytes_equal(g, w, f"{dtype} {name} col_t={col_t} {what}")
    # the column copy is the dim-0 quantization, transposed or not
    x = make_cases(torch.bfloat16)["random"]
    _, _, dc, sc = ref.to_mxfp8_rowcol_reference(x, True)
    d0, s0 = ref.to_mxfp8_reference(x, 0)
    assert_bytes_equal(dc.t(), d0, "col_t data vs dim 0")
    assert_bytes_equal(sc.t(), s0, "col_t scale vs dim 0")


# Row+col kernel options the sweep tries (benchmarks/mxfp8_quant_sweep.py), each of which the autotuner may
# come to pick: tiles taller than the input (partial row tiles), the transposed-input column path, TMA
# descriptor stores (clipped tails), grouped tile order with a partial last group, streaming stores and
# evict-first loads. Each changes code paths, none may change a byte.
_ROWCOL_OPTION_CONFIGS = [
    (dict(BLOCK_M=128, BLOCK_K=32, K_FAST=True), 2),
    (dict(BLOCK_M=64, BLOCK_K=64, K_FAST=True, TRANS_X=True, STREAM=True, EVICT_FIRST=True), 2),
    (dict(BLOCK_M=64, BLOCK_K=32, K_FAST=True, TRANS_X=True, TMA=True, GROUP_M=2), 2),
    (dict(BLOCK_M=32, BLOCK_K=64, K_FAST=True, TMA=True), 1),
    (dict(BLOCK_M=64, BLOCK_K=64, K_FAST=False, GROUP_M=3), 2),
]


@pytest.mark.parametrize("cfg", _ROWCOL_OPTION_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c[0].items()))
def test_triton_rowcol_options_match_reference(cfg):
    from kernels.mxfp8 import triton as tk
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(32 * 5, 32 * 3, generator=gen)
         * 2.0 ** torch.randint(-40, 40, (32 * 5, 1), generator=gen)).to(torch.bfloat16)
    x[5, 17] = float("nan")
    x[100, 40] = float("-inf")
    x[64:96, :32] = 1e-39  # bf16 subnormals
    x[128:160, 64:] = 0
    for col_t in (True, False):
        want = ref.to_mxfp8_rowcol_reference(x, col_t)
        got = tk.to_mxfp8_rowcol(x, col_t, config=cfg)
        for g, w, what in zip(got, want, ("data_row", "scale_row", "data_col", "scale_col")):
            assert_bytes_equal(g, w, f"rowcol {cfg} col_t={col_t} {what}")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_triton_expert_weights_and_nd(dtype):
    from kernels.mxfp8 import triton as tk
    for name in ("boundary", "random", "nonfinite", "subnormal", "huge"):
        x = make_cases(dtype)[name][:64]
        w = x.reshape(2, 32, 128)  # [E, N, K]
        for dim in (-1, 2, -2, 1):
            want = ref.to_mxfp8_reference(w, dim)
            got = mx.to_mxfp8_expert_weights(w, dim, backend="triton")
            assert_bytes_equal(got[0], want[0], f"{name} experts dim={dim} data")
            assert_bytes_equal(got[1], want[1], f"{name} experts dim={dim} scale")
            assert got[1].shape == ref.scale_shape(w.shape, dim % 3)
        x4 = x.reshape(2, 32, 4, 32)  # 4-D, every dim divisible by 32 except dim 2
        for dim in (0, 1, 3, -1):
            if x4.shape[dim] % 32:
                continue
            want = ref.to_mxfp8_reference(x4, dim)
            got = tk.to_mxfp8_triton(x4, dim)
            assert_bytes_equal(got[0], want[0], f"{name} 4-D dim={dim} data")
            assert_bytes_equal(got[1], want[1], f"{name} 4-D dim={dim} scale")
        nc = x[:, :64]  # non-contiguous input
        assert_bytes_equal(tk.to_mxfp8_triton(nc, -1)[0], ref.to_mxfp8_reference(nc, -1)[0], "non-contiguous")


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiles32_reference_oracle_and_triton(dtype):
    for name, w in tile_cases(dtype).items():
        d, sk, sn = ref.to_mxfp8_tiles32_reference(w)
        od, ost = oracle_tiles(w)
        assert_bytes_equal(d, od, f"{dtype} {name} tile data vs oracle")
        assert_bytes_equal(sk, ost.repeat_interleave(32, 0), f"{dtype} {name} scale_k vs oracle")
        assert_bytes_equal(sn, ost.repeat_interleave(32, 1), f"{dtype} {name} scale_n vs oracle")
        # a plain MXFP8 tensor both ways: decoding with either scale gives the same numbers
        a = mx.from_mxfp8(d, sk, -1)
        b = mx.from_mxfp8(d, sn, 0)
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        w3 = w.reshape(2, w.shape[0] // 2, w.shape[1])
        if w3.shape[1] % 32 == 0:
            got = mx.to_mxfp8_tiles32(w3, backend="triton")
            want = ref.to_mxfp8_tiles32_reference(w3)
            for g, wt, what in zip(got, want, ("data", "scale_k", "scale_n")):
                assert_bytes_equal(g, wt, f"{dtype} {name} tiles 3-D {what}")
        got = mx.to_mxfp8_tiles32(w, backend="triton")
        for g, wt, what in zip(got, (d, sk, sn), ("data", "scale_k", "scale_n")):
            assert_bytes_equal(g, wt, f"{dtype} {name} tiles 2-D {what}")


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_triton_float_amax_path(dtype, monkeypatch):
    """Compiled kernels take the block max with a NaN-propagating float max of |x|; the interpreter normally
    takes the integer max of the magnitude bits (faster there). Run the float path here too, on the cases
    where the two could differ (NaN/inf, subnormals, signed zeros), every kernel."""
    import triton.language as tl

    from kernels.mxfp8 import triton as tk
    monkeypatch.setattr(tk, "_AMAX_ON_INT_BITS", tl.constexpr(False))
    cases = make_cases(dtype)
    for name in ("nonfinite", "subnormal", "zeros"):
        x = cases[name]
        for dim in (-1, 0):
            want = ref.to_mxfp8_reference(x, dim)
            got = tk.to_mxfp8_triton(x, dim)
            assert_bytes_equal(got[0], want[0], f"float amax {dtype} {name} dim={dim} data")
            assert_bytes_equal(got[1], want[1], f"float amax {dtype} {name} dim={dim} scale")
        for col_t in (True, False):
            for g, w, what in zip(tk.to_mxfp8_rowcol(x, col_t), ref.to_mxfp8_rowcol_reference(x, col_t),
                                  ("data_row", "scale_row", "data_col", "scale_col")):
                assert_bytes_equal(g, w, f"float amax {dtype} {name} rowcol col_t={col_t} {what}")
        w = x[:64]
        for g, wt, what in zip(tk.to_mxfp8_tiles32_triton(w), ref.to_mxfp8_tiles32_reference(w),
                               ("data", "scale_k", "scale_n")):
            assert_bytes_equal(g, wt, f"float amax {dtype} {name} tiles {what}")


def test_triton_integer_rounding_on_all_fp32_midpoints():
    """The integer e4m3 rounding (the interpreter path) on every e4m3 midpoint, 1 fp32 ulp either side, and
    the grid points themselves, at scale e = 0 (amax 448 in each block)."""
    from kernels.mxfp8 import triton as tk
    mids = np.array([float((_E4M3_VALUES[i] + _E4M3_VALUES[i + 1]) / 2) for i in range(126)], np.float32)
    vals = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1000)),
                           np.array([float(v) for v in _E4M3_VALUES], np.float32)])
    vals = np.concatenate([vals, -vals])
    vals = np.concatenate([vals, np.zeros(-len(vals) % 31, np.float32)]).reshape(-1, 31)
    x = torch.from_numpy(np.concatenate([vals, np.full((len(vals), 1), 448.0, np.float32)], 1))
    got = tk.to_mxfp8_triton(x, -1, hw_cast=False)
    od, os_ = oracle_rows(x)
    assert_bytes_equal(got[1], os_, "midpoints scale")
    assert_bytes_equal(got[0], od, "midpoints data")


# ------------------------------------------------------------------------------------------------ decode
def test_e8m0_to_fp32_all_bytes():
    f = ref.e8m0_to_fp32(torch.arange(256, dtype=torch.int64).to(U8))
    for b in range(255):
        assert f[b].item() == math.ldexp(1.0, b - 127), b
    assert math.isnan(f[255].item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_roundtrip_error_bounds(dtype):
    """Decoded values: relative error <= 2^-4 where V * 2^-e is in e4m3's normal range (>= 2^-6), absolute
    error <= 2^(e-10) below it; NaN blocks decode to NaN; decoding equals the oracle's float64 decode."""
    cases = make_cases(dtype)
    for name in ("random", "boundary", "ties", "subnormal", "nonfinite"):
        x = cases[name]
        d, s = mx.to_mxfp8(x, -1, backend="reference")
        y = mx.from_mxfp8(d, s, -1, torch.float32).double()
        xd = x.double()
        e = s.to(torch.int64) - 127
        scale = torch.pow(2.0, e.double()).repeat_interleave(32, -1)
        bad = (s == 255).repeat_interleave(32, -1)
        assert torch.isnan(y[bad]).all(), name
        ok = ~bad
        big = ok & (xd.abs() >= scale * 2.0 ** -6) & (xd.abs() <= 448 * scale)
        rel = ((y - xd).abs() / xd.abs())[big]
        assert rel.numel() == 0 or rel.max().item() <= 2.0 ** -4, f"{dtype} {name}: rel {rel.max().item()}"
        small = ok & ~big
        err = (y - xd).abs()[small]
        assert err.numel() == 0 or (err <= scale[small] * 2.0 ** -10 * (1 + 1e-12)).all(), f"{dtype} {name}"
        # decode == float64 decode of the bytes (exact except fp32 subnormal results, rounded once)
        vals = torch.tensor([float(_E4M3_VALUES[c & 0x7F]) * (-1 if c & 0x80 else 1) if (c & 0x7F) != 0x7F
                             else math.nan for c in d.view(U8).reshape(-1).tolist()], dtype=torch.float64)
        want = (vals.reshape(x.shape) * scale).to(torch.float32)
        assert torch.equal(want.isnan(), y.isnan()) and torch.equal(want.nan_to_num(), y.float().nan_to_num())
    # bf16 output path
    x = cases["random"]
    d, s = mx.to_mxfp8(x)
    assert mx.from_mxfp8(d, s, -1, torch.bfloat16).dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------------ errors / plumbing
@pytest.mark.parametrize("backend", ("reference", "triton"))
def test_bad_shape_and_dtype_errors(backend):
    with pytest.raises(ValueError, match=r"x\.shape\[-1\] = 48 is not a multiple of 32"):
        mx.to_mxfp8(torch.randn(4, 48), -1, backend=backend)
    with pytest.raises(ValueError, match=r"x\.shape\[0\] = 4 is not a multiple of 32"):
        mx.to_mxfp8(torch.randn(4, 64), 0, backend=backend)
    with pytest.raises(TypeError, match="torch.int32"):
        mx.to_mxfp8(torch.zeros(4, 64, dtype=torch.int32), backend=backend)
    with pytest.raises(TypeError, match="torch.float64"):
        mx.to_mxfp8(torch.zeros(4, 64, dtype=torch.float64), backend=backend)
    with pytest.raises(ValueError, match="dim=2 is out of range"):
        mx.to_mxfp8(torch.zeros(4, 64), 2, backend=backend)
    with pytest.raises(ValueError, match=r"x\.shape\[0\] = 40"):
        mx.to_mxfp8_rowcol(torch.zeros(40, 64), backend=backend)
    with pytest.raises(ValueError, match="2-D"):
        mx.to_mxfp8_rowcol(torch.zeros(2, 32, 64), backend=backend)
    with pytest.raises(ValueError, match=r"w\.shape\[-2\] = 48"):
        mx.to_mxfp8_tiles32(torch.zeros(2, 48, 64), backend=backend)
    with pytest.raises(ValueError, match="across experts"):
        mx.to_mxfp8_expert_weights(torch.zeros(32, 32, 64), 0, backend=backend)
    with pytest.raises(ValueError, match="backend='cuda'"):
        mx.to_mxfp8(torch.zeros(4, 64), backend="cuda")


def test_from_mxfp8_errors():
    d, s = mx.to_mxfp8(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"scale\.shape is \(4, 1\)"):
        mx.from_mxfp8(d, s[:, :1])
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        mx.from_mxfp8(d.view(U8), s)
    with pytest.raises(TypeError, match="uint8"):
        mx.from_mxfp8(d, s.float())


def test_custom_ops_and_compile():
    x = make_cases(torch.bfloat16)["random"]
    for op, args in ((torch.ops.titan_fp8.to_mxfp8.default, (x, 1)),
                     (torch.ops.titan_fp8.to_mxfp8.default, (x, 0)),
                     (torch.ops.titan_fp8.to_mxfp8_rowcol.default, (x, True)),
                     (torch.ops.titan_fp8.to_mxfp8_tiles32.default, (x.reshape(2, 32, 128),))):
        res = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in res.values()), res
    f = torch.compile(lambda t: mx.to_mxfp8_rowcol(t, backend="triton"), backend="aot_eager", fullgraph=True)
    got = f(x)
    want = ref.to_mxfp8_rowcol_reference(x)
    for g, w in zip(got, want):
        assert_bytes_equal(g, w, "compiled rowcol")


def test_outputs_never_require_grad():
    x = torch.randn(64, 64, requires_grad=True)
    for backend in ("reference", "triton"):
        outs = (*mx.to_mxfp8(x, backend=backend), *mx.to_mxfp8_rowcol(x, backend=backend),
                *mx.to_mxfp8_tiles32(x, backend=backend))
        assert not any(t.requires_grad for t in outs), backend


def test_empty_tensor():
    for backend in ("reference", "triton"):
        d, s = mx.to_mxfp8(torch.zeros(0, 64), backend=backend)
        assert d.shape == (0, 64) and s.shape == (0, 2)
        d, s = mx.to_mxfp8(torch.zeros(0, 64), 1, backend=backend)
        assert s.shape == (0, 2)
