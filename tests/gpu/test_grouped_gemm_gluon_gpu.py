"""Gluon MXFP8 grouped GEMMs (backend="gluon": true 1x32 activation/gradient scales, 128x128-tiled weight /
128-row-tiled x^T) on an sm_90 GPU against the float64 references.

Skips without an sm_90 GPU. Group sizes 0, 1, 31, 33, 127, 129 and uneven ones; NaN/inf blocks in real rows;
padding rows poisoned with NaN (must come out as zeros in fprop/dgrad and never leak into real rows); outputs
pre-poisoned by the allocator (torch.empty after filling the cache with NaN) so unwritten rows would show.
Every kernel schedule (MODE 0/1/2) is checked, not just the default one.
"""
import pytest
import torch

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                                reason="needs an sm_90 GPU")

from grouped_gemm_gpu_helpers import (SIZES, TOL_BF16, check_fprop_output, check_special_vs_reference, dgrad_operands,
                                      group_offs, nt_operands, poison_allocator, quant, rel, special_scale_operands,
                                      special_scales)
# (BM|BN, 128, STAGES, GROUP, MODE, U, SUBK, num_warps[, WS[, PERSIST]]): the default (MODE 5, persistent; wgrad
# MODE 10 U = 16 WS=1); the wait-every-wgmma schedule; 8-warp consumer + TMA warp; two 4-warp consumers + TMA
# warp (reused partial registers); 64-row tiles
# on one warpgroup; fresh partials with 2-step stages and 3 stages (no warp specialization); MODE 4 (MODE 2's
# loop, one int32 of scales per row and stage) with two 4-warp consumers, U = 8 and 4, on the plain and the
# persistent grid; MODE 3 (static ring) with two 4-warp consumers on the persistent grid (K = 512: whole MODE 3
# blocks, persistent; K = 640: plain grid); MODE 4 persistent with U = 16 and with 5 stages. Scale rows of 33
# bytes (K = 1056) make MODE 3/4 fall back to MODE 2. wgrad: the old default (WS=1 MODE 1) is the last entry.
M4_WS2 = (128, 128, 4, 8, 4, 8, 4, 4, 2)
M4_U4 = (128, 128, 4, 8, 4, 4, 4, 4, 2)
M4_PERSIST = (128, 128, 4, 8, 4, 8, 4, 4, 2, 1)
M3_PERSIST = (128, 128, 4, 8, 3, 16, 4, 4, 2, 1)
M4_U16_PERSIST = (128, 128, 4, 8, 4, 16, 4, 4, 2, 1)
M4_S5_PERSIST = (128, 128, 5, 8, 4, 8, 4, 4, 2, 1)
OLD_DEFAULT = (128, 128, 4, 8, 2, 8, 4, 4, 2)  # the default before MODE 4
WG2_M2 = (128, 128, 4, 8, 2, 8, 4, 4, 2)
# candidates of 2026-11-25 (CPU-prepared, first GPU run next session): MODE 5 (MODE 4 + stage-wise E8M0 decode,
# one PRMT per step) with two 4-warp consumers, persistent and plain; one 8-warp consumer (WS=1: both warpgroups
# run one copy of the mainloop) on the persistent grid with MODE 5 U = 8 and 16 and MODE 6 (static ring + the new
# decode; K = 512 persistent, K = 640 and 1056 plain grid / MODE 2 fallback), MODE 6 WS=1 on the plain grid
M5_PERSIST = (128, 128, 4, 8, 5, 8, 4, 4, 2, 1)
M5_WS2 = (128, 128, 4, 8, 5, 8, 4, 4, 2)
M5_W1_PERSIST = (128, 128, 4, 8, 5, 8, 4, 8, 1, 1)
M5_W1_U16_PERSIST = (128, 128, 4, 8, 5, 16, 4, 8, 1, 1)
M6_W1_PERSIST = (128, 128, 4, 8, 6, 16, 4, 8, 1, 1)
M6_W1 = (128, 128, 4, 8, 6, 16, 4, 8, 1)
# MODE 10 (session 24): A's factors as fp32 through shared memory with each TMA stage (e8m0_table)
M10_PERSIST = (128, 128, 4, 8, 10, 8, 4, 4, 2, 1)
M10_WGRAD = (128, 128, 4, 8, 10, 16, 4, 8, 1)
# MODE 11 = MODE 6 (static ring) with MODE 10's factors, one 8-warp consumer, persistent (session 25: any K, each
# tile's last ring round padded with empty stages)
M11_W1_PERSIST = (128, 128, 4, 8, 11, 16, 4, 8, 1, 1)
M10_W1_PERSIST = (128, 128, 4, 8, 10, 8, 4, 8, 1, 1)
# MODE 12 = MODE 11 with B's factors as fp32 from a [tiles, steps] table (session 25)
M12_PERSIST = (128, 128, 4, 8, 12, 16, 4, 8, 1, 1)
M12_WGRAD = (128, 128, 4, 8, 12, 16, 4, 8, 1)
# session 27: MODE 12 with the epilogue in a 2-warp storer partition (11th entry)
M12_EPI = M12_PERSIST + (1,)
NEW_NT = [M5_PERSIST, M5_WS2, M5_W1_PERSIST, M5_W1_U16_PERSIST, M6_W1_PERSIST, M6_W1, M10_PERSIST, M10_W1_PERSIST,
          M12_PERSIST, M12_EPI]
