"""MXFP8 grouped GEMMs for MoE experts (Hopper, Triton): fprop, dgrad, wgrad.

Public ops (contracts; every operand is an MXFP8 pair (data float8_e4m3fn, scale uint8 E8M0) in the layout
kernels.mxfp8 defines; offs int32 cumulative group END rows, as torch._grouped_mm; groups may be empty;
rows at or after offs[-1] are padding):

  mxfp8_grouped_mm_fprop(a_data [M,K], a_scale [M,K/32], w_data [E,N,K], w_scale [E,N,K/32], offs,
                         out_dtype=bf16, *, block=32, w_tile=1) -> [M, N]
      out[g] = A[g] @ W[e]^T. Padding rows of the output are written as zeros.
  mxfp8_grouped_mm_dgrad(do_data [M,N], do_scale [M,N/32], w_data [E,N,K], w_scale [E,N/32,K], offs,
                         out_dtype=bf16, *, block=32, w_tile=1) -> [M, K]
      dX[g] = dO[g] @ W[e], W scaled along N. w_data may be any strided view; the kernel needs N contiguous
      (a view w_t.transpose(1, 2) of a contiguous [E, K, N] costs nothing, anything else is copied once).
  mxfp8_grouped_mm_wgrad(do_t_data [N,M], do_t_scale [N,M/32], a_t_data [K,M], a_t_scale [K,M/32], offs,
                         out_dtype=fp32, *, block=32, a_tile=1) -> [E, N, K]
      dW[e] = dO[g]^T @ A[g], both operands token-major and scaled along the token axis. Partial blocks: the
      scale blocks are the plain MXFP8 blocks of the whole [M, *] tensor along tokens (32 tokens from token
      0, what kernels.mxfp8.to_mxfp8_rowcol gives); a block straddling a group boundary carries one scale for
      both groups and each group sums only its own tokens. An empty group gives dW[e] = 0. M % 32 == 0.

The keyword `block` and `*_tile` declare how the caller quantized the operands; they change speed, never
the result for operands that satisfy them:
  block=32   plain MXFP8 (one scale per 1x32 block): promotion after every 32 of the reduction axis.
  block=64/128  the scales of each operand are equal across every aligned run of 64/128 along the reduction
             axis (e.g. blocks of 1x128 encoded as four equal 1x32 scales): promotion every 64/128.
  w_tile / a_tile = T > 1  the scale of W (fprop/dgrad) / A (wgrad) is also equal across aligned runs of T
             rows of the output's column axis (square TxT tiles satisfy it both ways): the promotion factor
             becomes a per-row vector. T must be a multiple of the kernel's column tile (128).
Declarations are checked on the device without a host sync (torch._assert_async) unless validate=False.

Backends (keyword `backend`, ONE switch for all three ops, picked by `pick_backend` below):
  "triton"   the Triton kernels of triton_mx.py: every block / tile, any device Triton runs on (CPU: interpreter).
  "cutlass"  CUTLASS 4.2's sm_90a blockwise-scaled grouped GEMM (cutlass_backend.py; built at first use):
             block=128 with w_tile / a_tile = 128 only, reduction % 128 == 0, bf16 fprop/dgrad and fp32/bf16
             wgrad outputs; wgrad also needs every group on a multiple of 128 tokens (asserted on the device).
             Measured faster than Triton there (H100: 1.28-1.65x bf16 against Triton's 0.94-1.39x, identical
             output; benchmarks/results/mxfp8_grouped_gemm_backends-h100-2026-11-23.md, NOTES.md).
  "auto"     "cutlass" where it applies and builds (for wgrad only when the caller declares token_align=128:
             alignment cannot be checked on the host without a sync), else "triton"; logs its choice once.
  "gluon"    gluon_mx.py (sm_90 only; needs w_tile / a_tile a multiple of 128): the true-1x32 kernels that keep
             the next wgmma in flight while a partial is promoted; measured 1.4-1.8x the Triton kernels at
             block=32 (H100, 2026-11-25: 0.91-1.13x bf16, NOTES.md "Gluon mx32").
  "auto"     for block=128 + tiles: "cutlass" (above); for block=32 + tiles on sm_90: "gluon"; else "triton".
A named backend that cannot run raises; it never falls back.
Operands must index within 2^31 elements (32-bit offsets in the kernels); larger calls raise ValueError.
Launch configurations (FPROP_CONFIGS / WGRAD_CONFIGS) come from H200 sweeps; see NOTES.md for the numbers.

All three are torch.library custom ops (titan_fp8::mxfp8_grouped_mm_{fprop,dgrad,wgrad}) with fake
implementations, so torch.compile and FSDP2 trace through them. References: reference.py (float64).
Operands with shared scales: quant.py (plain PyTorch, any device) and quant_triton.py (one read, GPU;
under torch.compile the triton op titan_fp8::mxfp8_blocked_rowcol_traced), bit-identical to each other; the
fused x / dO copies on sm_90 through quant_cuda.py's CUDA kernel (quant_triton's TITAN_FP8_ROWCOL_QUANT switch).
The dense mx128 / blockwise GEMMs of the Linears run on cuBLAS through cublas_blockwise.py's op
(titan_fp8::blockwise_scaled_mm, a C++ CUDA kernel; switch TITAN_FP8_BLOCKWISE_MM).
"""

