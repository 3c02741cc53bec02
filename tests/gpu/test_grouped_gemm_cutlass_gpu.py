"""The CUTLASS "mx128" grouped GEMMs (kernels/grouped_gemm/cutlass_backend.py) on an sm_90 GPU against the
float64 references, at awkward group sizes, with NaN/inf blocks, NaN padding rows and poisoned output memory.

Skips without CUDA or on a GPU other than sm_90. A missing toolchain or a failed build FAILS here (it is what
these tests are for). The first test builds the extension (~1-2 minutes).
"""
import pytest
import torch
from test_grouped_gemm_gpu import _experts, rel  # tests/gpu is on sys.path under pytest (no __init__.py)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 (Hopper) GPU")

TOL_BF16 = 3e-3
TOL_F32 = 5e-4  # fp8 wgmma accumulates each 128-chunk with fewer mantissa bits than fp32 (test_grouped_gemm_gpu)
AWKWARD = [0, 1, 31, 33, 127, 129, 1000, 0, 2561, 300]  # rows per expert (fprop/dgrad)
PAD = 77  # padding rows past offs[-1]


def offs_of(sizes):
    return torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)


def poison_allocator(nbytes):
    """Fill a freed block with NaN bytes so a following torch.empty of the same size likely reuses it."""
    t = torch.full((nbytes // 4 + 1,), float("nan"), device="cuda")
    del t


def compare_with_nan(out, ref, tol):
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), "NaN positions differ from the reference"
    rows = ~nan_ref.any(-1)
    assert rows.any()
    assert rel(out[rows].float(), ref[rows]) < tol


@pytest.fixture(params=["cooperative", "pingpong", "cooperative_2x1:along_n", "cooperative_1x1:swizzle=4",
                        "cooperative_lpt", "cooperative_n256_2x1", "cooperative_n256_2x1:along_m",
                        "cooperative_lpt_n256_2x1", "cooperative_lpt_n256_2x1:along_n",
                        "cooperative_lpt_n256_2x1:along_m"])
def schedule(request, monkeypatch):
    """Every CUTLASS kernel, and the scheduler options (kernels.grouped_gemm.cutlass_backend.SCHEDULES picks one per pass)."""
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", request.param)
    return request.param


@pytest.fixture(scope="module")
def ext():
    from kernels.grouped_gemm import cutlass_backend
    return cutlass_backend.load()  # raises CutlassUnavailable (fails the tests) when it cannot build


# (1024, 544): fprop with a partial last column tile (its dgrad would reduce over 544: not a CUTLASS shape);
# (544, 1024): dgrad with a partial last column tile (its fprop would reduce over 544)
# (128, 1408): fprop over one 128-deep k-block (the consumer loop's first block is also its last)
@pytest.mark.parametrize("K,N", [(2048, 1408), (512, 2816), (1024, 544), (544, 1024), (128, 1408)])
def test_fprop_dgrad_cutlass(ext, schedule, K, N):
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    torch.manual_seed(0)
    E, offs = len(AWKWARD), offs_of(AWKWARD)
    M = sum(AWKWARD) + PAD
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    x[-PAD:] = float("nan")          # padding rows: never read
    x[40, min(130, K - 1)] = float("inf")  # one 1x128 block of a real row (group 3): NaN scale -> NaN row
    x[200, :128] = 0                 # an all-zero block
    x[300, 128:256] *= 1e-30         # a subnormal-range block (own scale)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    w[8, 0, 0] = float("nan")        # one 128x128 tile of expert 8 (rows of group 8 x cols 0..127)
    ad, as_ = to_mxfp8_blocked(x, -1, 128, 1)
    wd, ws = to_mxfp8_blocked(w, -1, 128, 128)
    if K % 128 == 0:
        fprop_case(ad, as_, wd, ws, offs, M, N)
    if N % 128 == 0:
        dgrad_case(w, offs, M, N, K)


@pytest.mark.parametrize("M", [992, 8288])
def test_dense_one_group_cutlass(ext, M):
    """The dense case (the shape of a Linear): one group over all M rows (E = 1, offs = [M], the last 128-row tile
    partial), fprop and dgrad with the default schedules, against the float64 references (wgrad's one-group case:
    test_wgrad_cutlass's [8192])."""
    from kernels.grouped_gemm import (grouped_mm_dgrad_reference, grouped_mm_fprop_reference,
                                      mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop)
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    torch.manual_seed(22)
    K, N = 1024, 1408
    offs = offs_of([M])
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    ad, as_ = to_mxfp8_blocked(x, -1, 128, 1)
    wd, ws = to_mxfp8_blocked(w, -1, 128, 128)
    poison_allocator(M * N * 2)
    y = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
    ref = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    assert y.shape == (M, N) and rel(y.float(), ref) < TOL_BF16
    do = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    dd, ds = to_mxfp8_blocked(do, -1, 128, 1)
    wtd, wts = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, 128, 128)
    wn, wns = wtd.transpose(1, 2), wts.transpose(1, 2)
    poison_allocator(M * K * 2)
    dx = mxfp8_grouped_mm_dgrad(dd, ds, wn, wns, offs, block=128, w_tile=128, backend="cutlass")
    refd = grouped_mm_dgrad_reference(dd, ds, wn, wns, offs, out_dtype=torch.float64)
    assert dx.shape == (M, K) and rel(dx.float(), refd) < TOL_BF16


