"""One-read Triton quantizers for GEMM operands with shared scales (quant.py's rule, on GPU).

    to_mx128_blockwise(x, tile, do_row, do_col)   (the mx128 MXFP8 Linear; see its docstring)
      the same numbers with row_block = col_block = 128 (and 128x128 tiles if tile), but the scales written
      once per region as fp32 factors in the layouts cuBLAS's blockwise GEMMs read.

    to_mxfp8_blocked_rowcol(x, row_block, row_tile, col_block, col_tile, do_row, do_col, limit)

x [M, K] or [B, M, K] (bf16/fp16/fp32) is read once; it writes
  row copy: data [.., M, K], scale [.., M, K/32]   == quant.to_mxfp8_blocked(x, -1, row_block, row_tile)
  col copy: data [.., K, MC], scale [.., K, MC/32] == quant.to_mxfp8_blocked(x'^T, -1, col_block, col_tile)
where x' is x with rows at or past limit[0] (a device scalar, e.g. offs[-1]; no host sync) set to zero and
MC = M rounded up to 32 (the zero rows appended). The column copy is token-major: what wgrad reads (x^T,
dO^T) and what dgrad reads for weights (W^T [E, K, N] scaled along N).

The format's arithmetic (exponent from the amax bits, the e4m3 encoding, NaN blocks, the interpreter-safe
paths) is kernels/mxfp8/triton.py's, imported from there; this file only arranges tiles: 128 x 128 per
program (64 x 128 for some 32-token column copies: rowcol_launch), one scale per row_block x row_tile (row copy)
and col_block x col_tile (col copy) region,
written into every 1x32 block it covers. Bit-identical to quant.py (tests: CPU interpreted, GPU compiled).
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from kernels.grouped_gemm.quant import blockwise_scale_buffers
from kernels.launch_table import cached_table, next_pow2, table_member
from kernels.mxfp8.triton import (
    _INTERPRET,
    _as_kernel_input,
    _amax_bits_raw,
    _encode,
    _exponent_from_amax_bits,
    _load_raw,
    _multiplier,
    _scale_byte,
    _widen,
    default_hw_cast,
)

BM = 128  # rows (tokens / N) per program
BK = 128  # columns (features / K) per program

# Which kernel makes the fused row + column copies of a bf16 activation / gradient (the expert op's x and dO:
# to_mxfp8_blocked_rowcol with do_row and do_col, row_tile 1, in quant_cuda.LAYOUTS) on sm_90:
#   "auto"    the CUDA C++ kernel of quant_cuda.py (1.05-1.19x this file's on an H100, same bytes) where it builds,
#             else this file's kernel; the choice is logged once per process
#   "cuda"    the CUDA kernel; a call it serves that cannot run there (no nvcc, not sm_90) raises
#   "triton"  this file's kernel
# Every other call (weights, one copy, fp16 / fp32 input, a forced hw_cast / num_warps / tile, the interpreter) runs
# this file's kernel under every setting. Environment: TITAN_FP8_ROWCOL_QUANT.
ROWCOL_QUANT_BACKENDS = ("auto", "cuda", "triton")
_log = logging.getLogger(__name__)
_logged: set = set()


def rowcol_quant_backend() -> str:
    v = os.environ.get("TITAN_FP8_ROWCOL_QUANT", "auto")
    if v not in ROWCOL_QUANT_BACKENDS:
        raise ValueError(f"TITAN_FP8_ROWCOL_QUANT={v!r}; allowed: {ROWCOL_QUANT_BACKENDS}")
    return v


def _cuda_rowcol(x3, row_block, row_tile, col_block, col_tile, do_row, do_col):
    """quant_cuda when the switch says so and this call is one it makes, else None (then Triton)."""
    if _INTERPRET or not x3.is_cuda:
        return None
    backend = rowcol_quant_backend()
    if backend == "triton":
        return None
    from kernels.grouped_gemm import quant_cuda
    if not (do_row and do_col and row_tile == 1 and (row_block, col_block, col_tile) in quant_cuda.LAYOUTS
            and x3.dtype == torch.bfloat16):
        return None  # not a call the switch covers
    why = quant_cuda.unsupported_reason(x3, row_block, row_tile, col_block, col_tile, do_row, do_col)
    if why is None:
        try:
            quant_cuda.load()
        except quant_cuda.CutlassUnavailable as e:
            why = str(e)
    if why is not None:
        if backend == "cuda":
            raise RuntimeError(f"TITAN_FP8_ROWCOL_QUANT=cuda: the CUDA rowcol quantizer cannot run this call: {why}")
        if "triton" not in _logged:
            _logged.add("triton")
            _log.warning("rowcol quantizer: auto picked the Triton kernel (%s)", why)
        return None
    if backend not in _logged:
        _logged.add(backend)
        _log.info("rowcol quantizer: %s picked the CUDA kernel (kernels/grouped_gemm/quant_cuda.py)", backend)
    return quant_cuda


@triton.jit
def _e8m0_fp32(sb):
    """E8M0 byte (int32 0..255) -> fp32 2^(sb-127) (sb 0: the subnormal 2^-127), NaN for 255."""
    f = tl.where(sb == 0, 0x00400000, sb << 23).to(tl.float32, bitcast=True)
    return tl.where(sb == 255, float("nan"), f)


@triton.jit
def _blocked_rowcol_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, limit_ptr,
    M, K, MC, sxb, sqrb, ssrb, sqcb, sscb,
    BM: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr, RT: tl.constexpr, CB: tl.constexpr,
    CT: tl.constexpr, DO_ROW: tl.constexpr, DO_COL: tl.constexpr, USE_LIMIT: tl.constexpr,
    HW_CAST: tl.constexpr, IS_BF16: tl.constexpr,
    F32: tl.constexpr = False, sr0=0, sr1=0, sc0=0, sc1=0,
):
    # F32 (RB == CB == BK == 128): instead of E8M0 bytes per 1x32 block, ONE fp32 factor 2^e per scale region
    # (what cuBLAS's blockwise GEMMs multiply by), stored at s + i * s?0 + j * s?1 for region (i, j) of the copy:
    # any layout cuBLAS wants (outer-major 1x128, padded K-block-major tiles), with no relayout afterwards.
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    m0 = pid_m.to(tl.int64) * BM
    k0 = pid_k.to(tl.int64) * BK
    r = tl.arange(0, BM)
    c = tl.arange(0, BK)
    rows = pid_m * BM + r
    rmask = rows < M
    cmask = pid_k * BK + c < K
    offs = r[:, None] * K + c[None, :]
    # the tile stays in its storage type and each encode widens its elements: as fp32 (with its int32 magnitude
    # bits) a bf16 tile took 163 registers, one CTA per SM, and the mx128 copies ran at 1.5 TB/s (101, 1.9 TB/s now)
    x = _load_raw(x_ptr + b * sxb + m0 * K + k0, offs, rmask[:, None] & cmask[None, :], IS_BF16)
    if DO_ROW:
        ar = _amax_bits_raw(tl.reshape(x, [BM, BK // RB, RB]), 2, IS_BF16)  # [BM, BK/RB]
        if RT > 1:  # RT == BM: one scale per (tile rows x RB)
            ar = tl.broadcast_to(tl.max(ar, axis=0)[None, :], [BM, BK // RB])
        er = _exponent_from_amax_bits(ar)
        xr = _widen(tl.reshape(x, [BM, BK // RB, RB]), IS_BF16)
        cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
        tl.store(qr_ptr + b * sqrb + m0 * K + k0 + offs, tl.reshape(cr, [BM, BK]),
                 mask=rmask[:, None] & cmask[None, :])
        if F32:  # [BM, 1] regions: one per row (RT == 1) or one per tile (RT == BM, row 0 stores it)
            f = tl.reshape(_e8m0_fp32(_scale_byte(ar, er)), [BM])
            i = rows.to(tl.int64) // RT
            tl.store(sr_ptr + i * sr0 + pid_k * sr1, f, mask=rmask & ((r % RT) == 0))
        else:
            sb = _scale_byte(ar, er).to(tl.uint8)
            sb32 = tl.reshape(tl.broadcast_to(sb[:, :, None], [BM, BK // RB, RB // 32]), [BM, BK // 32])
            kb = tl.arange(0, BK // 32)
            tl.store(sr_ptr + b * ssrb + m0 * (K // 32) + pid_k * (BK // 32) + r[:, None] * (K // 32) + kb[None, :],
                     sb32, mask=rmask[:, None] & (pid_k * (BK // 32) + kb < K // 32)[None, :])
    if DO_COL:
        if USE_LIMIT:
            keep = rows < tl.load(limit_ptr)
            x = tl.where(keep[:, None], x, tl.zeros_like(x))
        ac = _amax_bits_raw(tl.reshape(x, [BM // CB, CB, BK]), 1, IS_BF16)  # [BM/CB, BK]
        if CT > 1:  # CT == BK: one scale per (CB rows x tile columns)
            ac = tl.broadcast_to(tl.max(ac, axis=1)[:, None], [BM // CB, BK])
        ec = _exponent_from_amax_bits(ac)
        xc = _widen(tl.reshape(x, [BM // CB, CB, BK]), IS_BF16)
        cc = _encode(xc * _multiplier(ac, ec, HW_CAST)[:, None, :], (ac >= 0x7F800000)[:, None, :], HW_CAST)
        cc = tl.reshape(cc, [BM, BK])
        tl.store(qc_ptr + b * sqcb + k0 * MC + m0 + c[None, :] * MC + r[:, None], cc,
                 mask=(rows < MC)[:, None] & cmask[None, :])
        if F32:  # [1, BK] regions: one per column of x (CT == 1) or one per tile (CT == BK, column 0 stores it)
            f = tl.reshape(_e8m0_fp32(_scale_byte(ac, ec)), [BK])
            cols = pid_k * BK + c
            j = cols.to(tl.int64) // CT
            tl.store(sc_ptr + j * sc0 + pid_m * sc1, f, mask=cmask & ((c % CT) == 0))
        else:
            sc = _scale_byte(ac, ec).to(tl.uint8)
            sc32 = tl.reshape(tl.broadcast_to(sc[:, None, :], [BM // CB, CB // 32, BK]), [BM // 32, BK])
            mb = tl.arange(0, BM // 32)
            tl.store(sc_ptr + b * sscb + k0 * (MC // 32) + pid_m * (BM // 32) + c[None, :] * (MC // 32) + mb[:, None],
                     sc32, mask=(pid_m * (BM // 32) + mb < MC // 32)[:, None] & cmask[None, :])


def rowcol_launch(row_tile: int, col_block: int, col_tile: int, do_row: bool,
                  do_col: bool) -> tuple[int, int, int]:
    """(rows of x per program, columns of x per program, warps) of a launch, fixed per layout (no autotuner: it cost
    ~0.1 ms of host time per eager launch and picked among 8 / 16 warps only). Measured on an H100 at the expert
    op's shapes (benchmarks/quant_rowcol_launch.py; results in mx32_linear_s28/ and issue10_s29/):
      - a 1x32 column copy beside the row copy (the mx32 dO^T) and a 32-token column copy alone (the mx32 W^T):
        64 x 128 programs at 2 warps, 1.18-1.37x and 1.03-1.05x faster than 128 x 128 at 4 / 2 warps (a row copy
        in 128-row tiles keeps 128 rows);
      - the mx32 x^T copy (32 x 128 regions) beside the row copy: 128 x 128 at 4 warps (8 and 16 ran 1.6x slower);
      - every other layout 128 x 128 at 8 (within 3% of 4; 16 lost 23% on 128-token columns; 2 lose 2x).
    The interpreter runs 4 warps."""
    bm, bk, warps = BM, BK, ROWCOL_NUM_WARPS
    if do_col and col_block == 32:
        bm, warps = (64, 2) if (col_tile == 1 and row_tile == 1) or not do_row else (BM, 4)
    return bm, bk, 4 if _INTERPRET else warps


def _check_tile(tile, row_block, row_tile, col_block, col_tile, do_row, do_col):
    bm, bk = tile
    ok = bm in (32, 64, 128) and bk in (32, 64, 128)
    if do_row:  # a row block inside the program's columns; a 128-row tile is the program's rows
        ok = ok and bk % row_block == 0 and (row_tile == 1 or bm == row_tile)
    if do_col:  # a token block inside the program's rows; a 128-column tile is the program's columns
        ok = ok and bm % col_block == 0 and (col_tile == 1 or bk == col_tile)
    if not ok:
        raise ValueError(f"to_mxfp8_blocked_rowcol: program tile {tile} does not hold the scale regions (row "
                         f"{row_block} x {row_tile}, column {col_block} x {col_tile}); rows and columns from 32, "
                         f"64, 128")


def _run(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col, hw_cast=None, num_warps=None,
         after=None, traced=False, tile=None):
    """The launch behind to_mxfp8_blocked_rowcol (its docstring says what `after` is): rowcol_launch's program tile
    and warps unless tile (rows, columns per program) / num_warps are given. traced: through
    torch.library.wrap_triton (inside the triton op, so torch.compile writes the launch into its generated code);
    else a plain launch."""
    if limit is not None and after is not None:
        raise ValueError("to_mxfp8_blocked_rowcol: limit and after cannot both be given (they share one kernel "
                         "argument)")
    if not traced and hw_cast is None and num_warps is None and tile is None:
        cuda = _cuda_rowcol(x3, row_block, row_tile, col_block, col_tile, do_row, do_col)
        if cuda is not None:  # `after` needs nothing here: the custom op's input already orders the launch
            return cuda.rowcol(x3, row_block, col_block, col_tile, limit)
    bm, bk, warps = rowcol_launch(row_tile, col_block, col_tile, do_row, do_col)
    tile = tile or (bm, bk)
    _check_tile(tile, row_block, row_tile, col_block, col_tile, do_row, do_col)
    B, M, K = x3.shape
    MC = (M + 31) // 32 * 32
    dev = x3.device
    u8 = torch.uint8
    qr = torch.empty((B, M, K) if do_row else (0,), dtype=u8, device=dev)
    sr = torch.empty((B, M, K // 32) if do_row else (0,), dtype=u8, device=dev)
    qc = torch.empty((B, K, MC) if do_col else (0,), dtype=u8, device=dev)
    sc = torch.empty((B, K, MC // 32) if do_col else (0,), dtype=u8, device=dev)
    if (do_row or do_col) and B * MC * K:
        hw = default_hw_cast(dev) if hw_cast is None else hw_cast
        xin, is_bf16 = _as_kernel_input(x3)
        # USE_LIMIT=False never reads this argument (no memset launch per call); `after`, when given, rides here so
        # that the launch depends on it
        lim = limit if limit is not None else (after if after is not None else xin)
        warps = num_warps or warps
        kernel = wrap_triton(_blocked_rowcol_kernel) if traced else _blocked_rowcol_kernel
        grid = (triton.cdiv(MC, tile[0]), triton.cdiv(K, tile[1]), B)
        kernel[grid](
            xin, qr, sr, qc, sc, lim,
            M, K, MC, M * K, M * K, M * (K // 32), K * MC, K * (MC // 32),
            BM=tile[0], BK=tile[1], RB=row_block, RT=row_tile, CB=col_block, CT=col_tile, DO_ROW=do_row, DO_COL=do_col,
            USE_LIMIT=limit is not None, HW_CAST=hw, IS_BF16=is_bf16,
            # every argument spelled out: inductor's launcher of a traced kernel takes no defaults
            F32=False, sr0=0, sr1=0, sc0=0, sc1=0, num_warps=warps,
        )
    f8 = torch.float8_e4m3fn
    return qr.view(f8), sr, qc.view(f8), sc


@triton.jit
def _tiles_many_kernel(table_ptr, q_ptr, s_ptr, T_PAD: tl.constexpr, X_DTYPE: tl.constexpr, TILE: tl.constexpr,
                       HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # One TILE x TILE tile of one of T tensors per program (rows and row length multiples of TILE; a 3-D weight
    # [E, N, K] is E*N rows). table int64 [5, T_PAD]: address, row length K, first program, data offset, scale
    # offset of each tensor (padding entries: first program huge). Same arithmetic as _blocked_rowcol_kernel's
    # row copy with RB = RT = TILE: one E8M0 byte per tile, written compact (row-major over the tiles).
    t, x_ptr, tile = table_member(table_ptr, T_PAD, X_DTYPE)
    K = tl.load(table_ptr + T_PAD + t)
    kt = K // TILE
    r = tl.arange(0, TILE)
    offs = ((tile // kt) * TILE + r)[:, None] * K + ((tile % kt) * TILE + r)[None, :]
    x = _widen(tl.load(x_ptr + offs), IS_BF16)
    a = tl.max(tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1), axis=0)
    e = _exponent_from_amax_bits(a)
    code = _encode(x * _multiplier(a, e, HW_CAST), a >= 0x7F800000, HW_CAST)
    tl.store(q_ptr + tl.load(table_ptr + 3 * T_PAD + t) + offs, code)
    tl.store(s_ptr + tl.load(table_ptr + 4 * T_PAD + t) + tile, _scale_byte(a, e).to(tl.uint8))


_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
             torch.int16: tl.int16}


def to_mxfp8_tiles_many(xs, tile: int = 128, hw_cast: bool | None = None, num_warps: int | None = None) -> list:
    """xs: contiguous 2-D / 3-D tensors of one dtype and device whose last two dims are multiples of `tile` ->
    [(data e4m3 x's shape, scale uint8 [..., rows/tile, K/tile])]: MXFP8 with ONE E8M0 scale per tile x tile
    square, compact (quant.to_mxfp8_blocked(x, -1, tile, tile)'s numbers, its scale taken once per tile), ONE
    launch for all. For FSDP2's float8 all-gather: a block's MXFP8 weight shards (mx128 Linears, experts)
    quantized together instead of one Python launch each."""
    who = "to_mxfp8_tiles_many"
    if not xs or len({(x.dtype, x.device) for x in xs}) != 1:
        raise ValueError(f"{who}: xs must be a non-empty list of tensors of one dtype and device")
    for x in xs:
        if x.ndim not in (2, 3) or x.shape[-1] % tile or x.shape[-2] % tile or not x.is_contiguous():
            raise ValueError(f"{who}: each x must be a contiguous [N, K] or [E, N, K] with N, K multiples of {tile}, "
                             f"got {tuple(x.shape)} (contiguous: {x.is_contiguous()})")
    x0 = xs[0]
    if x0.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{who}: dtype {x0.dtype}; expected bf16, fp16 or fp32")
    if not (x0.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: tensors on {x0.device}; needs CUDA or TRITON_INTERPRET=1")
    kin = [_as_kernel_input(x) for x in xs]
    ins = [k for k, _ in kin]
    t_pad = max(2, next_pow2(len(ins)))
    first, qoff, soff, programs, total, stotal = [], [], [], 0, 0, 0
    for x in ins:
        tiles = x.numel() // (tile * tile)
        first.append(programs)
        qoff.append(total)
        soff.append(stotal)
        programs += tiles
        total += x.numel()
        stotal += tiles
    pad = t_pad - len(ins)
    table = cached_table(ins, [[x.data_ptr() for x in ins] + [0] * pad, [x.shape[-1] for x in ins] + [tile] * pad,
                               first + [2 ** 62] * pad, qoff + [0] * pad, soff + [0] * pad])
    q = torch.empty(total, dtype=torch.uint8, device=x0.device)
    sc = torch.empty(stotal, dtype=torch.uint8, device=x0.device)
    if programs:
        hw = default_hw_cast(x0.device) if hw_cast is None else hw_cast
        warps = num_warps or (4 if _INTERPRET else BLOCKWISE_NUM_WARPS)
        _tiles_many_kernel[(programs,)](table, q, sc, T_PAD=t_pad, X_DTYPE=_TL_DTYPE[ins[0].dtype], TILE=tile,
                                        HW_CAST=hw, IS_BF16=kin[0][1], num_warps=warps)
    out = []
    for x, at, sat in zip(xs, qoff, soff):
        n = x.numel() // (tile * tile)
        out.append((q[at:at + x.numel()].view(torch.float8_e4m3fn).view(x.shape),
                    sc[sat:sat + n].view(*x.shape[:-2], x.shape[-2] // tile, x.shape[-1] // tile)))
    return out


# Warps of every launch but rowcol_launch's 32-token column copies (not autotuned, so that torch.compile writes the
# traced twin's launch into its generated code; 8 and 16 warps measured equal on the row copies and 8 1.5x faster on
# the weights' column copies: benchmarks/results/moe_kernels_mx_ab-nvidia-h100-2026-11-25-call1.log).
ROWCOL_NUM_WARPS = 8


@torch.library.triton_op("titan_fp8::mxfp8_blocked_rowcol_traced", mutates_args=())
def _blocked_rowcol_traced_op(x3: torch.Tensor, limit: Optional[torch.Tensor], row_block: int, row_tile: int,
                              col_block: int, col_tile: int, do_row: bool,
                              do_col: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col, traced=True)


# The same as an opaque custom op: torch.compile calls it through the dispatcher and Triton's Python launcher
# (host time per call: the fused expert path's weight quantizations were ~0.2 ms each, benchmarks/results/
# issue9_host_s16/call1_host_profile/). The interpreter cannot be traced through a triton op, so compiled code under
# TRITON_INTERPRET=1 (CPU tests) uses this one.
@torch.library.custom_op("titan_fp8::mxfp8_blocked_rowcol", mutates_args=())
def _blocked_rowcol_op(x3: torch.Tensor, limit: Optional[torch.Tensor], row_block: int, row_tile: int,
                       col_block: int, col_tile: int, do_row: bool, do_col: bool,
                       after: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                       torch.Tensor]:
    return _run(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col, after=after)


@_blocked_rowcol_op.register_fake
def _(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col, after=None):
    B, M, K = x3.shape
    MC = (M + 31) // 32 * 32
    f8, u8 = torch.float8_e4m3fn, torch.uint8
    return (x3.new_empty((B, M, K) if do_row else (0,), dtype=f8),
            x3.new_empty((B, M, K // 32) if do_row else (0,), dtype=u8),
            x3.new_empty((B, K, MC) if do_col else (0,), dtype=f8),
            x3.new_empty((B, K, MC // 32) if do_col else (0,), dtype=u8))


# Fixed launch configuration for to_mx128_blockwise (not autotuned, so that torch.compile traces the launch into
# its generated code through torch.library.triton_op: no Python launcher or custom-op dispatch per call, which
# costs ~0.25 ms of host time on torch 2.11; kernels/float8_cast says the same). 8 warps: ROWCOL_NUM_WARPS'.
BLOCKWISE_NUM_WARPS = 8


def _run_blockwise(x, tile, col_tile, do_row, do_col, hw_cast=None, num_warps=None, after=None):
    M, K = x.shape
    dev, u8 = x.device, torch.uint8
    qr = torch.empty((M, K) if do_row else (0,), dtype=u8, device=dev)
    qc = torch.empty((K, M) if do_col else (0,), dtype=u8, device=dev)
    none = (torch.empty(0, device=dev),) * 2 + (0, 0)
    # the kernel writes the contiguous bases; the (transposed) views go out after it
    br, sr, sr0, sr1 = blockwise_scale_buffers(M, K, tile, dev) if do_row else none
    bc, sc, sc0, sc1 = blockwise_scale_buffers(K, M, col_tile, dev) if do_col else none
    if (do_row or do_col) and M * K:
        hw = default_hw_cast(dev) if hw_cast is None else hw_cast
        xin, is_bf16 = _as_kernel_input(x)
        # USE_LIMIT=False never reads it (no memset launch per call); `after`, when given, rides here so that the
        # launch depends on it (see to_mx128_blockwise)
        lim = xin if after is None else after
        grid = (triton.cdiv(M, BM), triton.cdiv(K, BK), 1)
        wrap_triton(_blocked_rowcol_kernel)[grid](
            xin, qr, br, qc, bc, lim, M, K, M, 0, 0, 0, 0, 0,
            BM=BM, BK=BK, RB=BK, RT=BM if tile else 1, CB=BM, CT=BK if col_tile else 1, DO_ROW=do_row,
            DO_COL=do_col, USE_LIMIT=False,
            HW_CAST=hw, IS_BF16=is_bf16, F32=True, sr0=sr0, sr1=sr1, sc0=sc0, sc1=sc1,
            num_warps=num_warps or (4 if _INTERPRET else BLOCKWISE_NUM_WARPS),
        )
    f8 = torch.float8_e4m3fn
    return qr.view(f8), sr, qc.view(f8), sc


_Q4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.triton_op("titan_fp8::mx128_blockwise_rowcol", mutates_args=())
def _blockwise_triton_op(x: torch.Tensor, tile: bool, col_tile: bool, do_row: bool, do_col: bool,
                         after: Optional[torch.Tensor]) -> _Q4:
    return _run_blockwise(x, tile, col_tile, do_row, do_col, after=after)


# The same as an opaque custom op: torch.compile calls it through the dispatcher (host time per call). The
# interpreter cannot be traced through a triton op (its fake-tensor trace touches data pointers), so CPU tests
# of compiled code use this one; TRACED_LAUNCH = False picks it on the GPU too (benchmarks compare the two).
@torch.library.custom_op("titan_fp8::mx128_blockwise_rowcol_opaque", mutates_args=())
def _blockwise_custom_op(x: torch.Tensor, tile: bool, col_tile: bool, do_row: bool, do_col: bool,
                         after: Optional[torch.Tensor]) -> _Q4:
    return _run_blockwise(x, tile, col_tile, do_row, do_col, after=after)


@_blockwise_custom_op.register_fake
def _(x, tile, col_tile, do_row, do_col, after):
    M, K = x.shape
    f8 = torch.float8_e4m3fn
    empty = x.new_empty((0,), dtype=torch.float32)
    return (x.new_empty((M, K) if do_row else (0,), dtype=f8),
            blockwise_scale_buffers(M, K, tile, x.device)[1] if do_row else empty,
            x.new_empty((K, M) if do_col else (0,), dtype=f8),
            blockwise_scale_buffers(K, M, col_tile, x.device)[1] if do_col else empty)


TRACED_LAUNCH = not _INTERPRET


def to_mx128_blockwise(x: torch.Tensor, tile: bool, *, col_tile: bool | None = None, do_row: bool = True,
                       do_col: bool = True, hw_cast: bool | None = None, num_warps: int | None = None,
                       after: torch.Tensor | None = None):
    """x [M, K] (bf16/fp16/fp32) -> (row_data [M, K], row_scale, col_data [K, M] (x^T), col_scale) from ONE
    read: MXFP8 numbers (e4m3, power-of-two scales by the E8M0 rule of kernels.mxfp8, non-finite regions NaN)
    shared over 1x128 blocks (tile=False: along K for the row copy, along M for the column copy) or 128x128
    tiles (tile=True; col_tile, default tile, picks it for the column copy alone), with the scales as fp32
    factors 2^e (data * 2^e = x) in cuBLAS's blockwise layouts
    (quant.blockwise_scale_buffers). A copy not asked for is None. K % 128 == 0; M % 128 == 0 when tile or do_col.
    Bit-identical to quant.to_mx128_blockwise_reference. Runs as the triton op titan_fp8::mx128_blockwise_rowcol
    (torch.compile traces its launch; TRACED_LAUNCH) or the opaque custom op ..._opaque (interpreter), unless
    hw_cast / num_warps are forced. `after`: a tensor (same device, never read) the quantization must wait for:
    backward passes one of its own so that torch.compile's partitioner cannot move a quantization that depends
    only on a parameter into forward and keep its float8 result alive until backward."""
    who = "to_mx128_blockwise"
    if x.ndim != 2:
        raise ValueError(f"{who}: x must be [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{who}: x.dtype is {x.dtype}; expected bf16, fp16 or fp32")
    if not (x.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: x is on {x.device}; needs CUDA or TRITON_INTERPRET=1")
    M, K = x.shape
    col_tile = tile if col_tile is None else col_tile
    if K % BK or ((tile or do_col) and M % BM):
        raise ValueError(f"{who}: x of shape {tuple(x.shape)}: K must be a multiple of {BK}, and M too for "
                         f"128x128 tiles or the column copy")
    x = x.contiguous()
    if hw_cast is not None or num_warps is not None:
        qr, sr, qc, sc = _run_blockwise(x, tile, col_tile, do_row, do_col, hw_cast, num_warps, after)
    else:
        op = _blockwise_triton_op if TRACED_LAUNCH else _blockwise_custom_op
        qr, sr, qc, sc = op(x, tile, col_tile, do_row, do_col, after)
    return (qr, sr) if do_row else (None, None), (qc, sc) if do_col else (None, None)


def to_mxfp8_blocked_rowcol(x: torch.Tensor, *, row_block: int = 128, row_tile: int = 1, col_block: int = 128,
                            col_tile: int = 1, do_row: bool = True, do_col: bool = True,
                            limit: torch.Tensor | None = None, hw_cast: bool | None = None,
                            num_warps: int | None = None, after: torch.Tensor | None = None):
    """See the module docstring. Returns (row_data, row_scale, col_data, col_scale); a copy not asked for
    is None. row_tile / col_tile must be 1 or 128; blocks 32, 64 or 128. Under torch.compile it runs as the
    triton op titan_fp8::mxfp8_blocked_rowcol_traced (torch.compile writes its launch into the generated code;
    the opaque custom op titan_fp8::mxfp8_blocked_rowcol under the interpreter or with `after`) unless hw_cast /
    num_warps are forced; eagerly it launches directly. `after` (not with limit): a tensor (same device, never
    read) the quantization must wait for: backward passes one of its own so that torch.compile cannot move a
    quantization that depends only on a parameter into forward, or ahead in backward, and keep its float8 result
    alive meanwhile."""
    who = "to_mxfp8_blocked_rowcol"
    if x.ndim not in (2, 3):
        raise ValueError(f"{who}: x must be [M, K] or [B, M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{who}: x.dtype is {x.dtype}; expected bf16, fp16 or fp32")
    for name, v, allowed in (("row_block", row_block, (32, 64, 128)), ("col_block", col_block, (32, 64, 128)),
                             ("row_tile", row_tile, (1, BM)), ("col_tile", col_tile, (1, BK))):
        if v not in allowed:
            raise ValueError(f"{who}: {name}={v}; allowed: {allowed}")
    if not (x.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: x is on {x.device}; needs CUDA or TRITON_INTERPRET=1")
    if limit is not None and (limit.dtype != torch.int32 or limit.numel() != 1):
        raise ValueError(f"{who}: limit must be a 1-element int32 tensor, got {limit.dtype} {tuple(limit.shape)}")
    x3 = x.contiguous() if x.ndim == 3 else x.contiguous().unsqueeze(0)
    B, M, K = x3.shape
    if K % 32:
        raise ValueError(f"{who}: x.shape[-1] = {K} is not a multiple of 32")
    if x.ndim == 3 and M % 32:
        raise ValueError(f"{who}: x.shape[-2] = {M} is not a multiple of 32")
    if hw_cast is not None or num_warps is not None or not torch.compiler.is_compiling():
        # eager callers (FSDP2's pre-all-gather of the expert weights, twice per block and step) skip the custom
        # op's dispatch: the same function, less host time
        out = _run(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col, hw_cast, num_warps, after)
    elif TRACED_LAUNCH and after is None and _cuda_rowcol(x3, row_block, row_tile, col_block, col_tile, do_row,
                                                          do_col) is None:
        out = _blocked_rowcol_traced_op(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col)
    else:
        # `after` needs the opaque op: inductor orders a traced kernel by what the kernel reads, and this one never
        # reads `after` (it rode on an unread argument): it scheduled such a quantization ahead of the backward
        # tensor it was meant to wait for (benchmarks/results/issue9_host_s16/call7_error_probe/). The CUDA
        # kernel (_cuda_rowcol) cannot be traced either: it runs inside this op too.
        out = _blocked_rowcol_op(x3, limit, row_block, row_tile, col_block, col_tile, do_row, do_col, after)
    qr, sr, qc, sc = out
    sq = (lambda t: t) if x.ndim == 3 else (lambda t: t.squeeze(0))
    return (sq(qr) if do_row else None, sq(sr) if do_row else None,
            sq(qc) if do_col else None, sq(sc) if do_col else None)