# session 25: wgrad MODE 11 (static ring: 16-step blocks, then 2-stage blocks on dynamic slots), also with five
# ring stages (20-step static blocks)
M11_S5 = (128, 128, 5, 8, 11, 16, 4, 8, 1)
# session 26: MODE 12 wgrad on the persistent grid, tiles taken from a queue
M12_WGRAD_PERSIST = M12_WGRAD + (1,)
NEW_WGRAD = [(128, 128, 4, 8, 5, 8, 4, 4, 2), (128, 128, 4, 8, 5, 8, 4, 8, 1), (128, 128, 4, 8, 5, 16, 4, 8, 1),
             M10_WGRAD, (128, 128, 4, 8, 11, 16, 4, 8, 1), M11_S5, M12_WGRAD, M12_WGRAD_PERSIST]
NT_CONFIGS = [None, (128, 128, 4, 8, 0, 8, 4, 8), (128, 128, 4, 8, 1, 8, 4, 8, 1), (128, 128, 4, 8, 2, 8, 4, 4, 2),
              (64, 128, 4, 8, 2, 8, 4, 4), (128, 128, 3, 8, 1, 4, 2, 8), M4_WS2, M4_U4, M4_PERSIST, M3_PERSIST,
              M4_U16_PERSIST, M4_S5_PERSIST] + NEW_NT
# wgrad: also two 4-warp consumers (WS=2) with MODE 2 and MODE 4 (U = 8 and 4; word scales funnel-shifted: a
# group starts at any 32-token step)
WGRAD_CONFIGS = [None, (128, 128, 4, 8, 0, 8, 4, 8), (128, 128, 4, 8, 2, 8, 4, 8, 1), (64, 128, 4, 8, 2, 8, 4, 4),
                 (128, 128, 3, 8, 1, 4, 2, 8), WG2_M2, M4_WS2, M4_U4, (128, 128, 4, 8, 1, 8, 4, 8, 1)] + NEW_WGRAD


TOL_WGRAD_F32 = 5e-4  # fp32 dW per group against the float64 reference (the fp8 wgmma's own accumulation)


def check_wgrad_groups(out, ref, sizes):
    """Every non-empty group's fp32 dW within TOL_WGRAD_F32 of the float64 reference; empty groups exactly zero."""
    for e, n in enumerate(sizes):
        if n:
            assert rel(out[e], ref[e]) < TOL_WGRAD_F32, (e, rel(out[e], ref[e]))
        else:
            assert torch.equal(out[e], torch.zeros_like(out[e])), e