def fprop_case(ad, as_, wd, ws, offs, M, N):
    from kernels.grouped_gemm import grouped_mm_fprop_reference, mxfp8_grouped_mm_fprop
    poison_allocator(M * N * 2)
    out = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
    ref = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    assert torch.equal(out[-PAD:], torch.zeros_like(out[-PAD:]))
    assert torch.isnan(out[40]).all()
    compare_with_nan(out[:-PAD], ref[:-PAD], TOL_BF16)


def dgrad_case(w, offs, M, N, K):
    """W^T quantized along N as the autograd op does (contiguous [E, K, N], viewed as [E, N, K])."""
    from kernels.grouped_gemm import grouped_mm_dgrad_reference, mxfp8_grouped_mm_dgrad
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    do = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    do[-PAD:] = float("nan")
    do[1000, 5] = float("-inf")
    dd, ds = to_mxfp8_blocked(do, -1, 128, 1)
    wt = w.transpose(1, 2).contiguous()
    wt[8] = torch.nan_to_num(wt[8])  # dgrad checks the NaN row of dO; keep its weights finite
    wtd, wts = to_mxfp8_blocked(wt, -1, 128, 128)
    wn, wns = wtd.transpose(1, 2), wts.transpose(1, 2)
    poison_allocator(M * K * 2)
    dx = mxfp8_grouped_mm_dgrad(dd, ds, wn, wns, offs, block=128, w_tile=128, backend="cutlass")
    refd = grouped_mm_dgrad_reference(dd, ds, wn, wns, offs, out_dtype=torch.float64)
    assert torch.equal(dx[-PAD:], torch.zeros_like(dx[-PAD:]))
    assert torch.isnan(dx[1000]).all()
    compare_with_nan(dx[:-PAD], refd[:-PAD], TOL_BF16)
    # in parts of the experts into one (NaN-poisoned) output, as the fused MoE backward runs w13's dgrad: parts
    # with only an empty group (0 and 7 of AWKWARD) write nothing, the part with the last expert zeroes the tail
    parts = torch.full_like(dx, float("nan"))
    for g0, g1 in ((0, 1), (1, 7), (7, 8), (8, len(AWKWARD))):
        got = mxfp8_grouped_mm_dgrad(dd, ds, wn[g0:g1], wns[g0:g1], offs, block=128, w_tile=128,
                                     backend="cutlass", out=parts, first_group=g0)
        assert got is parts
    assert torch.equal(parts.view(torch.int16), dx.view(torch.int16)), "dgrad in parts differs from one launch"


def fprop_operands(sizes, K, N, seed):
    """Random x [sum(sizes), K] and w [E, N, K] quantized as the mx128 fprop reads them, and the group ends."""
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    torch.manual_seed(seed)
    x = torch.randn(sum(sizes), K, device="cuda")
    w = torch.randn(len(sizes), N, K, device="cuda") * 0.02
    return (*to_mxfp8_blocked(x, -1, 128, 1), *to_mxfp8_blocked(w, -1, 128, 128), offs_of(sizes))


def test_fprop_cutlass_matches_triton_closely(ext, schedule):
    """Same operands, two backends: equal up to fp32 summation order (bf16 output)."""
    from kernels.grouped_gemm import mxfp8_grouped_mm_fprop
    ad, as_, wd, ws, offs = fprop_operands([512, 129, 0, 1024], 1024, 768, seed=3)
    a = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
    b = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="triton")
    assert rel(a, b) < 4e-3


