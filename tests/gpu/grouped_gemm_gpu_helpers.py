"""Helpers shared by the GPU tests of the Gluon and CUDA grouped GEMMs (true 1x32, and mx128 for the CUDA kernel):
operands with special values, E8M0 special scales, an allocator poisoned with NaN, the norm-wise relative error.
Imported by module name (pytest puts tests/gpu on sys.path); the file name does not start with test_, so nothing
here is collected."""
import torch

TOL_BF16 = 3e-3
SIZES = [0, 1, 31, 33, 127, 129, 1000, 2431]  # E = 8; 3754 tokens


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def group_offs(sizes):
    return torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)


def poison_allocator():
    # the next torch.empty calls of similar size likely reuse these NaN-filled blocks
    t = torch.full((64 << 20,), float("nan"), device="cuda")
    del t


def quant(x, block_tile):
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    return to_mxfp8_blocked(x, -1, *block_tile)


def special_scales(scale, rows, first_block):
    """Write E8M0 bytes 0, 1, 254, 255 and neighbours into every position of the 4-byte scale words of a few rows
    (in place): row r gets the pattern rotated by r, starting at scale block first_block."""
    pats = [[0, 1, 254, 255], [255, 0, 0, 255], [0, 0, 0, 0], [127, 0, 130, 1], [254, 126, 0, 128]]
    for i, r in enumerate(rows):
        p = pats[i % len(pats)]
        p = p[i % 4:] + p[:i % 4]
        scale[r, first_block:first_block + 4] = torch.tensor(p, dtype=scale.dtype, device=scale.device)


def nt_operands(K, N, pad=77, block=32):
    """fprop operands over SIZES + `pad` NaN padding rows, with a NaN block in real row 40, a huge block in row 41
    and a subnormal-range block in row 42; W^T quantized as the autograd op does for dgrad (contiguous [E, K, N],
    128x128). block: A's scale block (32, or 128 for mx128). Returns a dict: x, w, ad, as_, wd, ws, wtd, wts, offs,
    M, pad, keep (rows compared with the reference: real rows except the NaN row 40)."""
    torch.manual_seed(0)
    offs = group_offs(SIZES)
    M = sum(SIZES) + pad
    x = torch.randn(M, K, device="cuda")
    x[-pad:] = float("nan")
    x[40, 64:96] = float("nan")  # a NaN block in a real row: that row's output is NaN, the others are not
    x[41, :32] *= 1e4            # a huge block next to normal ones
    x[42, 32:64] = 1e-30         # subnormal-range block
    w = torch.randn(len(SIZES), N, K, device="cuda") * 0.02
    ad, as_ = quant(x, (block, 1))
    wd, ws = quant(w, (block, 128))
    wtd, wts = quant(w.transpose(1, 2).contiguous(), (block, 128))
    keep = torch.ones(M, dtype=torch.bool, device="cuda")
    keep[40] = False
    keep[-pad:] = False
    return dict(x=x, w=w, ad=ad, as_=as_, wd=wd, ws=ws, wtd=wtd, wts=wts, offs=offs, M=M, pad=pad, keep=keep)


def check_fprop_output(out, o, ref, tol):
    """Padding rows exactly zero, NaN only in row 40, the kept rows within tol of the float64 reference."""
    pad = o["pad"]
    assert torch.equal(out[-pad:], torch.zeros_like(out[-pad:]))
    assert torch.isnan(out[40]).all() and torch.isfinite(out[:40]).all() and torch.isfinite(out[41:-pad]).all()
    assert rel(out[o["keep"]], ref[o["keep"]]) < tol


def dgrad_operands(M, N, pad, block=32):
    do = torch.randn(M, N, device="cuda")
    do[-pad:] = float("inf")
    return quant(do, (block, 1))