from __future__ import annotations

import logging
import os

import torch

from .reference import (  # noqa: F401
    grouped_mm_dgrad_reference,
    grouped_mm_fprop_reference,
    grouped_mm_wgrad_reference,
)

__all__ = [
    "mxfp8_grouped_mm_fprop", "mxfp8_grouped_mm_dgrad", "mxfp8_grouped_mm_wgrad",
    "grouped_mm_fprop_reference", "grouped_mm_dgrad_reference", "grouped_mm_wgrad_reference",
    "FPROP_CONFIGS", "WGRAD_CONFIGS", "BACKENDS", "pick_backend",
]

BACKENDS = ("auto", "triton", "cutlass", "gluon")
_log = logging.getLogger(__name__)
_logged = set()

F8 = torch.float8_e4m3fn
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCKS = (32, 64, 128)
COL_TILE = 128  # BN of the fprop/dgrad kernel and BN/BK of the wgrad kernel when a *_tile is declared

# Launch configurations, keyed by (block, tiled), chosen from device sweeps on H200 (NOTES.md;
# benchmarks/mxfp8_grouped_gemm_sweep.py). fprop/dgrad: (BM, BN, SUB, num_warps, num_stages, GROUP_M[, knobs]);
# a pair (long, short) picks `long` when the reduction length is > 4096.
_TMA = {"USE_TMA": True}
FPROP_CONFIGS = {
    (32, False): (64, 128, 1, 4, 4, 8),
    (32, True): ((128, 128, 1, 8, 4, 8), (64, 128, 1, 4, 6, 8, _TMA)),
    (64, False): (64, 128, 1, 4, 4, 8),
    (64, True): (64, 128, 1, 4, 4, 8, _TMA),
    (128, False): (64, 128, 1, 4, 4, 8),
    (128, True): ((128, 128, 1, 8, 4, 8, _TMA), (64, 128, 1, 4, 4, 8, _TMA)),
}
# wgrad: (BN, BK, num_warps, num_stages, GROUP_N[, knobs])
WGRAD_CONFIGS = {
    (32, False): (64, 128, 4, 4, 8),
    (32, True): (128, 128, 8, 4, 8, _TMA),
    (64, False): (64, 128, 4, 4, 8),
    (64, True): (64, 128, 4, 4, 8, _TMA),
    (128, False): (64, 128, 4, 4, 8),
    (128, True): (64, 128, 4, 4, 8, _TMA),
}


def _pick(cfg, reduction):
    if isinstance(cfg[0], tuple):
        return cfg[0] if reduction > 4096 else cfg[1]
    return cfg


def _tma_ok(*ts):
    # TMA descriptors need 16-byte aligned bases and row strides, and contiguous rows
    return all(t.is_cuda and t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and (t.stride(-2) % 16 == 0)
               for t in ts)


# ------------------------------------------------------------------------------------------ validation
def _fail(who, msg):
    raise ValueError(f"{who}: {msg}")