def test_ops_resolve_the_schedule_per_call(ext, monkeypatch):
    """The ops' C++ kernels (what a compiled graph calls) read $TITAN_FP8_CUTLASS_SCHEDULE on every call, as the
    Python ops did: a new value reaches a graph already compiled; raster "auto" follows the call's shapes; a bad
    value is a ValueError naming the variable, at the call."""
    from kernels.grouped_gemm import cutlass_backend as cb
    from kernels.grouped_gemm import mxfp8_grouped_mm_fprop
    monkeypatch.delenv("TITAN_FP8_CUTLASS_SCHEDULE", raising=False)
    ad, as_, wd, ws, offs = fprop_operands([512, 129, 0, 1024], 1024, 768, seed=5)
    f = torch.compile(lambda a, w: mxfp8_grouped_mm_fprop(a, as_, w, ws, offs, block=128, w_tile=128,
                                                          backend="cutlass", validate=False), fullgraph=True)
    ref = f(ad, wd)
    m_tiles, n_tiles = ad.shape[0] / 4 / 128, 768 / 128
    assert ext.last_config() == cb.schedule_id("fprop", m_tiles, n_tiles)
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "fprop=cooperative_1x1:along_n:swizzle=2")
    assert torch.equal(f(ad, wd), ref)  # same tiles, same order inside each: bit for bit
    assert ext.last_config() == 3 | 16 | (1 << 8)
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "fprop=fast")
    with pytest.raises(ValueError, match="TITAN_FP8_CUTLASS_SCHEDULE"):
        f(ad, wd)
    monkeypatch.delenv("TITAN_FP8_CUTLASS_SCHEDULE")
    assert torch.equal(f(ad, wd), ref)


@pytest.mark.parametrize("case,want", [("cutlass_op_bad_pass_eager", "ValueError"),
                                       ("cutlass_op_1d_operand_eager", "IndexError"),
                                       ("cutlass_op_carveout_eager", "no exception"),
                                       ("cutlass_op_carveout_compiled", "no exception"),
                                       ("cutlass_pybind_carveout", "no exception")])
def test_op_errors_reach_python(ext, case, want):
    """Errors thrown from the ops' C++ kernels (a bad pass name, an operand of the wrong rank) reach Python as
    exceptions, not a crash; an SM carve-out leaving fewer than 2 SMs, which the Python wrappers reject, runs on one
    2-CTA cluster when it reaches the kernels anyway (raw op, eager and compiled, and the pybind call): throwing it
    there crashed the process on the GPU image. Each call runs in a subprocess (benchmarks/op_error_probe.py's
    cases), so a crash fails this test and nothing else."""
    import importlib.util
    import os
    import subprocess
    import sys
    import textwrap
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("op_error_probe", os.path.join(root, "benchmarks",
                                                                                 "op_error_probe.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    code = probe.WRAP.format(body=textwrap.indent(probe.CASES[case].strip("\n"), "    "))
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])))
    got = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and got, f"{case}: returncode {p.returncode}, stderr tail: {p.stderr[-800:]}"
    assert got[-1].startswith(f"RESULT {want}"), got[-1]
    assert "carveout" not in case or "ran on one cluster, equal: True" in p.stdout, p.stdout


def test_sm_carveout_changes_no_bit(ext):
    """torch's SM carve-out ([comm] matmul_sm_carveout) shrinks the persistent grid: the same tiles are computed
    by other CTAs, in the same order inside a tile, so the result is bit-identical (also at an odd SM count, which
    the launch rounds down to whole 2-CTA clusters, and at 2 SMs); a carve-out leaving fewer than 2 SMs is an
    error naming it, not a hang or a silent full-size grid."""
    from kernels.grouped_gemm import mxfp8_grouped_mm_fprop
    ad, as_, wd, ws, offs = fprop_operands([3000, 0, 129, 5000], 2048, 1408, seed=4)
    full = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        for carve in (16, 7, sms - 2):
            torch._C._set_sm_carveout_experimental(carve)
            got = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
            assert torch.equal(got, full), carve
        torch._C._set_sm_carveout_experimental(sms - 1)
        with pytest.raises(ValueError, match="SM carve-out"):
            mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
    finally:
        torch._C._set_sm_carveout_experimental(None)