def _cid(c):
    """Test ids that name the config (select with -k, e.g. -k "c128_128_4_8_5 or c128_128_4_8_6 or new")."""
    return "default" if c is None else "c" + "_".join(map(str, c))


@pytest.mark.parametrize("config", NT_CONFIGS, ids=_cid)
@pytest.mark.parametrize("K,N", [(512, 384), (1056, 256), (640, 128)])
def test_gluon_fprop_dgrad(config, K, N):
    from kernels.grouped_gemm import grouped_mm_dgrad_reference, grouped_mm_fprop_reference
    from kernels.grouped_gemm.gluon_mx import launch_nt
    o = nt_operands(K, N)
    offs, pad = o["offs"], o["pad"]
    poison_allocator()
    out = launch_nt(o["ad"], o["as_"], o["wd"], o["ws"], offs, torch.bfloat16, config)
    ref = grouped_mm_fprop_reference(o["ad"], o["as_"], o["wd"], o["ws"], offs, out_dtype=torch.float64)
    check_fprop_output(out, o, ref, TOL_BF16)
    # dgrad: dO [M, N] scaled along N; W^T quantized as the autograd op does (contiguous [E, K, N], 128x128)
    dd, ds = dgrad_operands(o["M"], N, pad)
    poison_allocator()
    dx = launch_nt(dd, ds, o["wtd"], o["wts"], offs, torch.bfloat16, config)
    refd = grouped_mm_dgrad_reference(dd, ds, o["wtd"].transpose(1, 2), o["wts"].transpose(1, 2), offs,
                                      out_dtype=torch.float64)
    assert torch.equal(dx[-pad:], torch.zeros_like(dx[-pad:]))
    assert rel(dx[:-pad], refd[:-pad]) < TOL_BF16


def test_gluon_public_api_matches_triton_backend():
    """Through the public ops (custom ops, validation) the two backends give the same numbers up to fp32
    summation order (the Triton path promotes in the same order: equal here up to rounding)."""
    from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad
    torch.manual_seed(3)
    sizes = [300, 0, 777, 45]
    offs = group_offs(sizes)
    M, K, N = 1216, 768, 512  # 94 padding rows; wgrad needs M % 32 == 0
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(len(sizes), N, K, device="cuda") * 0.02
    ad, as_ = quant(x, (32, 1))
    wd, ws = quant(w, (32, 128))
    o = {b: mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=32, w_tile=128, backend=b)
         for b in ("triton", "gluon")}
    assert rel(o["gluon"], o["triton"]) < 1e-3
    do = torch.randn(M, N, device="cuda")
    dd, ds = quant(do, (32, 1))
    wtd, wts = quant(w.transpose(1, 2).contiguous(), (32, 128))
    d = {b: mxfp8_grouped_mm_dgrad(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs, block=32, w_tile=128,
                                   backend=b) for b in ("triton", "gluon")}
    assert rel(d["gluon"], d["triton"]) < 1e-3
    dt, dts = quant(do.t(), (32, 1))
    xt, xts = quant(x.t(), (32, 128))
    g = {b: mxfp8_grouped_mm_wgrad(dt, dts, xt, xts, offs, block=32, a_tile=128, backend=b)
         for b in ("triton", "gluon")}
    assert rel(g["gluon"], g["triton"]) < 1e-4