def _check_pair(who, name, data, scale, shape_len):
    if not isinstance(data, torch.Tensor) or data.dtype != F8:
        _fail(who, f"{name}_data must be a torch.float8_e4m3fn tensor, got "
                   f"{getattr(data, 'dtype', type(data).__name__)}")
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.uint8:
        _fail(who, f"{name}_scale must be a torch.uint8 (E8M0) tensor, got "
                   f"{getattr(scale, 'dtype', type(scale).__name__)}")
    if data.ndim != shape_len:
        _fail(who, f"{name}_data must be {shape_len}-D, got shape {tuple(data.shape)}")


def _check_offs(who, offs, E):
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.ndim != 1:
        _fail(who, f"offs must be a 1-D torch.int32 tensor, got "
                   f"{getattr(offs, 'dtype', type(offs).__name__)} shape {tuple(getattr(offs, 'shape', ()))}")
    if E is not None and offs.shape[0] != E:
        _fail(who, f"offs has {offs.shape[0]} groups but the weight has E={E} experts")


def _check_block(who, block, tile, tile_name):
    if block not in _BLOCKS:
        _fail(who, f"block={block}; allowed: {_BLOCKS}")
    if tile != 1 and (tile <= 0 or tile % COL_TILE != 0):
        _fail(who, f"{tile_name}={tile}; allowed: 1 or a multiple of {COL_TILE}")


def _assert_runs_equal(scale: torch.Tensor, dim: int, run: int, what: str):
    """Device-side check that `scale` is constant over aligned runs of `run` entries along `dim` (a
    trailing partial run too). No host sync: a violation trips a device assert."""
    if run <= 1 or scale.numel() == 0:
        return
    s = scale.movedim(dim, -1)
    n = s.shape[-1]
    pad = (-n) % run
    if pad:
        s = torch.cat([s, s[..., -1:].expand(*s.shape[:-1], pad)], dim=-1)
    s = s.reshape(*s.shape[:-1], -1, run)
    torch._assert_async((s == s[..., :1]).all(), f"mxfp8 grouped GEMM: {what} is not constant over runs of "
                                                  f"{run} (declared by block/tile)")


def _grid_m_tiles(M, E, BM):
    # upper bound on the m-tiles of all groups (each group adds at most one partial tile) plus padding
    return triton_cdiv(M, BM) + E + 1


def triton_cdiv(a, b):
    return (a + b - 1) // b


_I32 = 2**31


def _check_int32_indexing(who, **tensors):
    # The kernels index with 32-bit offsets (the measured, fastest code); refuse what would overflow them.
    for name, t in tensors.items():
        if t.numel() and sum((n - 1) * st for n, st in zip(t.shape, t.stride())) >= _I32:
            raise ValueError(f"{who}: {name} of shape {tuple(t.shape)} needs 64-bit indexing (>= 2^31 "
                             f"elements); split the call along its token axis")