@pytest.mark.parametrize("sizes", [[0, 128, 1280, 256, 0, 3072, 896, 512], [8192], [0, 0, 384]])
def test_wgrad_cutlass(ext, schedule, sizes):
    from kernels.grouped_gemm import grouped_mm_wgrad_reference, mxfp8_grouped_mm_wgrad
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    torch.manual_seed(1)
    K, N = 1024, 1408
    offs = offs_of(sizes)
    real = sum(sizes)
    M = real + 256  # two whole 128-token padding blocks, NaN: must never reach a real group
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    do = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    x[real:] = float("nan")
    do[real:] = float("nan")
    if real > 300:
        x[300, 7] = float("inf")  # one 128(K) x 128(token) tile of x^T -> NaN there in that group's dW
    xt, xs = to_mxfp8_blocked(x.t(), -1, 128, 128)
    dt, ds = to_mxfp8_blocked(do.t(), -1, 128, 1)
    poison_allocator(len(sizes) * N * K * 4)
    out = mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, block=128, a_tile=128, backend="cutlass")
    ref = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    assert out.dtype == torch.float32 and out.shape == (len(sizes), N, K)
    for e, s in enumerate(sizes):
        if s == 0:
            assert torch.equal(out[e], torch.zeros_like(out[e])), f"empty expert {e} is not zero"
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    if real > 300:
        assert torch.isnan(out).any()
    fin = ~torch.isnan(ref)
    if ref[fin].norm() > 0:
        assert rel(out[fin], ref[fin]) < TOL_F32
    # bf16 output (what the autograd op asks for with bf16 weights): the same fp32 sums, rounded once
    out16 = mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, torch.bfloat16, block=128, a_tile=128, backend="cutlass")
    assert out16.dtype == torch.bfloat16
    assert torch.equal(torch.nan_to_num(out16.float()), torch.nan_to_num(out.bfloat16().float()))


