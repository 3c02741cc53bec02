"""The output of a grouped out[g] = A[g] @ B[e]^T launcher (gluon_mx, cuda_mx), with the shapes no kernel runs."""
import torch


def nt_output(a, b, out_dtype):
    """(out [M, C], done): done when the shapes leave nothing to launch (no rows or columns: out is empty; an
    empty reduction: out is zeros)."""
    M, R = a.shape
    out = torch.empty(M, b.shape[1], dtype=out_dtype, device=a.device)
    if M == 0 or b.shape[1] == 0:
        return out, True
    if R == 0:
        return out.zero_(), True
    return out, False