@pytest.mark.parametrize("config", WGRAD_CONFIGS, ids=_cid)
@pytest.mark.parametrize("tail", [64, 32])
def test_gluon_wgrad(config, tail):
    from kernels.grouped_gemm import grouped_mm_wgrad_reference
    from kernels.grouped_gemm.gluon_mx import launch_wgrad
    torch.manual_seed(1)
    K, N = 640, 384
    cfg = config  # (BN, BK, ...): BN 64 or 128 rows of dO^T, BK 128 rows of x^T
    offs = group_offs(SIZES)
    real = (sum(SIZES) + 31) // 32 * 32  # NaN only in whole 32-token blocks past offs[-1]
    M = real + tail  # tail 64: M/32 = 120, 4-byte scale rows (MODE 3's word path); 32: 119 (MODE 3 falls back)
    x = torch.randn(M, K, device="cuda")
    do = torch.randn(M, N, device="cuda")
    x[real:] = float("nan")
    do[real:] = float("nan")
    xt, xs = quant(x.t(), (32, 128))
    dt, ds = quant(do.t(), (32, 1))
    poison_allocator()
    out = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, cfg)
    ref = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    assert torch.isfinite(out).all()
    check_wgrad_groups(out, ref, SIZES)  # SIZES[0] is the empty group
    out16 = launch_wgrad(dt, ds, xt, xs, offs, torch.bfloat16, cfg)
    assert rel(out16[1:], ref[1:]) < TOL_BF16


def test_experts_op_routes_to_gluon():
    """titan_fp8.float8.experts.mxfp8_grouped_mm(..., backend="gluon") (quantization + the three GEMMs, autograd)
    equals the Triton backend's op up to fp32 summation order. (Imported as a package module: experts.py now
    imports its siblings relatively, so loading it from its file fails.)"""
    from titan_fp8.float8 import experts as mod
    torch.manual_seed(4)
    sizes = [300, 0, 777, 45]
    offs = group_offs(sizes)
    x = torch.randn(sum(sizes) + 50, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(len(sizes), 768, 512, device="cuda", dtype=torch.bfloat16) * 0.02
    go = torch.randn(x.shape[0], 768, device="cuda", dtype=torch.bfloat16)
    res = {}
    for b in ("triton", "gluon"):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = mod.mxfp8_grouped_mm(xr, wr, offs, granularity="mx32", backend=b)
        out.backward(go)
        res[b] = (out, xr.grad, wr.grad)
    for a, t in zip(res["gluon"], res["triton"]):
        assert torch.isfinite(a).all() and rel(a, t) < 2e-3


@pytest.mark.parametrize("config", NEW_NT, ids=_cid)
@pytest.mark.parametrize("K", [512, 640])
def test_new_nt_configs_bit_exact_with_special_scales(config, K):
    """The new configs compute the same factors (exact E8M0 decode, 0 -> 2^-127, 255 -> NaN) and promote in the
    same order as the default: outputs equal bit for bit (NaN where the default has NaN), with E8M0 0/1/254/255
    in every byte position of the activation words and 0/254/255 weight-tile scales; finite rows also match the
    float64 reference."""
    from kernels.grouped_gemm.gluon_mx import launch_nt
    ad, as_, wd, ws, offs = special_scale_operands(K)
    ref = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, M4_PERSIST)
    poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, config)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    check_special_vs_reference(out, ad, as_, wd, ws, offs)


@pytest.mark.parametrize("config", NEW_WGRAD, ids=_cid)
@pytest.mark.parametrize("tail", [64, 32])
def test_new_wgrad_configs_bit_exact_with_special_scales(config, tail):
    from kernels.grouped_gemm.gluon_mx import launch_wgrad
    torch.manual_seed(6)
    K, N = 256, 384
    offs = group_offs(SIZES)
    real = (sum(SIZES) + 31) // 32 * 32
    M = real + tail
    x = torch.randn(M, K, device="cuda")
    do = torch.randn(M, N, device="cuda")
    xt, xs = quant(x.t(), (32, 128))
    dt, ds = quant(do.t(), (32, 1))
    special_scales(ds, list(range(0, 24)), 0)
    special_scales(ds, list(range(100, 120)), 36)   # tokens 1152-1279 (groups 6/7 boundary region)
    special_scales(ds, list(range(200, 210)), 61)   # unaligned start: funnel-shifted words
    xs[0:128, 40] = 0
    xs[128:256, 70] = 255
    ref = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M4_WS2)
    poison_allocator()
    out = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, config)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("seed", range(4))