def test_fused_dgrad_in_parts_equals_one_launch(ext, monkeypatch):
    """cutlass_backend.dgrad_in_parts (the C++ op running an expert weight's dgrad over parts of the experts, each
    quantizing its own W^T), eager and compiled, against the one-launch dgrad on the whole W^T operand quantized by
    the Triton quantizer (static scheduler): bit for bit, awkward group sizes, padding, under the static and the
    dynamic (lpt) scheduler."""
    from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad
    from kernels.grouped_gemm.cutlass_backend import dgrad_in_parts
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    torch.manual_seed(3)
    sizes = [0, 1, 31, 33, 127, 129, 1000, 0, 2561]  # 9 experts: parts of 4 and 5, and of 3
    offs = offs_of(sizes)
    M, N, K = sum(sizes) + PAD, 768, 1024
    w = torch.randn(len(sizes), N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    dq, ds = to_mxfp8_blocked_rowcol(torch.randn(M, N, device="cuda", dtype=torch.bfloat16), row_block=128,
                                     do_col=False)[:2]
    wtd, wts = to_mxfp8_blocked_rowcol(w, col_block=128, col_tile=128, do_row=False)[2:]
    monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", "dgrad=cooperative_n256_2x1")
    one = mxfp8_grouped_mm_dgrad(dq, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs, block=128, w_tile=128,
                                 validate=False, backend="cutlass")
    compiled = torch.compile(dgrad_in_parts, fullgraph=True)
    for sched in ("cooperative_n256_2x1", "cooperative_lpt_n256_2x1", "cooperative_lpt_n256_2x1:along_m"):
        monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", f"dgrad={sched}")
        for parts in (2, 3):
            for f, how in ((dgrad_in_parts, "eager"), (compiled, "compiled")):
                poison_allocator(M * K * 2)
                got = f(dq, ds, w, offs, parts)
                assert torch.equal(got.view(torch.int16), one.view(torch.int16)), f"{sched}, {parts} parts, {how}"


@pytest.mark.parametrize("G,N,K", [(3, 384, 256), (2, 5632, 4096)])
def test_wt_tile_quant_equals_triton_bit_for_bit(ext, G, N, K):
    """The extension's W^T tile quantizer (wt_tile_quant.cu, what dgrad_in_parts uses) writes the Triton column
    copy's bytes and scales exactly: magnitudes over 2^+-40, a zero tile, a subnormal-only tile, tiles at bf16's
    largest values, an inf tile and a NaN tile."""
    from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    torch.manual_seed(7)
    w = (torch.randn(G, N, K, device="cuda") * torch.logspace(-40, 40, K, base=2.0, device="cuda")).to(torch.bfloat16)
    w[0, :128, :128] = 0
    w[0, 128:256, :128] = torch.randn(128, 128, device="cuda").to(torch.bfloat16) * 1e-39
    w[1, :128, 128:256] = torch.finfo(torch.bfloat16).max
    w[1, 5, 130] = -torch.finfo(torch.bfloat16).max
    w[G - 1, -1, -1] = float("inf")
    w[G - 1, 0, -1] = float("nan")
    wt, s = ext.wt_tiles(w)
    want_d, want_s = to_mxfp8_blocked_rowcol(w, col_block=128, col_tile=128, do_row=False)[2:]
    assert torch.equal(wt, want_d.view(torch.uint8))
    assert torch.equal(s, want_s)
    assert (s[G - 1, -128:, -4:] == 255).all() and (wt[G - 1, -128:, -128:] == 0x7F).all()


def test_wgrad_lpt_scheduler_matches_static_bit_for_bit(ext, monkeypatch):
    """The dynamic ticket scheduler (cooperative_lpt) only changes which CTA computes a tile, never the tile's
    sums: its dW equals the static cooperative kernel's bit for bit. 48 uneven groups (empty ones, one 16x the
    others) make ~6000 tiles, over 32 tickets per cluster, so each cluster's mailbox ring wraps."""
    from kernels.grouped_gemm import grouped_mm_wgrad_reference, mxfp8_grouped_mm_wgrad
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    g = torch.Generator().manual_seed(5)
    sizes = (torch.randint(0, 9, (48,), generator=g) * 128).tolist()
    sizes[3], sizes[10], sizes[40] = 0, 16 * 128 * 4, 128
    K, N = 2048, 1024
    offs = offs_of(sizes)
    M = sum(sizes)
    torch.manual_seed(5)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    do = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    xt, xs = to_mxfp8_blocked(x.t(), -1, 128, 128)
    dt, ds = to_mxfp8_blocked(do.t(), -1, 128, 1)
    outs = {}
    lpt = ("cooperative_lpt", "cooperative_lpt_n256_2x1:along_m", "cooperative_lpt_n256_2x1:along_n")
    for sched in ("cooperative",) + lpt:
        monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", f"wgrad={sched}")
        poison_allocator(len(sizes) * N * K * 2)
        outs[sched] = mxfp8_grouped_mm_wgrad(dt, ds, xt, xs, offs, torch.bfloat16, block=128, a_tile=128,
                                             backend="cutlass")
    for sched in lpt:  # the 2x1 cluster's two CTAs share each dynamic ticket under either raster order
        assert torch.equal(outs["cooperative"].view(torch.int16), outs[sched].view(torch.int16)), sched
    ref = grouped_mm_wgrad_reference(dt, ds, xt, xs, offs, out_dtype=torch.float64)
    assert torch.equal(outs["cooperative_lpt"][3], torch.zeros_like(outs["cooperative_lpt"][3]))
    assert rel(outs["cooperative_lpt"], ref) < TOL_BF16
    assert rel(outs["cooperative_lpt"][10], ref[10]) < TOL_BF16  # the long group on its own


@pytest.mark.parametrize("N", [1000, 1096])
def test_wide_kernel_equals_128_wide_bit_for_bit(ext, monkeypatch, N):
    """The 128x256 kernels form each k-block's partial one 128-column half at a time and promote with the product
    of the two scales first (blockwise_grouped.cuh mma_halves), as the 128x128 kernels do, so every pass gives the
    same bits: scales over 2^-100..2^100 (where (partial * sa) * sb would leave fp32's range), output widths that
    end in a partial 256 tile whose second half is partly (1000 = 3 x 256 + 232) or wholly (1096 = 4 x 256 + 72)
    past the edge, awkward groups, padding rows."""
    from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    torch.manual_seed(11)
    sizes = [0, 1, 31, 33, 127, 129, 1000, 0, 2561]
    offs, E = offs_of(sizes), len(sizes)
    M, K = sum(sizes) + PAD, 1024
    ramp = torch.logspace(-100, 100, K // 128, base=2.0, device="cuda").repeat_interleave(128)
    x = torch.randn(M, K, device="cuda") * ramp
    w = torch.randn(E, N, K, device="cuda") * ramp.flip(0) * 0.02
    ad, as_ = to_mxfp8_blocked(x, -1, 128, 1)
    wd, ws = to_mxfp8_blocked(w, -1, 128, 128)
    do = torch.randn(M, 1024, device="cuda")
    dd, ds = to_mxfp8_blocked(do, -1, 128, 1)
    wt = (torch.randn(E, K, 1024, device="cuda") * 0.02 * ramp[:, None])
    wtd, wts = to_mxfp8_blocked(wt, -1, 128, 128)
    wsz = [s // 128 * 128 for s in sizes]  # wgrad groups start on 128 tokens
    woffs, T = offs_of(wsz), sum(wsz) + 256
    xt, xs = to_mxfp8_blocked((torch.randn(T, N, device="cuda") * 1e20).t(), -1, 128, 128)
    dt, dts = to_mxfp8_blocked((torch.randn(T, K, device="cuda") * 1e-20).t(), -1, 128, 1)
    outs = {}
    runs = (("cooperative", "cooperative_lpt"), ("cooperative_n256_2x1", "cooperative_n256_2x1"),
            ("cooperative_n256_2x1:along_m", "cooperative_lpt_n256_2x1:along_m"),
            ("cooperative_n256_2x1:along_n", "cooperative_lpt_n256_2x1:along_n"),
            ("cooperative_lpt_n256_2x1", "cooperative_lpt_n256_2x1"),
            ("cooperative_lpt_n256_2x1:along_m", "cooperative_lpt"))
    for wide, pair in runs:
        monkeypatch.setenv("TITAN_FP8_CUTLASS_SCHEDULE", f"fprop={wide};dgrad={wide};wgrad={pair}")
        poison_allocator(M * N * 2)
        f = mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, block=128, w_tile=128, backend="cutlass")
        poison_allocator(M * K * 2)
        d = mxfp8_grouped_mm_dgrad(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs, block=128, w_tile=128,
                                   backend="cutlass")
        poison_allocator(E * K * N * 4)
        g = mxfp8_grouped_mm_wgrad(dt, dts, xt, xs, woffs, block=128, a_tile=128, backend="cutlass")
        outs[wide] = (f, d, g)
    for wide, _ in runs[1:]:
        for name, a, b in zip(("fprop", "dgrad", "wgrad"), outs["cooperative"], outs[wide]):
            assert a.isfinite().all() and a.abs().max() > 0, name
            assert torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                               b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)), (wide, name)