def special_scale_operands(K, N=256, block=32):
    """fprop operands at awkward group sizes with E8M0 0/1/254/255 in every byte position of activation scale
    words (rows 40-59, 200-209, 500-504) and weight-tile scales 0 (expert 3, columns 0-127: subnormal factors),
    254 (expert 3, columns 128-255: overflow to inf in some rows) and 255 (expert 6, columns 0-127: NaN).
    block=128 (mx128: a scale per 128 of K): each word's 4 bytes become their largest (0, 254, 255 and ordinary
    values), and the weight's special scales cover whole 128-blocks. Returns (ad, as_, wd, ws, offs)."""
    torch.manual_seed(5)
    sizes = [0, 33, 129, 300, 1, 31, 200, 127]
    offs = group_offs(sizes)
    M = sum(sizes) + 40
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(len(sizes), N, K, device="cuda") * 0.02
    ad, as_ = quant(x, (32, 1))
    wd, ws = quant(w, (block, 128))
    special_scales(as_, list(range(40, 60)), 0)
    special_scales(as_, list(range(200, 210)), 8)
    special_scales(as_, list(range(500, 505)), 12)
    if block == 32:
        ws[3, 0:128, 5] = 0
        ws[3, 128:256, 6] = 254
        ws[6, 0:128, 2] = 255
        return ad, as_, wd, ws, offs
    as_ = as_.view(M, -1, 4).amax(-1, keepdim=True).expand(-1, -1, 4).reshape(M, -1).contiguous()
    ws[3, 0:128, 4:8] = 0
    ws[3, 128:256, 8:12] = 254
    ws[6, 0:128, 0:4] = 255
    return ad, as_, wd, ws, offs


def check_special_vs_reference(out, ad, as_, wd, ws, offs):
    """Finite entries of out within TOL_BF16 of the float64 reference, elementwise (expert 3's columns 128-255
    overflow and expert 6's columns 0-127 are NaN by construction, so whole rows would leave too few), and the
    rows whose scales hold 255 (row 41) or only 0s (row 42) come out NaN / finite."""
    from kernels.grouped_gemm import grouped_mm_fprop_reference
    r64 = grouped_mm_fprop_reference(ad, as_, wd, ws, offs, out_dtype=torch.float64)
    fin = torch.isfinite(r64) & torch.isfinite(out.double())
    assert fin.double().mean() > 0.5
    assert rel(out[fin], r64[fin]) < TOL_BF16
    assert torch.isnan(out[41]).all() and torch.isfinite(out[42]).all()


def rowcol_cases():
    """(name, bf16 x on the GPU, limit or None) for the one-read rowcol quantizers: awkward M and K (K % 128 == 32:
    scale rows not 4-byte aligned), limit inside a tile, NaN / inf rows past it, zeros, bf16 subnormals, values near
    the bf16 maximum, an empty x. Also benchmarks/quant_rowcol_cuda.py's byte check."""
    g = torch.Generator(device="cuda").manual_seed(11)
    out = []
    x = (torch.randn(5000, 1536, device="cuda", generator=g)
         * torch.exp(torch.randn(5000, 1, device="cuda", generator=g) * 3)).bfloat16()
    x[3, 5] = float("nan")
    x[4900:] = float("nan")
    out.append(("5000x1536 limit 4900", x, 4900))
    out.append(("100x1440", torch.randn(100, 1440, device="cuda", generator=g).bfloat16(), None))
    x = torch.randn(33, 2816, device="cuda", generator=g).bfloat16()
    x[25] = float("inf")
    out.append(("33x2816 limit 20", x, 20))
    x = torch.randn(257, 4096, device="cuda", generator=g).bfloat16()
    x[:40, :300] = 0
    x[50:60] = (torch.randn(10, 4096, device="cuda", generator=g) * 1e-39).bfloat16()
    x[70:80] = (torch.randn(10, 4096, device="cuda", generator=g) * 3e38).clamp(-3.3e38, 3.3e38).bfloat16()
    x[90, 1000] = float("-inf")
    x[91, 7] = float("nan")
    out.append(("257x4096 specials", x, 250))
    out.append(("128x128 limit 0", torch.randn(128, 128, device="cuda", generator=g).bfloat16(), 0))
    out.append(("0x256", torch.empty(0, 256, device="cuda", dtype=torch.bfloat16), None))
    return out


def rowcol_reference(x, rb, cb, ct, lim):
    """quant.py's bytes for to_mxfp8_blocked_rowcol(x, row_block=rb, col_block=cb, col_tile=ct, limit=[lim]):
    (row data, row scale, column data, column scale)."""
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    rd, rs = to_mxfp8_blocked(x, -1, rb, 1)
    xz = x.clone()
    if lim is not None:
        xz[lim:] = 0
    xz = torch.nn.functional.pad(xz, (0, 0, 0, (-x.shape[0]) % 32))
    cd, cs = to_mxfp8_blocked(xz.t(), -1, cb, ct)
    return rd, rs, cd, cs