def test_e8m0_group_table_puts_every_group_on_an_aligned_column(seed):
    """MODE 10's wgrad factor table: group e's full 32-token steps sit at columns shifted by pad[e], the first one
    on a multiple of 4 (a TMA box needs a 16-byte start), the groups' columns in order and disjoint, the factors
    bit for bit e8m0_table's (0 -> 2^-127, 255 -> NaN). Awkward sizes: 0, 1, 31, 33, unaligned starts."""
    import random

    from kernels.grouped_gemm.gluon_mx import e8m0_group_table, e8m0_table
    rnd = random.Random(seed)
    sizes = [rnd.choice([0, 1, 31, 33, 64, 100, 128, 500, 1000, 4096]) for _ in range(rnd.choice([1, 3, 8, 17]))]
    M = sum(sizes) + rnd.choice([0, 17, 64])
    offs = group_offs(sizes)
    s = torch.randint(0, 256, (300, M // 32 + 3), dtype=torch.uint8, device="cuda")[:, 1:M // 32 + 1]
    table, pad = e8m0_group_table(s, offs, M)
    ref = e8m0_table(s)
    hi = -1
    for e in range(len(sizes)):
        end = min(int(offs[e]), M)
        start = min(int(offs[e - 1]) if e else 0, end)
        first, last, p = (start + 31) // 32, end // 32, int(pad[e])
        if last > first:
            assert (first + p) % 4 == 0 and first + p > hi, (e, first, p)
            torch.testing.assert_close(table[:, first + p:last + p], ref[:, first:last], rtol=0, atol=0,
                                       equal_nan=True)
            hi = last + p - 1


@pytest.mark.parametrize("K", [512, 1024])
def test_mode11_candidate_bit_exact_with_special_scales(K):
    """MODE 11 (static ring + factors through shared memory, one 8-warp consumer, persistent) equals MODE 4 bit for
    bit with the special E8M0 bytes, as the other new configs do (other K: the persistent test below)."""
    test_new_nt_configs_bit_exact_with_special_scales(M11_W1_PERSIST, K)


@pytest.mark.parametrize("config", [M11_W1_PERSIST, M6_W1_PERSIST, M3_PERSIST, M11_S5 + (1,), M12_PERSIST, M12_EPI],
                         ids=_cid)
@pytest.mark.parametrize("K", [640, 768, 2816])
def test_static_ring_persistent_at_any_k_bit_exact(config, K):
    """Static ring slots on the persistent grid at K without whole ring rounds (20, 24 and 88 steps of 32: a
    synchronous last stage, a 2-stage block on dynamic slots, both after whole rounds) and N = 2048 (256 tiles on
    132 SMs: CTAs run on into a second tile, after the producer padded the first tile's last round with empty
    stages): bit for bit MODE 4's output (whose dynamic ring needs no padding), finite rows within the float64
    reference's tolerance."""
    from kernels.grouped_gemm.gluon_mx import launch_nt
    ad, as_, wd, ws, offs = special_scale_operands(K, N=2048)
    ref = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, M4_PERSIST)
    poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, config)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    check_special_vs_reference(out, ad, as_, wd, ws, offs)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_storer_partition_bit_exact_over_many_tiles(out_dtype):
    """The epilogue in the storer partition (one shared buffer, handed over by two mbarriers) writes what the
    consumer's own stores write, bit for bit, when every CTA runs several tiles (N = 2048, 88 steps; tiles of
    groups that end inside them, an empty group, padding rows zeroed), in bf16 and fp32."""
    from kernels.grouped_gemm.gluon_mx import launch_nt
    ad, as_, wd, ws, offs = special_scale_operands(2816, N=2048)
    ref = launch_nt(ad, as_, wd, ws, offs, out_dtype, M12_PERSIST)
    poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, out_dtype, M12_EPI)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    check_special_vs_reference(out.to(torch.bfloat16), ad, as_, wd, ws, offs)
    # ~5 tiles per CTA (the buffer's phase wraps), uneven groups, 70 padding rows
    torch.manual_seed(11)
    offs = group_offs([0, 1000, 33, 2047, 129, 0, 700, 31])
    M = int(offs[-1]) + 70
    ad, as_ = quant(torch.randn(M, 640, device="cuda"), (32, 1))
    wd, ws = quant(torch.randn(8, 2048, 640, device="cuda") * 0.02, (32, 128))
    ref = launch_nt(ad, as_, wd, ws, offs, out_dtype, M12_PERSIST)
    poison_allocator()
    out = launch_nt(ad, as_, wd, ws, offs, out_dtype, M12_EPI)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert torch.equal(out[-70:], torch.zeros_like(out[-70:]))