def test_auto_picks_cutlass_for_mx128(ext):
    from kernels.grouped_gemm import pick_backend
    t = torch.empty(1, device="cuda", dtype=torch.float8_e4m3fn)
    assert pick_backend("t", "fprop", "auto", t, 128, 128, 2048, 1408, torch.bfloat16) == "cutlass"
    # true 1x32 blocks are not CUTLASS's: "auto" sends them to the Gluon kernels (their own tests)
    assert pick_backend("t", "fprop", "auto", t, 32, 128, 2048, 1408, torch.bfloat16) == "gluon"
    assert pick_backend("t", "wgrad", "auto", t, 128, 128, 4096, 1408, torch.float32) == "triton"
    assert pick_backend("t", "wgrad", "auto", t, 128, 128, 4096, 1408, torch.float32, 128) == "cutlass"


@pytest.mark.parametrize("compiled", [False, True])
def test_autograd_op_cutlass_matches_emulated_twin(ext, compiled):
    mxfp8_grouped_mm = _experts().mxfp8_grouped_mm
    torch.manual_seed(2)
    sizes = [384, 0, 768, 128]
    T, K, N = sum(sizes) + 64, 512, 768
    offs = offs_of(sizes)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    x[-64:] = float("nan")
    w = torch.randn(len(sizes), N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    go = torch.randn(T, N, device="cuda", dtype=torch.bfloat16)
    res = {}
    for dev, backend in (("cuda", "cutlass"), ("cpu", "emulated")):
        xr = x.detach().to(dev).clone().requires_grad_()
        wr = w.detach().to(dev).clone().requires_grad_()
        fn = lambda a, b, o, backend=backend: mxfp8_grouped_mm(a, b, o, granularity="mx128",  # noqa: E731
                                                               backend=backend, token_align=128)
        if compiled and dev == "cuda":
            fn = torch.compile(fn)
        out = fn(xr, wr, offs.to(dev))
        out.backward(go.to(dev))
        res[dev] = [t.detach().cpu() for t in (out, xr.grad, wr.grad)]
    for a, b in zip(res["cuda"], res["cpu"]):
        assert torch.isfinite(a).all()
        assert rel(a, b) < 5e-3
    assert torch.equal(res["cuda"][0][-64:], torch.zeros_like(res["cuda"][0][-64:]))
    assert torch.equal(res["cuda"][1][-64:], torch.zeros_like(res["cuda"][1][-64:]))
    assert torch.equal(res["cuda"][2][1], torch.zeros_like(res["cuda"][2][1]))
