"""Plain-PyTorch references for the MXFP8 grouped GEMMs: dequantize (exactly), then matmul per group.

Every kernel in this package is compared against these. They take the same arguments as the public ops
(kernels/grouped_gemm/__init__.py) and compute in float64 by default (float32 also accepted), so the only
rounding left in a comparison is the kernel's fp32 accumulation and its output cast.

Groups: offs[e] is the cumulative END row of group e (int32, as torch._grouped_mm); group e holds rows
[offs[e-1], offs[e]) (offs[-1] of a first group is 0). Groups may be empty. Rows at or after offs[-1] are
padding: fprop/dgrad outputs are zero there; wgrad ignores them.
"""

import torch

from kernels.mxfp8 import from_mxfp8


def _bounds(offs: torch.Tensor):
    ends = [int(v) for v in offs.tolist()]
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def grouped_mm_fprop_reference(a_data, a_scale, w_data, w_scale, offs, out_dtype=torch.bfloat16,
                               compute_dtype=torch.float64):
    """out[rows of group e] = dequant(A)[rows] @ dequant(W[e])^T.

    a_data [M, K] e4m3fn, a_scale [M, K/32] (along K); w_data [E, N, K], w_scale [E, N, K/32] (along K).
    Returns [M, N] in out_dtype; padding rows are zero."""
    a = from_mxfp8(a_data, a_scale, dim=-1).to(compute_dtype)
    w = from_mxfp8(w_data, w_scale, dim=-1).to(compute_dtype)
    M, N = a.shape[0], w.shape[1]
    out = torch.zeros(M, N, dtype=compute_dtype, device=a.device)
    for e, (s, t) in enumerate(_bounds(offs)):
        if t > s:
            out[s:t] = a[s:t] @ w[e].t()
    return out.to(out_dtype)


def grouped_mm_dgrad_reference(do_data, do_scale, w_data, w_scale, offs, out_dtype=torch.bfloat16,
                               compute_dtype=torch.float64):
    """dX[rows of group e] = dequant(dO)[rows] @ dequant(W[e]).

    do_data [M, N], do_scale [M, N/32] (along N); w_data [E, N, K] (any strides), w_scale [E, N/32, K]
    (W scaled along N). Returns [M, K]."""
    do = from_mxfp8(do_data, do_scale, dim=-1).to(compute_dtype)
    w = from_mxfp8(w_data, w_scale, dim=-2).to(compute_dtype)
    M, K = do.shape[0], w.shape[2]
    out = torch.zeros(M, K, dtype=compute_dtype, device=do.device)
    for e, (s, t) in enumerate(_bounds(offs)):
        if t > s:
            out[s:t] = do[s:t] @ w[e]
    return out.to(out_dtype)


def grouped_mm_wgrad_reference(do_t_data, do_t_scale, a_t_data, a_t_scale, offs, out_dtype=torch.float32,
                               compute_dtype=torch.float64):
    """dW[e] = dequant(dO)[rows of e]^T @ dequant(A)[rows of e], from the token-major copies.

    do_t_data [N, M], do_t_scale [N, M/32]; a_t_data [K, M], a_t_scale [K, M/32] (both scaled along the
    token axis, blocks of 32 tokens from token 0). Returns [E, N, K]; an empty group gives zeros."""
    dot = from_mxfp8(do_t_data, do_t_scale, dim=-1).to(compute_dtype)
    at = from_mxfp8(a_t_data, a_t_scale, dim=-1).to(compute_dtype)
    E = offs.shape[0]
    out = torch.zeros(E, dot.shape[0], at.shape[0], dtype=compute_dtype, device=dot.device)
    for e, (s, t) in enumerate(_bounds(offs)):
        if t > s:
            out[e] = dot[:, s:t] @ at[:, s:t].t()
    return out.to(out_dtype)