def test_storer_partition_needs_one_consumer_on_the_persistent_grid():
    from kernels.grouped_gemm.gluon_mx import launch_nt
    ad, as_, wd, ws, offs = special_scale_operands(512)
    with pytest.raises(ValueError, match="storer partition .*11th config entry"):
        launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, M5_PERSIST + (1,))


@pytest.mark.parametrize("M", [992, 8288])
def test_dense_one_group(M):
    """The dense case (the shape of a Linear): one group over all M rows (E = 1, offs = [M], M a multiple of 32 but
    not of the 128-row tile, so the last tile is partial) through the public ops with backend="gluon": fprop,
    dgrad (bf16) and wgrad (fp32 dW) within the float64 references' tolerances, with a NaN block and a zero block
    in x."""
    from kernels.grouped_gemm import (grouped_mm_dgrad_reference, grouped_mm_fprop_reference,
                                      grouped_mm_wgrad_reference, mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop,
                                      mxfp8_grouped_mm_wgrad)
    torch.manual_seed(21)
    K, N = 640, 384
    offs = torch.tensor([M], dtype=torch.int32, device="cuda")
    x = torch.randn(M, K, device="cuda")
    x[17, 40] = float("nan")  # one 1x32 block of row 17: that row of y is NaN
    x[500, 64:96] = 0
    w = torch.randn(1, N, K, device="cuda") * 0.02
    do = torch.randn(M, N, device="cuda")
    ad, as_ = quant(x, (32, 1))
    wd, ws = quant(w, (32, 128))
    poison_allocator()
    y = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=32, w_tile=128, backend="gluon")
    ref = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    assert y.shape == (M, N) and torch.isnan(y[17]).all()
    fin = torch.isfinite(ref).all(-1)
    assert fin.sum() == M - 1 and rel(y[fin], ref[fin]) < TOL_BF16
    dd, ds = quant(do, (32, 1))
    wtd, wts = quant(w.transpose(1, 2).contiguous(), (32, 128))
    dx = mxfp8_grouped_mm_dgrad(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs, block=32, w_tile=128,
                                backend="gluon")
    refd = grouped_mm_dgrad_reference(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs,
                                      out_dtype=torch.float64)
    assert dx.shape == (M, K) and rel(dx, refd) < TOL_BF16
    x[17, 40] = 0.0
    dt, dts = quant(do.t(), (32, 1))
    xt, xts = quant(x.t(), (32, 128))
    g = mxfp8_grouped_mm_wgrad(dt, dts, xt, xts, offs, block=32, a_tile=128, backend="gluon")
    refg = grouped_mm_wgrad_reference(dt, dts, xt, xts, offs, out_dtype=torch.float64)
    assert g.shape == (1, N, K)
    check_wgrad_groups(g, refg, [M])


