"""MXFP8 in plain PyTorch: the format's definition, runnable anywhere (CPU or CUDA).

The format (issue 4, "Format"): for each block V of 32 consecutive elements along `dim`
  amax  = max|V| in fp32
  s     = amax / 448 in fp32 (round to nearest even)
  e     = ceil(log2(s)), exact on that fp32 value (frexp), clamped to [-127, 127]; s == 0 (amax == 0, or
          an amax <= 224 * 2^-149 whose quotient underflows to 0) gives -127
  scale = e + 127 stored as a uint8 (E8M0)
  data  = e4m3(clamp(V * 2^-e, -448, 448)), round to nearest even
A block holding any NaN or +-inf gets scale 0xFF (E8M0 NaN); all 32 of its data bytes are stored as 0x7F
(e4m3fn NaN), so it decodes to NaN whichever of the two bytes a reader looks at.

`data` has x's shape and dtype torch.float8_e4m3fn; `scale` has x's shape with `dim` divided by 32, plain
row-major, dtype torch.uint8.

Every Triton kernel in kernels/mxfp8/triton.py must equal these functions bit for bit.
"""
from __future__ import annotations

import torch

BLOCK = 32  # elements per MXFP8 scale block
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E4M3_NAN_BYTE = 0x7F  # what a non-finite block's data bytes hold
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# ----------------------------------------------------------------------------------------------- checks
def check_input(x: torch.Tensor, dim: int, who: str = "to_mxfp8", name: str = "x") -> int:
    """Validate a tensor to quantize along `dim`; return `dim` normalised to [0, x.ndim)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{who}: {name}.dtype is {x.dtype}; MXFP8 quantization takes torch.bfloat16, "
                        f"torch.float16 or torch.float32")
    if x.ndim == 0:
        raise ValueError(f"{who}: {name} is a 0-d tensor; it needs a dimension of a multiple of 32 elements")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{who}: dim={dim} is out of range for {name} of shape {tuple(x.shape)}")
    d = dim % x.ndim
    if x.shape[d] % BLOCK != 0:
        raise ValueError(f"{who}: {name}.shape[{dim}] = {x.shape[d]} is not a multiple of {BLOCK} "
                         f"({name}.shape = {tuple(x.shape)}); MXFP8 scales blocks of 32 elements along dim {dim}")
    return d


def scale_shape(shape, dim: int) -> tuple:
    """Shape of the E8M0 scale tensor for data of `shape` scaled along `dim`."""
    s = list(shape)
    s[dim] //= BLOCK
    return tuple(s)


# ------------------------------------------------------------------------------------------ E8M0 helpers
def e8m0_to_fp32(scale: torch.Tensor) -> torch.Tensor:
    """View E8M0 scale bytes as fp32 factors: exactly 2^(b-127); 0xFF -> NaN. b = 0 gives 2^-127 (an fp32
    subnormal, built from its bits so nothing flushes it)."""
    if scale.dtype != torch.uint8:
        raise TypeError(f"e8m0_to_fp32: scale.dtype is {scale.dtype}; E8M0 scales are torch.uint8")
    b = scale.to(torch.int32)
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23)
    f = bits.view(torch.float32)
    return torch.where(b == E8M0_NAN, torch.full_like(f, float("nan")), f)


def pow2_fp32(k: torch.Tensor) -> torch.Tensor:
    """2^k in fp32 for integer k in [-127, 127], exact (2^-127 is the subnormal 0x00400000)."""
    k = k.to(torch.int32)
    bits = torch.where(k == -127, torch.full_like(k, 0x00400000), (k + 127).clamp(min=1) << 23)
    return bits.view(torch.float32)


def e8m0_exponent(amax: torch.Tensor) -> torch.Tensor:
    """e = clamp(ceil(log2(fl32(amax / 448))), -127, 127), exact; s == 0 -> -127. int32.

    frexp gives s = m * 2^ex with m in [0.5, 1): ceil(log2(s)) = ex - 1 when m == 0.5 (s a power of two),
    else ex. Subnormal s are scaled by 2^64 first (exact) so frexp never sees a subnormal on any device.
    Non-finite amax gives an arbitrary value: callers mark such blocks 0xFF."""
    amax = amax.to(torch.float32)
    s = amax / E4M3_MAX  # fp32 IEEE division, round to nearest even
    tiny = s < 2.0 ** -64
    m, ex = torch.frexp(torch.where(tiny, s * 2.0 ** 64, s))
    ex = ex.to(torch.int32) - 64 * tiny.to(torch.int32)
    e = ex - (m == 0.5).to(torch.int32)
    e = torch.where(s == 0, torch.full_like(e, -127), e)  # log2(0) = -inf: amax == 0, or amax / 448 underflowed
    return e.clamp(-127, 127)


# ------------------------------------------------------------------------------------------ core (last dim)
def _quantize_blocks(xb: torch.Tensor, amax: torch.Tensor, nonfinite: torch.Tensor):
    """xb: fp32 [..., nblk, L]; amax / nonfinite: [..., nblk]. Returns (data uint8 [..., nblk, L], scale
    uint8 [..., nblk])."""
    e = e8m0_exponent(amax)
    y = xb * pow2_fp32(-e).unsqueeze(-1)  # exact: a power of two times an fp32 (results below 2^-126 are
    # far under e4m3's smallest subnormal 2^-9 and round to +-0 either way)
    y = y.clamp(-E4M3_MAX, E4M3_MAX)
    data = y.to(torch.float8_e4m3fn).view(torch.uint8)
    data = torch.where(nonfinite.unsqueeze(-1), torch.full_like(data, E4M3_NAN_BYTE), data)
    scale = torch.where(nonfinite, torch.full_like(e, E8M0_NAN), e + E8M0_BIAS).to(torch.uint8)
    return data, scale


def to_mxfp8_reference(x: torch.Tensor, dim: int = -1):
    """Quantize x (bf16/fp16/fp32) to MXFP8 along `dim`. Returns (data float8_e4m3fn with x's shape,
    scale uint8 E8M0 with x's shape and dim divided by 32, row-major)."""
    d = check_input(x, dim)
    xt = x.movedim(d, -1).to(torch.float32)
    n = xt.shape[-1]
    xb = xt.reshape(*xt.shape[:-1], n // BLOCK, BLOCK)
    amax = xb.abs().amax(-1) if xb.numel() else xb.new_zeros(xb.shape[:-1])
    nonfinite = ~torch.isfinite(xb).all(-1)
    data, scale = _quantize_blocks(xb, amax, nonfinite)
    data = data.reshape(xt.shape).movedim(-1, d).contiguous().view(torch.float8_e4m3fn)
    scale = scale.movedim(-1, d).contiguous()
    return data, scale


def from_mxfp8_reference(data: torch.Tensor, scale: torch.Tensor, dim: int = -1,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode MXFP8 (data e4m3fn, scale uint8 E8M0 along `dim`) to `dtype`: data * 2^(scale-127), computed in
    fp32 (exact unless the result is an fp32 subnormal, then IEEE-rounded), then cast to dtype. Scale 0xFF
    decodes to NaN. Values near fp32 max can decode to inf (e.g. 256 * 2^120): the format allows it."""
    if data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"from_mxfp8: data.dtype is {data.dtype}; expected torch.float8_e4m3fn")
    if scale.dtype != torch.uint8:
        raise TypeError(f"from_mxfp8: scale.dtype is {scale.dtype}; expected torch.uint8 (E8M0 bits)")
    if data.ndim == 0 or not -data.ndim <= dim < data.ndim:
        raise ValueError(f"from_mxfp8: dim={dim} is out of range for data of shape {tuple(data.shape)}")
    d = dim % data.ndim
    if data.shape[d] % BLOCK != 0:
        raise ValueError(f"from_mxfp8: data.shape[{dim}] = {data.shape[d]} is not a multiple of {BLOCK}")
    want = scale_shape(data.shape, d)
    if tuple(scale.shape) != want:
        raise ValueError(f"from_mxfp8: scale.shape is {tuple(scale.shape)}; data of shape {tuple(data.shape)} "
                         f"scaled along dim {dim} needs scale.shape {want}")
    f = e8m0_to_fp32(scale)
    v = data.to(torch.float32).movedim(d, -1)
    v = v.reshape(*v.shape[:-1], -1, BLOCK) * f.movedim(d, -1).unsqueeze(-1)
    return v.reshape(v.shape[:-2] + (-1,)).movedim(-1, d).to(dtype).contiguous()


# ------------------------------------------------------------------------------------------ variants
def to_mxfp8_rowcol_reference(x: torch.Tensor, col_transposed: bool = True):
    """Both scalings of a 2-D x [M, K]: (data_row [M, K], scale_row [M, K/32], data_col, scale_col).
    col_transposed=True: data_col is [K, M] row-major and scale_col [K, M/32], i.e. to_mxfp8(x.t(), -1)
    (the K-major operand wgrad wants). col_transposed=False: data_col [M, K], scale_col [M/32, K],
    i.e. to_mxfp8(x, 0). Both hold the same bytes, transposed."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"to_mxfp8_rowcol: x must be 2-D [M, K], got shape "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    check_input(x, 0, "to_mxfp8_rowcol")
    check_input(x, 1, "to_mxfp8_rowcol")
    dr, sr = to_mxfp8_reference(x, -1)
    if col_transposed:
        dc, sc = to_mxfp8_reference(x.t(), -1)
    else:
        dc, sc = to_mxfp8_reference(x, 0)
    return dr, sr, dc, sc


def to_mxfp8_tiles32_reference(w: torch.Tensor):
    """Square-tile MXFP8 of w [..., N, K] (N, K multiples of 32): ONE scale per 32x32 tile, computed from the
    tile's amax with the same rule as a 1x32 block. Returns (data [..., N, K] e4m3fn, scale_k [..., N, K/32],
    scale_n [..., N/32, K]): the tile scale stored expanded both ways, so (data, scale_k) is a plain MXFP8
    tensor along K and (data, scale_n) one along N — one quantization serves fprop and dgrad."""
    if not isinstance(w, torch.Tensor) or w.ndim < 2:
        raise ValueError(f"to_mxfp8_tiles32: w must be [..., N, K] with at least 2 dims, got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    check_input(w, -2, "to_mxfp8_tiles32", "w")
    check_input(w, -1, "to_mxfp8_tiles32", "w")
    *lead, N, K = w.shape
    wf = w.to(torch.float32).reshape(*lead, N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    wt = wf.transpose(-3, -2)  # [..., N/32, K/32, 32, 32]
    tiles = wt.reshape(*wt.shape[:-2], BLOCK * BLOCK)
    amax = tiles.abs().amax(-1) if tiles.numel() else tiles.new_zeros(tiles.shape[:-1])
    nonfinite = ~torch.isfinite(tiles).all(-1)
    data, st = _quantize_blocks(tiles, amax, nonfinite)  # st: [..., N/32, K/32]
    data = data.reshape(wt.shape).transpose(-3, -2).reshape(w.shape).contiguous().view(torch.float8_e4m3fn)
    scale_k = st.repeat_interleave(BLOCK, dim=-2).contiguous()  # [..., N, K/32]
    scale_n = st.repeat_interleave(BLOCK, dim=-1).contiguous()  # [..., N/32, K]
    return data, scale_k, scale_n