# ------------------------------------------------------------------------------------------ backend switch
def pick_backend(who, pass_, backend, t, block, tile, reduction, out_cols, out_dtype, token_align=1):
    """The backend that runs this call: "triton" or "cutlass" (see the module docstring)."""
    if backend not in BACKENDS:
        _fail(who, f"backend={backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    if backend == "triton":
        return "triton"
    if backend == "gluon" or (backend == "auto" and block == 32):
        return _pick_gluon(who, pass_, backend, t, tile)
    from . import cutlass_backend as cb
    reason = cb.device_reason(t) or cb.unsupported_reason(pass_, block, tile, reduction, out_cols, out_dtype)
    if reason is None and pass_ == "wgrad" and backend == "auto" and token_align % cb.GRAN:
        reason = f"token_align={token_align} (declare token_align=128 when every group starts on 128 tokens)"
    if reason is None:
        try:
            cb.load()
        except cb.CutlassUnavailable as e:
            reason = str(e)
    if backend == "cutlass":
        if reason is not None:
            raise cb.CutlassUnavailable(f"{who}: backend='cutlass' cannot run: {reason}")
        return "cutlass"
    return _log_auto(pass_, "triton" if reason else "cutlass", reason,
                     "CUTLASS sm_90a blockwise, the fastest measured for mx128")


def _log_auto(pass_, choice, reason, why):
    """Say once per (pass, choice, reason) what "auto" picked. Not while torch.compile traces: a logging call
    there is a graph break, which made dynamo run a whole compiled autograd op around these GEMMs eagerly (the
    fused MoE expert op, benchmarks/moe_layer.py run 2)."""
    if not torch.compiler.is_compiling() and (pass_, choice, reason) not in _logged:
        _logged.add((pass_, choice, reason))
        _log.info("mxfp8 grouped GEMM %s: backend 'auto' -> %s (%s)", pass_, choice, reason or why)
    return choice


def _pick_gluon(who, pass_, backend, t, tile):
    reason = None
    if tile % COL_TILE:
        tname = "a_tile" if pass_ == "wgrad" else "w_tile"
        reason = f"{tname}={tile}; the Gluon kernels need the {COL_TILE}-row-tiled scale ({tname}=1 runs on 'triton')"
    elif not t.is_cuda:
        reason = f"tensors are on {t.device}, the Gluon kernels need a CUDA device"
    elif torch.cuda.get_device_capability(t.device) != (9, 0):
        reason = f"device capability {torch.cuda.get_device_capability(t.device)}; the Gluon kernels are sm_90 only"
    if backend == "gluon":
        if reason is not None:
            _fail(who, f"backend='gluon' cannot run: {reason}")
        return "gluon"
    return _log_auto(pass_, "triton" if reason else "gluon", reason,
                     "Gluon sm_90, the fastest measured for 1x32 blocks")


# ------------------------------------------------------------------------------------------ launchers
def _launch_nt(a, sa, b, sb, offs, out_dtype, block, tiled, config=None):
    """out[g] = A[g] @ B[e]^T with A [M, R] (R contiguous), B [E, C, R] (R contiguous), scales addressed by
    (row, reduction-block) strides: sa [M, R/32] and sb [E, C, R/32] as strided views."""
    from .triton_mx import _mx_grouped_mm_kernel

    M, R = a.shape
    E, C, _ = b.shape
    out = torch.empty(M, C, dtype=out_dtype, device=a.device)
    if M == 0 or C == 0:
        return out
    _check_int32_indexing("mxfp8 grouped GEMM", A=a, B=b, out=out)
    cfg = config or _pick(FPROP_CONFIGS[(block, tiled)], R)
    BM, BN, SUB, warps, stages, GROUP_M = cfg[:6]
    extra = dict(cfg[6]) if len(cfg) > 6 else {}  # experimental knobs: PIPE, USE_TMA
    if extra.get("USE_TMA") and config is None and not (_tma_ok(a) and b.is_contiguous() and _tma_ok(b)):
        extra.pop("USE_TMA")
    if R == 0:
        return out.zero_()
    num_m = _grid_m_tiles(M, E, BM)
    grid = (num_m * triton_cdiv(C, BN),)
    even_k = R % (block * SUB) == 0
    if extra.get("USE_TMA") and not even_k and SUB > 1:
        raise ValueError("USE_TMA with SUB > 1 needs K % (block * SUB) == 0")
    if extra.get("PIPE") and not (tiled and even_k and SUB == 1):
        raise ValueError("PIPE needs a tiled B, SUB == 1 and K % block == 0")
    if extra.get("USE_TMA"):
        from triton.tools.tensor_descriptor import TensorDescriptor
        extra["a_desc"] = TensorDescriptor.from_tensor(a, [BM, block])
        extra["b_desc"] = TensorDescriptor.from_tensor(b.view(E * C, R), [BN, block])
    _mx_grouped_mm_kernel[grid](
        a, sa, b, sb, out, offs,
        M, C, R, num_m,
        a.stride(0), sa.stride(0), sa.stride(1),
        b.stride(0), b.stride(1), sb.stride(0), sb.stride(1), sb.stride(2),
        out.stride(0),
        BM=BM, BN=BN, SK=block, SUB=SUB, B_TILE=tiled, EVEN_K=even_k, GROUP_M=GROUP_M, E=E, SOFT_RNE=_INTERPRET,
        num_warps=warps, num_stages=stages, **extra,
    )
    return out


def _launch_wgrad(x, sx, y, sy, offs, out_dtype, block, tiled, config=None):
    from .triton_mx import _mx_grouped_wgrad_kernel

    N, M = x.shape
    K = y.shape[0]
    E = offs.shape[0]
    out = torch.empty(E, N, K, dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    if M == 0:
        return out.zero_()
    _check_int32_indexing("mxfp8 grouped wgrad", dO_t=x, A_t=y, out=out)
    cfg = config or _pick(WGRAD_CONFIGS[(block, tiled)], M)
    BN, BK, warps, stages, GROUP_N = cfg[:5]
    extra = dict(cfg[5]) if len(cfg) > 5 else {}  # experimental knobs: USE_TMA
    if extra.get("USE_TMA") and config is None and not _tma_ok(x, y):
        extra.pop("USE_TMA")
    if extra.get("USE_TMA"):
        from triton.tools.tensor_descriptor import TensorDescriptor
        extra["x_desc"] = TensorDescriptor.from_tensor(x, [BN, block])
        extra["y_desc"] = TensorDescriptor.from_tensor(y, [BK, block])
    grid = (triton_cdiv(N, BN) * triton_cdiv(K, BK), E)
    _mx_grouped_wgrad_kernel[grid](
        x, sx, y, sy, out, offs,
        M, N, K,
        x.stride(0), sx.stride(0), sx.stride(1),
        y.stride(0), sy.stride(0), sy.stride(1),
        out.stride(0), out.stride(1),
        BN=BN, BK=BK, ST=block, Y_TILE=tiled, GROUP_N=GROUP_N, SOFT_RNE=_INTERPRET,
        num_warps=warps, num_stages=stages, **extra,
    )
    return out


# ------------------------------------------------------------------------------------------ custom ops
@torch.library.custom_op("titan_fp8::mxfp8_grouped_mm_fprop", mutates_args=())
def _fprop_op(a_data: torch.Tensor, a_scale: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor,
              offs: torch.Tensor, out_dtype: torch.dtype, block: int, w_tile: int) -> torch.Tensor:
    a = a_data if a_data.stride(-1) == 1 else a_data.contiguous()
    w = w_data if w_data.stride(-1) == 1 else w_data.contiguous()
    # sb as [E, N, K/32] strides: (e, row n, block kb)
    return _launch_nt(a, a_scale, w, w_scale, offs, out_dtype, block, w_tile > 1)


@_fprop_op.register_fake
def _(a_data, a_scale, w_data, w_scale, offs, out_dtype, block, w_tile):
    return a_data.new_empty((a_data.shape[0], w_data.shape[1]), dtype=out_dtype)


@torch.library.custom_op("titan_fp8::mxfp8_grouped_mm_dgrad", mutates_args=())
def _dgrad_op(do_data: torch.Tensor, do_scale: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor,
              offs: torch.Tensor, out_dtype: torch.dtype, block: int, w_tile: int) -> torch.Tensor:
    do = do_data if do_data.stride(-1) == 1 else do_data.contiguous()
    wt = w_data.transpose(1, 2)  # [E, K, N]: rows k, reduction n
    if wt.stride(-1) != 1:
        wt = wt.contiguous()
    # w_scale [E, N/32, K] seen as [E, K (row), N/32 (block)]
    return _launch_nt(do, do_scale, wt, w_scale.transpose(1, 2), offs, out_dtype, block, w_tile > 1)


@_dgrad_op.register_fake
def _(do_data, do_scale, w_data, w_scale, offs, out_dtype, block, w_tile):
    return do_data.new_empty((do_data.shape[0], w_data.shape[2]), dtype=out_dtype)


@torch.library.custom_op("titan_fp8::mxfp8_grouped_mm_wgrad", mutates_args=())
def _wgrad_op(do_t_data: torch.Tensor, do_t_scale: torch.Tensor, a_t_data: torch.Tensor,
              a_t_scale: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype, block: int,
              a_tile: int) -> torch.Tensor:
    x = do_t_data if do_t_data.stride(-1) == 1 else do_t_data.contiguous()
    y = a_t_data if a_t_data.stride(-1) == 1 else a_t_data.contiguous()
    return _launch_wgrad(x, do_t_scale, y, a_t_scale, offs, out_dtype, block, a_tile > 1)


@_wgrad_op.register_fake
def _(do_t_data, do_t_scale, a_t_data, a_t_scale, offs, out_dtype, block, a_tile):
    return do_t_data.new_empty((offs.shape[0], do_t_data.shape[0], a_t_data.shape[0]), dtype=out_dtype)


# Gluon backend (gluon_mx.py, sm_90 only): true 1x32 promotion with the wgmma of step j+1 in flight while
# step j is promoted; needs the 128-row-tiled scale of W (fprop/dgrad) / A^T (wgrad). Same signatures.
@torch.library.custom_op("titan_fp8::mxfp8_grouped_mm_fprop_gluon", mutates_args=())
def _fprop_gluon_op(a_data: torch.Tensor, a_scale: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor,
                    offs: torch.Tensor, out_dtype: torch.dtype, block: int, w_tile: int) -> torch.Tensor:
    from .gluon_mx import launch_nt
    a = a_data if a_data.stride(-1) == 1 else a_data.contiguous()
    w = w_data.contiguous()
    _check_int32_indexing("mxfp8_grouped_mm_fprop", A=a, W=w)
    return launch_nt(a, a_scale, w, w_scale, offs, out_dtype)


@torch.library.custom_op("titan_fp8::mxfp8_grouped_mm_dgrad_gluon", mutates_args=())
def _dgrad_gluon_op(do_data: torch.Tensor, do_scale: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor,
                    offs: torch.Tensor, out_dtype: torch.dtype, block: int, w_tile: int) -> torch.Tensor:
    from .gluon_mx import launch_nt
    do = do_data if do_data.stride(-1) == 1 else do_data.contiguous()
    wt = w_data.transpose(1, 2).contiguous()  # [E, K, N]: rows k, reduction n (free for a transposed view)
    _check_int32_indexing("mxfp8_grouped_mm_dgrad", dO=do, W=wt)
    return launch_nt(do, do_scale, wt, w_scale.transpose(1, 2), offs, out_dtype)


@torch.library.custom_op("titan_fp8::mxfp8_grouped_mm_wgrad_gluon", mutates_args=())
def _wgrad_gluon_op(do_t_data: torch.Tensor, do_t_scale: torch.Tensor, a_t_data: torch.Tensor,
                    a_t_scale: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype, block: int,
                    a_tile: int) -> torch.Tensor:
    from .gluon_mx import launch_wgrad
    x = do_t_data if do_t_data.stride(-1) == 1 else do_t_data.contiguous()
    y = a_t_data if a_t_data.stride(-1) == 1 else a_t_data.contiguous()
    out_elems = offs.shape[0] * x.shape[0] * y.shape[0]
    if out_elems >= _I32:
        raise ValueError(f"mxfp8_grouped_mm_wgrad: dW of {out_elems} elements needs 64-bit indexing")
    _check_int32_indexing("mxfp8_grouped_mm_wgrad", dO_t=x, A_t=y)
    return launch_wgrad(x, do_t_scale, y, a_t_scale, offs, out_dtype)


for _op, _ref in ((_fprop_gluon_op, _fprop_op), (_dgrad_gluon_op, _dgrad_op), (_wgrad_gluon_op, _wgrad_op)):
    _op.register_fake(_ref._abstract_fn)

# backend name -> (fprop, dgrad, wgrad) custom ops
_BACKEND_OPS = {"triton": (_fprop_op, _dgrad_op, _wgrad_op), "gluon": (_fprop_gluon_op, _dgrad_gluon_op, _wgrad_gluon_op)}



# ------------------------------------------------------------------------------------------ public API
def mxfp8_grouped_mm_fprop(a_data, a_scale, w_data, w_scale, offs, out_dtype=torch.bfloat16, *, block=32,
                           w_tile=1, validate=True, backend="auto"):
    """out[g] = A[g] @ W[e]^T (see the module docstring). Returns [M, N] out_dtype."""
    who = "mxfp8_grouped_mm_fprop"
    _check_pair(who, "a", a_data, a_scale, 2)
    _check_pair(who, "w", w_data, w_scale, 3)
    M, K = a_data.shape
    E, N, Kw = w_data.shape
    if Kw != K:
        _fail(who, f"a_data is {tuple(a_data.shape)} but w_data is {tuple(w_data.shape)}: K differs")
    if K % 32:
        _fail(who, f"K={K} is not a multiple of 32")
    if tuple(a_scale.shape) != (M, K // 32):
        _fail(who, f"a_scale.shape is {tuple(a_scale.shape)}; expected {(M, K // 32)} (along K)")
    if tuple(w_scale.shape) != (E, N, K // 32):
        _fail(who, f"w_scale.shape is {tuple(w_scale.shape)}; expected {(E, N, K // 32)} (along K)")
    _check_offs(who, offs, E)
    _check_block(who, block, w_tile, "w_tile")
    if validate:
        _assert_runs_equal(a_scale, 1, block // 32, "a_scale along K")
        _assert_runs_equal(w_scale, 2, block // 32, "w_scale along K")
        _assert_runs_equal(w_scale, 1, w_tile, "w_scale along N")
    choice = pick_backend(who, "fprop", backend, a_data, block, w_tile, K, N, out_dtype)
    if choice == "cutlass":
        from . import cutlass_backend
        return cutlass_backend.fprop(a_data, a_scale, w_data, w_scale, offs)
    return _BACKEND_OPS[choice][0](a_data, a_scale, w_data, w_scale, offs, out_dtype, block, w_tile)


def mxfp8_grouped_mm_dgrad(do_data, do_scale, w_data, w_scale, offs, out_dtype=torch.bfloat16, *, block=32,
                           w_tile=1, validate=True, backend="auto", out=None, first_group=0):
    """dX[g] = dO[g] @ W[e], W [E, N, K] scaled along N (scale [E, N/32, K]). Returns [M, K] out_dtype.

    In parts (CUTLASS only): with out ([M, K] bf16) given, W holds the experts first_group .. first_group + E - 1
    of offs (which has all of them); only those groups' rows of out are written (and out's rows past offs[-1],
    zeros, by the part with the last expert). The fused MoE backward runs w13's dgrad in two such parts, so only
    half of the float8 W13^T exists at a time. Returns out."""
    who = "mxfp8_grouped_mm_dgrad"
    _check_pair(who, "do", do_data, do_scale, 2)
    _check_pair(who, "w", w_data, w_scale, 3)
    M, N = do_data.shape
    E, Nw, K = w_data.shape
    if Nw != N:
        _fail(who, f"do_data is {tuple(do_data.shape)} but w_data is {tuple(w_data.shape)}: N differs")
    if N % 32:
        _fail(who, f"N={N} is not a multiple of 32")
    if tuple(do_scale.shape) != (M, N // 32):
        _fail(who, f"do_scale.shape is {tuple(do_scale.shape)}; expected {(M, N // 32)} (along N)")
    if tuple(w_scale.shape) != (E, N // 32, K):
        _fail(who, f"w_scale.shape is {tuple(w_scale.shape)}; expected {(E, N // 32, K)} (W scaled along N)")
    if out is None and first_group:
        _fail(who, f"first_group={first_group} needs out= (the full output the part writes into)")
    if out is not None:
        if not isinstance(first_group, int) or first_group < 0:
            _fail(who, f"first_group={first_group!r} must be an int >= 0")
        _check_offs(who, offs, None)
        if first_group + E > offs.shape[0]:
            _fail(who, f"experts {first_group}..{first_group + E - 1} (first_group + w_data's E={E}) are not all "
                       f"among offs' {offs.shape[0]} groups")
        if tuple(out.shape) != (M, K) or out.dtype != torch.bfloat16 or out.device != do_data.device:
            _fail(who, f"out is {tuple(out.shape)} {out.dtype} on {out.device}; expected {(M, K)} torch.bfloat16 "
                       f"on {do_data.device}")
        if out_dtype != torch.bfloat16:
            _fail(who, f"out_dtype={out_dtype} with out=: the CUTLASS dgrad writes bfloat16")
    else:
        _check_offs(who, offs, E)
    _check_block(who, block, w_tile, "w_tile")
    if validate:
        _assert_runs_equal(do_scale, 1, block // 32, "do_scale along N")
        _assert_runs_equal(w_scale, 1, block // 32, "w_scale along N")
        _assert_runs_equal(w_scale, 2, w_tile, "w_scale along K")
    choice = pick_backend(who, "dgrad", backend, do_data, block, w_tile, N, K, out_dtype)
    if out is not None:
        if choice != "cutlass":
            _fail(who, f"out= (dgrad in parts of the experts) runs on the CUTLASS kernels only; backend={backend!r} "
                       f"picked {choice!r}")
        from . import cutlass_backend
        return cutlass_backend.dgrad_into(do_data, do_scale, w_data, w_scale, offs, out, first_group)
    if choice == "cutlass":
        from . import cutlass_backend
        return cutlass_backend.dgrad(do_data, do_scale, w_data, w_scale, offs)
    return _BACKEND_OPS[choice][1](do_data, do_scale, w_data, w_scale, offs, out_dtype, block, w_tile)


def mxfp8_grouped_mm_wgrad(do_t_data, do_t_scale, a_t_data, a_t_scale, offs, out_dtype=torch.float32, *,
                           block=32, a_tile=1, validate=True, backend="auto", token_align=1):
    """dW[e] = dO[g]^T @ A[g] from token-major copies (see the module docstring). Returns [E, N, K].
    token_align: the caller's promise that every group boundary is a multiple of it (checked on the device
    when validate); 128 lets "auto" pick the CUTLASS kernel."""
    who = "mxfp8_grouped_mm_wgrad"
    _check_pair(who, "do_t", do_t_data, do_t_scale, 2)
    _check_pair(who, "a_t", a_t_data, a_t_scale, 2)
    N, M = do_t_data.shape
    K, Ma = a_t_data.shape
    if Ma != M:
        _fail(who, f"do_t_data is {tuple(do_t_data.shape)} but a_t_data is {tuple(a_t_data.shape)}: tokens differ")
    if M % 32:
        _fail(who, f"M={M} tokens is not a multiple of 32 (pad the token axis)")
    if tuple(do_t_scale.shape) != (N, M // 32):
        _fail(who, f"do_t_scale.shape is {tuple(do_t_scale.shape)}; expected {(N, M // 32)} (along tokens)")
    if tuple(a_t_scale.shape) != (K, M // 32):
        _fail(who, f"a_t_scale.shape is {tuple(a_t_scale.shape)}; expected {(K, M // 32)} (along tokens)")
    _check_offs(who, offs, None)
    if out_dtype not in (torch.float32, torch.bfloat16):
        _fail(who, f"out_dtype={out_dtype}; allowed: torch.float32, torch.bfloat16")
    _check_block(who, block, a_tile, "a_tile")
    if not isinstance(token_align, int) or token_align < 1:
        _fail(who, f"token_align={token_align!r}; expected a positive int")
    if validate:
        _assert_runs_equal(do_t_scale, 1, block // 32, "do_t_scale along tokens")
        _assert_runs_equal(a_t_scale, 1, block // 32, "a_t_scale along tokens")
        _assert_runs_equal(a_t_scale, 0, a_tile, "a_t_scale along K")
        if token_align > 1:
            torch._assert_async((offs % token_align == 0).all(), f"{who}: offs not multiples of token_align="
                                                                 f"{token_align}")
    choice = pick_backend(who, "wgrad", backend, do_t_data, block, a_tile, M, K, out_dtype, token_align)
    if choice == "cutlass":
        from . import cutlass_backend
        return cutlass_backend.wgrad(do_t_data, do_t_scale, a_t_data, a_t_scale, offs, out_dtype)
    return _BACKEND_OPS[choice][2](do_t_data, do_t_scale, a_t_data, a_t_scale, offs, out_dtype, block, a_tile)