def test_mode11_needs_the_persistent_grid():
    from kernels.grouped_gemm.gluon_mx import launch_nt
    ad, as_, wd, ws, offs = special_scale_operands(512)
    with pytest.raises(ValueError, match="MODE 11 .*persistent grid only.*10th entry"):
        launch_nt(ad, as_, wd, ws, offs, torch.bfloat16, M11_W1_PERSIST[:9])



def test_wgrad_refuses_a_persistent_config_other_than_mode_12():
    from kernels.grouped_gemm.gluon_mx import launch_wgrad
    offs = group_offs([64, 64])
    xt, xs = quant(torch.randn(128, 128, device="cuda").t(), (32, 128))
    dt, ds = quant(torch.randn(128, 128, device="cuda").t(), (32, 1))
    with pytest.raises(ValueError, match="persistent wgrad grid .*runs MODE 12"):
        launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M10_WGRAD + (1,))


# groups that start and end inside one 32-token block ([5, 15), [72, 75)), cut at the start only, at the end only,
# at both ends, an empty one; every group but the empty one shares a block with a neighbour
BLOCK_SIZES = [5, 10, 17, 0, 40, 3, 90, 35]


@pytest.mark.parametrize("config", [None, M12_WGRAD, M12_WGRAD_PERSIST, M10_WGRAD, M4_WS2,
                                    (128, 128, 4, 8, 2, 8, 4, 8, 1), (128, 128, 4, 8, 0, 8, 4, 8)], ids=_cid)
def test_wgrad_boundary_blocks(config):
    """The boundary blocks (both loaded before the mainloop; with MODE 12 in the consumer partition while the TMA
    warp fills the ring) sum only their group's tokens: each group within 5e-4 of the float64 reference (fp32
    dW), with a huge and a tiny block scale in shared blocks; and the default and MODE 10/12 equal WS=2 MODE 4 bit
    for bit (one summation order: the head block, the tail block, then the mainloop)."""
    from kernels.grouped_gemm import grouped_mm_wgrad_reference
    from kernels.grouped_gemm.gluon_mx import launch_wgrad
    torch.manual_seed(11)
    K, N = 256, 384
    offs = group_offs(BLOCK_SIZES)
    M = 256  # 200 real tokens, then 56 padding tokens
    x = torch.randn(M, K, device="cuda")
    do = torch.randn(M, N, device="cuda")
    do[64:96] *= 1e4   # the block shared by [32, 72), [72, 75) and [75, 165): a huge scale
    x[160:192] *= 1e-4  # the tail block of [75, 165) / head of [165, 200): a tiny scale
    xt, xs = quant(x.t(), (32, 128))
    dt, ds = quant(do.t(), (32, 1))
    ref = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    poison_allocator()
    out = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, config)
    check_wgrad_groups(out, ref, BLOCK_SIZES)
    if config in (None, M12_WGRAD, M12_WGRAD_PERSIST, M10_WGRAD):  # the configs test_new_wgrad_configs_bit_exact_... holds bit exact
        torch.testing.assert_close(out, launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M4_WS2), rtol=0, atol=0)


@pytest.mark.parametrize("sizes", [SIZES, BLOCK_SIZES * 3, [4096, 0, 900, 17, 3000, 1, 64, 700]],
                         ids=["awkward", "blocks", "skewed"])
def test_persistent_wgrad_runs_many_tiles_per_cta(sizes):
    """The persistent wgrad at K = N = 1024 (64 tiles a group, 8-24 groups: 512-1536 tiles on 132 SMs, so each
    CTA takes several from the queue, of very different lengths, empty groups included): bit for bit the one-tile
    grid's output (same summation order), each group within 5e-4 of the float64 reference, and twice in a row
    the same (a fresh queue each launch)."""
    from kernels.grouped_gemm import grouped_mm_wgrad_reference
    from kernels.grouped_gemm.gluon_mx import launch_wgrad
    torch.manual_seed(12)
    K = N = 1024
    offs = group_offs(sizes)
    M = (sum(sizes) + 31) // 32 * 32 + 32
    x = torch.randn(M, K, device="cuda")
    do = torch.randn(M, N, device="cuda")
    xt, xs = quant(x.t(), (32, 128))
    dt, ds = quant(do.t(), (32, 1))
    ref = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M12_WGRAD)
    poison_allocator()
    out = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M12_WGRAD_PERSIST)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M12_WGRAD_PERSIST), out, rtol=0,
                               atol=0)
    r64 = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    check_wgrad_groups(out, r64, sizes)
    out16 = launch_wgrad(dt, ds, xt, xs, offs, torch.bfloat16, M12_WGRAD_PERSIST)
    assert rel(out16, r64) < TOL_BF16


