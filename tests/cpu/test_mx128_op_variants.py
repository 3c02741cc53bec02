"""benchmarks/mx128_op_variants.py: the mx128 op with both weight copies from one read (and fprop / dgrad on
DeepGEMM on a GPU). On CPU its plumbing runs on the emulated twin and must give the op's bits exactly; the
DeepGEMM operand layouts are checked against their definitions."""

import pytest
import torch

from benchmarks.mx128_op_variants import deepgemm_scales, mn_major, mx128_op_variant, row_groups
from kernels.grouped_gemm.quant import to_mxfp8_blocked
from titan_fp8.float8.experts import mxfp8_grouped_mm


def test_reference_plumbing_gives_the_op_bits_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    offs = torch.tensor([128, 128, 384], dtype=torch.int32)  # an empty group, uneven groups of 128-multiples
    x0 = torch.randn(384, 256, generator=g).to(torch.bfloat16)
    x0[5, :7] = 0.0
    x0[200] *= 1e4  # a row far above the rest
    w0 = (torch.randn(3, 256, 256, generator=g) * 0.05).to(torch.bfloat16)
    go = torch.randn(384, 256, generator=g).to(torch.bfloat16)
    got = {}
    for name, fn in (("op", lambda x, w: mxfp8_grouped_mm(x, w, offs, granularity="mx128", backend="emulated")),
                     ("variant", lambda x, w: mx128_op_variant(x, w, offs, gemm="reference"))):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fn(x, w)
        out.backward(go)
        got[name] = (out, x.grad, w.grad)
    for mine, theirs in zip(got["variant"], got["op"]):
        assert torch.equal(mine, theirs)
    # and against float64: the op's mx128 error at these sizes is ~2-4%
    starts = [0] + offs.tolist()[:-1]
    ref = torch.cat([x0[s:e].double() @ w0[i].double().t() for i, (s, e) in enumerate(zip(starts, offs.tolist()))])
    assert ((got["variant"][0].double() - ref).norm() / ref.norm()).item() < 0.08
    assert torch.count_nonzero(got["variant"][2][1]) == 0  # the empty group's weight gradient


def test_row_groups_marks_each_row_and_the_padding():
    offs = torch.tensor([2, 2, 5], dtype=torch.int32)
    assert row_groups(offs, 7).tolist() == [0, 0, 2, 2, 2, -1, -1]


def test_deepgemm_scales_are_one_fp32_factor_per_region():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2, 256, 384, generator=g) * torch.logspace(-3, 3, 384)
    _, ws = to_mxfp8_blocked(w, -1, 128, 128)
    sf = deepgemm_scales(ws, 128)
    assert sf.shape == (2, 2, 3) and sf.dtype == torch.float32
    for e in range(2):
        for i in range(2):
            for j in range(3):  # every 1x32 scale byte of the 128x128 tile is the region's one factor
                tile = ws[e, 128 * i:128 * (i + 1), 4 * j:4 * (j + 1)]
                assert torch.all(tile == tile[0, 0])
                assert sf[e, i, j].item() == 2.0 ** (int(tile[0, 0]) - 127)
    x = torch.randn(256, 384, generator=g)
    _, xs = to_mxfp8_blocked(x, -1, 128, 1)
    sa = mn_major(deepgemm_scales(xs, 1))
    assert sa.shape == (256, 3) and sa.stride() == (1, 256)
    assert torch.equal(sa, 2.0 ** (xs[:, ::4].float() - 127))


def test_unknown_gemm_is_named():
    with pytest.raises(ValueError, match="gemm='cublas'"):
        mx128_op_variant(torch.zeros(128, 128), torch.zeros(1, 128, 128), torch.tensor([128], dtype=torch.int32),
                         gemm="cublas")


def test_one_read_gives_both_weight_copies_of_the_op():
    # the Triton launch the GPU variant makes (interpreted here), against the op's two separate quantizations
    from benchmarks.mx128_op_variants import G, _weights_one_read
    from titan_fp8.float8.experts import _quant_weight
    w = torch.randn(3, 256, 384, generator=torch.Generator().manual_seed(2)) * torch.logspace(-2, 2, 384)
    w = w.to(torch.bfloat16)
    w[1, :128, :128] = 0.0  # an all-zero tile
    got = _weights_one_read(w, emulated=False)
    want = _quant_weight(w, G, False, "emulated") + _quant_weight(w, G, True, "emulated")
    assert got[2].shape == (3, 384, 256)  # W^T [E, K, N]
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