@pytest.mark.parametrize("N", [1024, 4224])
def test_wgrad_band_order_is_bit_exact(N):
    """The tile order's band (GROUP_N, 4th config entry; session 43: all row tiles in one band where N <= 3072)
    only reorders tiles: bands of 32 at N = 1024 (8 row tiles, the band clamped) and N = 4224 (33: a band of 32,
    then one of 1) give the one-tile grid's output bit for bit, as does a launch without a config
    (wgrad_default_config), and stay within 5e-4 of the float64 reference per group, empty groups included."""
    from kernels.grouped_gemm import grouped_mm_wgrad_reference
    from kernels.grouped_gemm.gluon_mx import launch_wgrad, wgrad_default_config
    torch.manual_seed(13)
    sizes, K = [700, 0, 33, 1200, 1], 384
    offs = group_offs(sizes)
    M = (sum(sizes) + 31) // 32 * 32 + 32
    xt, xs = quant(torch.randn(M, K, device="cuda").t(), (32, 128))
    dt, ds = quant(torch.randn(M, N, device="cuda").t(), (32, 1))
    ref = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, M12_WGRAD)
    band = M12_WGRAD_PERSIST[:3] + (32,) + M12_WGRAD_PERSIST[4:]
    assert wgrad_default_config(N) == (band if N <= 3072 else M12_WGRAD_PERSIST)
    poison_allocator()
    torch.testing.assert_close(launch_wgrad(dt, ds, xt, xs, offs, torch.float32, band), ref, rtol=0, atol=0)
    torch.testing.assert_close(launch_wgrad(dt, ds, xt, xs, offs, torch.float32), ref, rtol=0, atol=0)
    check_wgrad_groups(ref, grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64), sizes)


@pytest.mark.parametrize("config", [None, M12_WGRAD], ids=_cid)
def test_wgrad_on_token_major_scale_layout(config):
    """The MoE path's token-major scales are [C, P/32] with strides (1, C) (kernels.moe writes all features of a
    token block together), which MODE 3-6/10/11 cannot read as words: MODE 12 runs on them unchanged, bit for bit
    its output on the same scales stored row-major, within 5e-4 of the float64 reference per group."""
    from kernels.grouped_gemm import grouped_mm_wgrad_reference
    from kernels.grouped_gemm.gluon_mx import launch_wgrad
    torch.manual_seed(13)
    K, N = 512, 384
    sizes = [300, 0, 1000, 33, 2431]
    offs = group_offs(sizes)
    M = (sum(sizes) + 31) // 32 * 32
    xt, xs = quant(torch.randn(M, K, device="cuda").t(), (32, 128))
    dt, ds = quant(torch.randn(M, N, device="cuda").t(), (32, 1))
    xs_t, ds_t = xs.t().contiguous().t(), ds.t().contiguous().t()  # same values, strides (1, rows)
    assert xs_t.stride() == (1, K) and ds_t.stride() == (1, N)
    ref = launch_wgrad(dt, ds, xt, xs, offs, torch.float32, config)
    poison_allocator()
    out = launch_wgrad(dt, ds_t, xt, xs_t, offs, torch.float32, config)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    r64 = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    check_wgrad_groups(out, r64, sizes)
