# AOT ID: ['4_backward']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# Original path: /work/main/kernels/moe/triton.py:267
_mx_kernel_0 = async_compile.triton('_mx_kernel', '''

import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.user_autotune(
    configs=[{'num_warps': 8, 'num_stages': 3}],
    inductor_meta={'grid_type': 'FixedGrid', 'fixed_grid': ['_grid_0', '_grid_1', '_grid_2'], 'extra_launcher_args': ['_grid_0', '_grid_1', '_grid_2'], 'kernel_name': '_mx_kernel_0', 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False},
    triton_meta={'signature': {'a_ptr': '*bf16', 'b_ptr': '*i64', 'c_ptr': '*i64', 'd_ptr': '*fp32', 'e_ptr': '*bf16', 'qr_ptr': '*u8', 'sr_ptr': '*u8', 'qc_ptr': '*u8', 'sc_ptr': '*u8', 'dot_ptr': '*fp32', 'N': 'i32', 'P': 'i32', 'C': 'i32', 'H': 'i32', 'MODE': 'constexpr', 'K': 'constexpr', 'QB': 'constexpr', 'BM': 'constexpr', 'BD': 'constexpr', 'HW_CAST': 'constexpr', 'IS_BF16': 'constexpr', 'COL_TILE': 'constexpr', 'HALVES': 'constexpr', 'AMAX_FIRST': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {'MODE': 1, 'K': 2, 'QB': 128, 'BM': 128, 'BD': 128, 'HW_CAST': True, 'IS_BF16': False, 'COL_TILE': 1, 'HALVES': False, 'AMAX_FIRST': True}, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (11,): [['tt.divisibility', 16]], (12,): [['tt.divisibility', 16]], (13,): [['tt.divisibility', 16]]}]},
    filename=__file__,
    custom_kernel=True,
)
@triton.jit
def _mx_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, dot_ptr, N, P, C, H,
               MODE: tl.constexpr, K: tl.constexpr, QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
               HW_CAST: tl.constexpr, IS_BF16: tl.constexpr, COL_TILE: tl.constexpr = 1, HALVES: tl.constexpr = False,
               AMAX_FIRST: tl.constexpr = False):
    # qr [P, C], sr [P, C/32]; qc [C, P], sc [P/32, C]; dot [C/BD, P] (MODE 1). QB: the scale block (32 or 128).
    # COL_TILE == BD (128): the token-major copy shares one scale per QB tokens x BD features (the max of the row
    # amaxes of those QB rows: no second reduction over the values).
    # HALVES (MODE 3): the tile's columns are in [0, H) and it writes dh1's (cols) and dh3's (cols + H) from one
    # sigmoid and one read of da / h1 / h3. AMAX_FIRST: see _mx_store.
    CL = H if HALVES else C
    pid_m, pid_d, rows, cols, rmask, cmask = _tile(P, CL, BM, BD)
    v, v2, dot = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, True, IS_BF16,
                         HALVES)
    if MODE == 1:
        tl.store(dot_ptr + pid_d * P + rows, dot, mask=rmask)
    kb = pid_d * (BD // 32) + tl.arange(0, BD // 32)
    kmask = kb < CL // 32
    _mx_store(v, pid_m, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C, QB, BM, BD,
              HW_CAST, COL_TILE, AMAX_FIRST)
    if HALVES:
        _mx_store(v2, pid_m, rows, rmask, cols + H, cmask, kb + H // 32, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C,
                  QB, BM, BD, HW_CAST, COL_TILE, AMAX_FIRST)

@triton.jit
def _tile(P, CL, BM: tl.constexpr, BD: tl.constexpr):
    """This program's BM x BD tile of a [P, CL] walk (neighbouring programs walk along the columns). Only scalars
    go in: torch.compile's analysis of which tensors a kernel writes (triton_op launches) follows every argument
    of a call whose result feeds a store address, so addresses must not come out of a call that reads a tensor."""
    pid_m, pid_d = _tile_ids(P, CL, BM, BD, True)
    rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    cols = pid_d * BD + tl.arange(0, BD)
    return pid_m, pid_d, rows, cols, rows < P, cols < CL

@triton.jit
def _tile_ids(M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, K_FAST: tl.constexpr, GROUP_M: tl.constexpr = 0):
    """1-D grid -> (pid_m, pid_k). K_FAST: neighbouring programs walk along K, so the programs in flight read
    whole row bands (long contiguous runs); else they walk down M (one BLOCK_K-wide strip of many rows).
    GROUP_M > 0 (overrides K_FAST): bands of GROUP_M row tiles, walked down M first and then along K, so the
    programs in flight cover GROUP_M * BLOCK_M consecutive rows of a few K strips: for a [K, M] output
    every K row then receives GROUP_M * BLOCK_M contiguous bytes at about the same time (whole lines to
    merge in L2) while each program still reads BLOCK_K-wide row runs."""
    pid = tl.program_id(0)
    if GROUP_M > 0:
        n_m = tl.cdiv(M, BLOCK_M)
        per_group = GROUP_M * tl.cdiv(K, BLOCK_K)
        first_m = (pid // per_group) * GROUP_M
        g_size = tl.minimum(n_m - first_m, GROUP_M)
        in_group = pid % per_group
        pid_m = first_m + in_group % g_size
        pid_k = in_group // g_size
    elif K_FAST:
        n_k = tl.cdiv(K, BLOCK_K)
        pid_m = pid // n_k
        pid_k = pid - pid_m * n_k
    else:
        n_m = tl.cdiv(M, BLOCK_M)
        pid_k = pid // n_m
        pid_m = pid - pid_k * n_m
    return pid_m, pid_k

@triton.jit
def _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE: tl.constexpr,
            K: tl.constexpr, WANT_DOT: tl.constexpr, IS_BF16: tl.constexpr, HALVES: tl.constexpr = False):
    """(v, v2, dot): the fp32 tile [BM, BC] to quantize (rows int64 buffer rows, cols int32 output columns), and,
    MODE 1 with WANT_DOT, the per-row partial dot <dout, y> over these columns (else zeros). HALVES (MODE 3
    only): cols are in [0, H) and v / v2 are dh1 (output columns cols) / dh3 (cols + H) from ONE sigmoid of h1
    and one read of da, h1, h3; otherwise v2 is v."""
    dot = tl.zeros(rows.shape, dtype=tl.float32)
    if MODE == 0:  # dispatch: a = x [N, C], b = src
        t, real = _gather_src(b_ptr, rows, rmask, N)
        m = real[:, None] & cmask[None, :]
        v = _widen(_load_raw(a_ptr, t[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
    elif MODE == 1:  # combine backward: a = dout [N, C], b = src, c = pos [N*K], d = weights fp32 [N, K], e = y
        t, real = _gather_src(b_ptr, rows, rmask, N)
        w = tl.zeros(rows.shape, dtype=tl.float32)
        for j in tl.static_range(K):
            p = tl.load(c_ptr + t * K + j, mask=real, other=-1)
            wj = tl.load(d_ptr + t * K + j, mask=real, other=0.0)
            w = tl.where(p == rows, wj, w)
        m = real[:, None] & cmask[None, :]
        g = _widen(_load_raw(a_ptr, t[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
        v = _mul(w[:, None], g)
        if WANT_DOT:
            yv = _widen(_load_raw(e_ptr, rows[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
            dot = tl.sum(g * yv, 1)
    elif MODE == 2:  # SwiGLU: a = h13 [P, 2H]; C == H
        m = rmask[:, None] & cmask[None, :]
        base = rows[:, None] * (2 * H) + cols[None, :]
        h1 = _widen(_load_raw(a_ptr, base, m, IS_BF16), IS_BF16)
        h3 = _widen(_load_raw(a_ptr, base + H, m, IS_BF16), IS_BF16)
        v = _mul(_mul(h1, _sigmoid(h1)), h3)
    elif HALVES:  # SwiGLU backward, both halves: a = da [P, H], b = h13 [P, 2H]; cols in [0, H)
        v, v2 = _swiglu_grads(a_ptr, b_ptr, rows, cols, rmask[:, None] & cmask[None, :], H, IS_BF16)
    else:  # SwiGLU backward: a = da [P, H], b = h13 [P, 2H]; C == 2H, column c < H: dh1, else dh3
        hi = cols >= H
        dh1, dh3 = _swiglu_grads(a_ptr, b_ptr, rows, tl.where(hi, cols - H, cols), rmask[:, None] & cmask[None, :],
                                 H, IS_BF16)
        v = tl.where(hi[None, :], dh3, dh1)
    if not HALVES:
        v2 = v
    return v, v2, dot

@triton.jit
def _gather_src(src_ptr, rows, rmask, N):
    t = tl.load(src_ptr + rows, mask=rmask, other=N)
    real = rmask & (t < N)
    return tl.where(real, t, 0), real

@triton.jit
def _widen(x, IS_BF16: tl.constexpr):
    """Storage type -> fp32. IS_BF16 (interpreter only): bf16 arrives as its int16 bits and is widened by a
    shift, because the Triton interpreter's bf16 -> fp32 conversion gets bf16 subnormals wrong (triton 3.6:
    5.23e-39 -> 9.18e-39, 1e-40 -> 0)."""
    if IS_BF16:
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)

@triton.jit
def _load_raw(ptr, offs, mask, IS_BF16: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """Load x in its storage type (bf16 as int16 bits under the interpreter, see _widen). EVICT_FIRST: the
    input is read exactly once, so ask L2 to drop it first and keep room for the outputs being merged."""
    other = 0 if IS_BF16 else 0.0
    if EVICT_FIRST:
        x = tl.load(ptr + offs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptr + offs, mask=mask, other=other)
    return x

@triton.jit
def _mul(a, b):
    return _rounded(a, b, _MUL)

@triton.jit
def _rounded(a, b, ASM: tl.constexpr):
    """One correctly rounded fp32 op (see the module docstring): inline PTX when compiled, numpy when interpreted."""
    a, b = tl.broadcast(a, b)
    if _RN:
        r = tl.inline_asm_elementwise(ASM, "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)
    elif ASM == _MUL:
        r = a * b
    else:
        r = a + b
    return r

_RN = tl.constexpr(True)

_MUL = tl.constexpr('mul.rn.f32 $0, $1, $2;')

@triton.jit
def _sigmoid(x):
    """reference._sigmoid, op for op."""
    xs = tl.where(x != x, 0.0, x)  # NaN handled at the end (keeps the integer cast below defined)
    t = _mul(xs, _k(x, _NEG_LOG2E))
    t = tl.minimum(tl.maximum(t, _LO), _HI)
    n = tl.floor(_add(t, _k(x, 0.5)))
    f = _add(t, -n)
    p = _k(x, _C7)
    p = _add(_mul(p, f), _k(x, _C6))
    p = _add(_mul(p, f), _k(x, _C5))
    p = _add(_mul(p, f), _k(x, _C4))
    p = _add(_mul(p, f), _k(x, _C3))
    p = _add(_mul(p, f), _k(x, _C2))
    p = _add(_mul(p, f), _k(x, _C1))
    p = _add(_mul(p, f), _k(x, _C0))
    two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    s = _rcp(_add(_mul(p, two_n), _k(x, 1.0)))
    return tl.where(x != x, x, s)

@triton.jit
def _k(x, c):
    """The constant c as an fp32 tensor shaped like x (the *_rn helpers take tensors)."""
    return tl.full(x.shape, c, tl.float32)

_NEG_LOG2E = tl.constexpr(-1.4426950216293335)

_LO = tl.constexpr(-64.0)

_HI = tl.constexpr(127.0)

@triton.jit
def _add(a, b):
    return _rounded(a, b, _ADD)

_ADD = tl.constexpr('add.rn.f32 $0, $1, $2;')

_C7 = tl.constexpr(1.5252733646775596e-05)

_C6 = tl.constexpr(0.0001540352968731895)

_C5 = tl.constexpr(0.0013333557872101665)

_C4 = tl.constexpr(0.009618128649890423)

_C3 = tl.constexpr(0.05550410971045494)

_C2 = tl.constexpr(0.24022650718688965)

_C1 = tl.constexpr(0.6931471824645996)

_C0 = tl.constexpr(1.0)

@triton.jit
def _rcp(x):
    """1 / x correctly rounded (IEEE, as torch.reciprocal / div.rn): rcp.rn.f32 is shorter than div.rn.f32."""
    if _RN:
        r = tl.inline_asm_elementwise("rcp.rn.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = 1.0 / x
    return r

@triton.jit
def _swiglu_grads(da_ptr, h13_ptr, rows, cc, m, H, IS_BF16: tl.constexpr):
    """(dh1, dh3) at columns cc of [0, H) (reference.swiglu_grad_values, op for op) from da [P, H], h13 [P, 2H]."""
    base = rows[:, None] * (2 * H) + cc[None, :]
    g = _widen(_load_raw(da_ptr, rows[:, None] * H + cc[None, :], m, IS_BF16), IS_BF16)
    h1 = _widen(_load_raw(h13_ptr, base, m, IS_BF16), IS_BF16)
    h3 = _widen(_load_raw(h13_ptr, base + H, m, IS_BF16), IS_BF16)
    s = _sigmoid(h1)
    one = _k(s, 1.0)
    dsilu = _mul(s, _add(_mul(h1, _add(-s, one)), one))
    return _mul(_mul(g, h3), dsilu), _mul(g, _mul(h1, s))

@triton.jit
def _mx_store(v, pid_m, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C,
              QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr, COL_TILE: tl.constexpr,
              AMAX_FIRST: tl.constexpr):
    """Quantize the tile v [BM, BD] (output columns cols; their 32-blocks kb) both ways and store it: the row copy,
    then the token-major copy. AMAX_FIRST: both amaxes are taken before the row copy is encoded (no other
    difference: same values, same bytes); for MODE 1 at 128 x 128 / 8 warps ptxas then needs 128 registers
    instead of 143 (sm_90a), i.e. two programs per SM instead of one."""
    xr = tl.reshape(v, [BM, BD // QB, QB])
    ar = _amax_bits(xr, 2)
    xc = tl.reshape(v, [BM // QB, QB, BD])
    if AMAX_FIRST:
        ac = _col_amax(xc, ar, BM, BD, QB, COL_TILE)
    _mx_store_rows(xr, ar, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, C, QB, BM, BD, HW_CAST)
    if not AMAX_FIRST:
        ac = _col_amax(xc, ar, BM, BD, QB, COL_TILE)
    _mx_store_cols(xc, ac, pid_m, rows, rmask, cols, cmask, qc_ptr, sc_ptr, P, C, QB, BM, BD, HW_CAST)

@triton.jit
def _amax_bits(x, axis: tl.constexpr):
    """Bits of max|x| along `axis` (sign cleared); >= 0x7F800000 iff the block holds NaN or inf. Compiled: one
    FMNMX.NAN with |.| operands per element (max.NaN.f32: a NaN anywhere makes the max NaN; no .ftz, so
    fp32 subnormals compare as themselves), the same order as the integer compare of the magnitude bits."""
    if _AMAX_ON_INT_BITS:
        return tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis)
    return tl.reduce(tl.abs(x), axis, _max_nan).to(tl.int32, bitcast=True) & 0x7FFFFFFF

_AMAX_ON_INT_BITS = tl.constexpr(False)

@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

@triton.jit
def _col_amax(xc, ar, BM: tl.constexpr, BD: tl.constexpr, QB: tl.constexpr, COL_TILE: tl.constexpr):
    """Amax bits [BM // QB, BD] of the token-major blocks (QB tokens of one column; COL_TILE == BD: of all the
    tile's columns, i.e. the max of those rows' amaxes ar, no second pass over the values)."""
    if COL_TILE > 1:
        ac = tl.max(tl.reshape(tl.max(ar, axis=1), [BM // QB, QB]), axis=1)
        ac = tl.broadcast_to(ac[:, None], [BM // QB, BD])
    else:
        ac = _amax_bits(xc, 1)
    return ac

@triton.jit
def _mx_store_rows(xr, ar, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, C, QB: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr):
    """The row copy (blocks of QB along the features) of xr [BM, BD // QB, QB] with amax bits ar."""
    er = _exponent_from_amax_bits(ar)
    cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
    tl.store(qr_ptr + rows[:, None] * C + cols[None, :], tl.reshape(cr, [BM, BD]),
             mask=rmask[:, None] & cmask[None, :])
    sb = _scale_byte(ar, er).to(tl.uint8)
    sb = tl.reshape(tl.broadcast_to(sb[:, :, None], [BM, BD // QB, QB // 32]), [BM, BD // 32])
    tl.store(sr_ptr + rows[:, None] * (C // 32) + kb[None, :], sb, mask=rmask[:, None] & kmask[None, :])

@triton.jit
def _exponent_from_amax_bits(a):
    """a: int32 bits of amax (sign cleared). Returns e = clamp(ceil(log2(fl(amax / 448))), -127, 127)."""
    ea = a >> 23
    man = a & 0x7FFFFF
    e = ea - 135 + (man > 0x600000).to(tl.int32)
    e = tl.where((ea == 8) & (man == 0x600001), -127, e)
    return tl.minimum(tl.maximum(e, -127), 127)

@triton.jit
def _encode(y, nonfinite, HW_CAST: tl.constexpr):
    """y = x * 2^-e (fp32) -> e4m3fn byte (uint8) of clamp(y, -448, 448), round to nearest even; elements of a
    non-finite block -> 0x7F."""
    if HW_CAST:
        # cvt.rn.satfinite.e4m3x2.f32: RNE, saturates beyond +-448 (our clamp), NaN -> 0x7F
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        yb = y.to(tl.int32, bitcast=True)
        sign = (yb >> 24) & 0x80
        ab = tl.minimum(yb & 0x7FFFFFFF, 0x43E00000)  # |y| clamped to 448 (on the bits: same order)
        r = ab + 0x7FFFF + ((ab >> 20) & 1)  # round the 23-bit mantissa to 3 bits, nearest even
        code_n = (r >> 20) - 960  # (exp << 3 | mant) re-biased 127 -> 7
        f = ab.to(tl.float32, bitcast=True) + 16384.0  # ulp(2^14) = 2^-9: RNE onto the subnormal grid
        code_s = f.to(tl.int32, bitcast=True) - 0x46800000  # k * 2^-9 -> k (k = 8 is 2^-6 = 0x08: seamless)
        code = tl.where(ab < 0x3C800000, code_s, code_n) | sign
        code = tl.where(nonfinite, 0x7F, code).to(tl.uint8)
    return code

@triton.jit
def _multiplier(a, e, HW_CAST: tl.constexpr):
    """Per-block factor 2^-e. On the hardware-cast path a non-finite block gets NaN instead, so every element
    becomes NaN and the cvt writes e4m3fn's NaN byte 0x7F with no per-element select."""
    m = _pow2_neg(e)
    if HW_CAST:
        m = tl.where(a >= 0x7F800000, float("nan"), m)
    return m

@triton.jit
def _pow2_neg(e):
    """2^-e as fp32 for e in [-127, 121] (never subnormal)."""
    return ((127 - e) << 23).to(tl.float32, bitcast=True)

@triton.jit
def _scale_byte(a, e):
    return tl.where(a >= 0x7F800000, 255, e + 127)

@triton.jit
def _mx_store_cols(xc, ac, pid_m, rows, rmask, cols, cmask, qc_ptr, sc_ptr, P, C, QB: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr):
    """The token-major copy (blocks of QB tokens, stored transposed) of xc [BM // QB, QB, BD] with amax bits ac."""
    ec = _exponent_from_amax_bits(ac)
    cc = _encode(xc * _multiplier(ac, ec, HW_CAST)[:, None, :], (ac >= 0x7F800000)[:, None, :], HW_CAST)
    cc = tl.reshape(cc, [BM, BD])
    tl.store(qc_ptr + cols[:, None].to(tl.int64) * P + rows[None, :], tl.trans(cc),
             mask=cmask[:, None] & rmask[None, :])
    sc = _scale_byte(ac, ec).to(tl.uint8)
    sc = tl.reshape(tl.broadcast_to(sc[:, None, :], [BM // QB, QB // 32, BD]), [BM // 32, BD])
    mb = pid_m.to(tl.int64) * (BM // 32) + tl.arange(0, BM // 32)
    tl.store(sc_ptr + mb[:, None] * C + cols[None, :], sc, mask=(mb < P // 32)[:, None] & cmask[None, :])
''', device_str='cuda')


# Original path: /work/main/kernels/moe/triton.py:267
_mx_kernel_1 = async_compile.triton('_mx_kernel', '''

import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.user_autotune(
    configs=[{'num_warps': 8, 'num_stages': 3}],
    inductor_meta={'grid_type': 'FixedGrid', 'fixed_grid': ['_grid_0', '_grid_1', '_grid_2'], 'extra_launcher_args': ['_grid_0', '_grid_1', '_grid_2'], 'kernel_name': '_mx_kernel_1', 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False},
    triton_meta={'signature': {'a_ptr': '*bf16', 'b_ptr': '*bf16', 'c_ptr': '*bf16', 'd_ptr': '*bf16', 'e_ptr': '*bf16', 'qr_ptr': '*u8', 'sr_ptr': '*u8', 'qc_ptr': '*u8', 'sc_ptr': '*u8', 'dot_ptr': '*u8', 'N': 'i32', 'P': 'i32', 'C': 'i32', 'H': 'i32', 'MODE': 'constexpr', 'K': 'constexpr', 'QB': 'constexpr', 'BM': 'constexpr', 'BD': 'constexpr', 'HW_CAST': 'constexpr', 'IS_BF16': 'constexpr', 'COL_TILE': 'constexpr', 'HALVES': 'constexpr', 'AMAX_FIRST': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {'MODE': 3, 'K': 1, 'QB': 128, 'BM': 128, 'BD': 128, 'HW_CAST': True, 'IS_BF16': False, 'COL_TILE': 1, 'HALVES': True, 'AMAX_FIRST': False}, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]], (11,): [['tt.divisibility', 16]], (12,): [['tt.divisibility', 16]], (13,): [['tt.divisibility', 16]]}]},
    filename=__file__,
    custom_kernel=True,
)
@triton.jit
def _mx_kernel(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, dot_ptr, N, P, C, H,
               MODE: tl.constexpr, K: tl.constexpr, QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
               HW_CAST: tl.constexpr, IS_BF16: tl.constexpr, COL_TILE: tl.constexpr = 1, HALVES: tl.constexpr = False,
               AMAX_FIRST: tl.constexpr = False):
    # qr [P, C], sr [P, C/32]; qc [C, P], sc [P/32, C]; dot [C/BD, P] (MODE 1). QB: the scale block (32 or 128).
    # COL_TILE == BD (128): the token-major copy shares one scale per QB tokens x BD features (the max of the row
    # amaxes of those QB rows: no second reduction over the values).
    # HALVES (MODE 3): the tile's columns are in [0, H) and it writes dh1's (cols) and dh3's (cols + H) from one
    # sigmoid and one read of da / h1 / h3. AMAX_FIRST: see _mx_store.
    CL = H if HALVES else C
    pid_m, pid_d, rows, cols, rmask, cmask = _tile(P, CL, BM, BD)
    v, v2, dot = _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE, K, True, IS_BF16,
                         HALVES)
    if MODE == 1:
        tl.store(dot_ptr + pid_d * P + rows, dot, mask=rmask)
    kb = pid_d * (BD // 32) + tl.arange(0, BD // 32)
    kmask = kb < CL // 32
    _mx_store(v, pid_m, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C, QB, BM, BD,
              HW_CAST, COL_TILE, AMAX_FIRST)
    if HALVES:
        _mx_store(v2, pid_m, rows, rmask, cols + H, cmask, kb + H // 32, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C,
                  QB, BM, BD, HW_CAST, COL_TILE, AMAX_FIRST)

@triton.jit
def _tile(P, CL, BM: tl.constexpr, BD: tl.constexpr):
    """This program's BM x BD tile of a [P, CL] walk (neighbouring programs walk along the columns). Only scalars
    go in: torch.compile's analysis of which tensors a kernel writes (triton_op launches) follows every argument
    of a call whose result feeds a store address, so addresses must not come out of a call that reads a tensor."""
    pid_m, pid_d = _tile_ids(P, CL, BM, BD, True)
    rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    cols = pid_d * BD + tl.arange(0, BD)
    return pid_m, pid_d, rows, cols, rows < P, cols < CL

@triton.jit
def _tile_ids(M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, K_FAST: tl.constexpr, GROUP_M: tl.constexpr = 0):
    """1-D grid -> (pid_m, pid_k). K_FAST: neighbouring programs walk along K, so the programs in flight read
    whole row bands (long contiguous runs); else they walk down M (one BLOCK_K-wide strip of many rows).
    GROUP_M > 0 (overrides K_FAST): bands of GROUP_M row tiles, walked down M first and then along K, so the
    programs in flight cover GROUP_M * BLOCK_M consecutive rows of a few K strips: for a [K, M] output
    every K row then receives GROUP_M * BLOCK_M contiguous bytes at about the same time (whole lines to
    merge in L2) while each program still reads BLOCK_K-wide row runs."""
    pid = tl.program_id(0)
    if GROUP_M > 0:
        n_m = tl.cdiv(M, BLOCK_M)
        per_group = GROUP_M * tl.cdiv(K, BLOCK_K)
        first_m = (pid // per_group) * GROUP_M
        g_size = tl.minimum(n_m - first_m, GROUP_M)
        in_group = pid % per_group
        pid_m = first_m + in_group % g_size
        pid_k = in_group // g_size
    elif K_FAST:
        n_k = tl.cdiv(K, BLOCK_K)
        pid_m = pid // n_k
        pid_k = pid - pid_m * n_k
    else:
        n_m = tl.cdiv(M, BLOCK_M)
        pid_k = pid // n_m
        pid_m = pid - pid_k * n_m
    return pid_m, pid_k

@triton.jit
def _values(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, rows, rmask, cols, cmask, N, C, H, MODE: tl.constexpr,
            K: tl.constexpr, WANT_DOT: tl.constexpr, IS_BF16: tl.constexpr, HALVES: tl.constexpr = False):
    """(v, v2, dot): the fp32 tile [BM, BC] to quantize (rows int64 buffer rows, cols int32 output columns), and,
    MODE 1 with WANT_DOT, the per-row partial dot <dout, y> over these columns (else zeros). HALVES (MODE 3
    only): cols are in [0, H) and v / v2 are dh1 (output columns cols) / dh3 (cols + H) from ONE sigmoid of h1
    and one read of da, h1, h3; otherwise v2 is v."""
    dot = tl.zeros(rows.shape, dtype=tl.float32)
    if MODE == 0:  # dispatch: a = x [N, C], b = src
        t, real = _gather_src(b_ptr, rows, rmask, N)
        m = real[:, None] & cmask[None, :]
        v = _widen(_load_raw(a_ptr, t[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
    elif MODE == 1:  # combine backward: a = dout [N, C], b = src, c = pos [N*K], d = weights fp32 [N, K], e = y
        t, real = _gather_src(b_ptr, rows, rmask, N)
        w = tl.zeros(rows.shape, dtype=tl.float32)
        for j in tl.static_range(K):
            p = tl.load(c_ptr + t * K + j, mask=real, other=-1)
            wj = tl.load(d_ptr + t * K + j, mask=real, other=0.0)
            w = tl.where(p == rows, wj, w)
        m = real[:, None] & cmask[None, :]
        g = _widen(_load_raw(a_ptr, t[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
        v = _mul(w[:, None], g)
        if WANT_DOT:
            yv = _widen(_load_raw(e_ptr, rows[:, None] * C + cols[None, :], m, IS_BF16), IS_BF16)
            dot = tl.sum(g * yv, 1)
    elif MODE == 2:  # SwiGLU: a = h13 [P, 2H]; C == H
        m = rmask[:, None] & cmask[None, :]
        base = rows[:, None] * (2 * H) + cols[None, :]
        h1 = _widen(_load_raw(a_ptr, base, m, IS_BF16), IS_BF16)
        h3 = _widen(_load_raw(a_ptr, base + H, m, IS_BF16), IS_BF16)
        v = _mul(_mul(h1, _sigmoid(h1)), h3)
    elif HALVES:  # SwiGLU backward, both halves: a = da [P, H], b = h13 [P, 2H]; cols in [0, H)
        v, v2 = _swiglu_grads(a_ptr, b_ptr, rows, cols, rmask[:, None] & cmask[None, :], H, IS_BF16)
    else:  # SwiGLU backward: a = da [P, H], b = h13 [P, 2H]; C == 2H, column c < H: dh1, else dh3
        hi = cols >= H
        dh1, dh3 = _swiglu_grads(a_ptr, b_ptr, rows, tl.where(hi, cols - H, cols), rmask[:, None] & cmask[None, :],
                                 H, IS_BF16)
        v = tl.where(hi[None, :], dh3, dh1)
    if not HALVES:
        v2 = v
    return v, v2, dot

@triton.jit
def _gather_src(src_ptr, rows, rmask, N):
    t = tl.load(src_ptr + rows, mask=rmask, other=N)
    real = rmask & (t < N)
    return tl.where(real, t, 0), real

@triton.jit
def _widen(x, IS_BF16: tl.constexpr):
    """Storage type -> fp32. IS_BF16 (interpreter only): bf16 arrives as its int16 bits and is widened by a
    shift, because the Triton interpreter's bf16 -> fp32 conversion gets bf16 subnormals wrong (triton 3.6:
    5.23e-39 -> 9.18e-39, 1e-40 -> 0)."""
    if IS_BF16:
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)

@triton.jit
def _load_raw(ptr, offs, mask, IS_BF16: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """Load x in its storage type (bf16 as int16 bits under the interpreter, see _widen). EVICT_FIRST: the
    input is read exactly once, so ask L2 to drop it first and keep room for the outputs being merged."""
    other = 0 if IS_BF16 else 0.0
    if EVICT_FIRST:
        x = tl.load(ptr + offs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptr + offs, mask=mask, other=other)
    return x

@triton.jit
def _mul(a, b):
    return _rounded(a, b, _MUL)

@triton.jit
def _rounded(a, b, ASM: tl.constexpr):
    """One correctly rounded fp32 op (see the module docstring): inline PTX when compiled, numpy when interpreted."""
    a, b = tl.broadcast(a, b)
    if _RN:
        r = tl.inline_asm_elementwise(ASM, "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)
    elif ASM == _MUL:
        r = a * b
    else:
        r = a + b
    return r

_RN = tl.constexpr(True)

_MUL = tl.constexpr('mul.rn.f32 $0, $1, $2;')

@triton.jit
def _sigmoid(x):
    """reference._sigmoid, op for op."""
    xs = tl.where(x != x, 0.0, x)  # NaN handled at the end (keeps the integer cast below defined)
    t = _mul(xs, _k(x, _NEG_LOG2E))
    t = tl.minimum(tl.maximum(t, _LO), _HI)
    n = tl.floor(_add(t, _k(x, 0.5)))
    f = _add(t, -n)
    p = _k(x, _C7)
    p = _add(_mul(p, f), _k(x, _C6))
    p = _add(_mul(p, f), _k(x, _C5))
    p = _add(_mul(p, f), _k(x, _C4))
    p = _add(_mul(p, f), _k(x, _C3))
    p = _add(_mul(p, f), _k(x, _C2))
    p = _add(_mul(p, f), _k(x, _C1))
    p = _add(_mul(p, f), _k(x, _C0))
    two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    s = _rcp(_add(_mul(p, two_n), _k(x, 1.0)))
    return tl.where(x != x, x, s)

@triton.jit
def _k(x, c):
    """The constant c as an fp32 tensor shaped like x (the *_rn helpers take tensors)."""
    return tl.full(x.shape, c, tl.float32)

_NEG_LOG2E = tl.constexpr(-1.4426950216293335)

_LO = tl.constexpr(-64.0)

_HI = tl.constexpr(127.0)

@triton.jit
def _add(a, b):
    return _rounded(a, b, _ADD)

_ADD = tl.constexpr('add.rn.f32 $0, $1, $2;')

_C7 = tl.constexpr(1.5252733646775596e-05)

_C6 = tl.constexpr(0.0001540352968731895)

_C5 = tl.constexpr(0.0013333557872101665)

_C4 = tl.constexpr(0.009618128649890423)

_C3 = tl.constexpr(0.05550410971045494)

_C2 = tl.constexpr(0.24022650718688965)

_C1 = tl.constexpr(0.6931471824645996)

_C0 = tl.constexpr(1.0)

@triton.jit
def _rcp(x):
    """1 / x correctly rounded (IEEE, as torch.reciprocal / div.rn): rcp.rn.f32 is shorter than div.rn.f32."""
    if _RN:
        r = tl.inline_asm_elementwise("rcp.rn.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = 1.0 / x
    return r

@triton.jit
def _swiglu_grads(da_ptr, h13_ptr, rows, cc, m, H, IS_BF16: tl.constexpr):
    """(dh1, dh3) at columns cc of [0, H) (reference.swiglu_grad_values, op for op) from da [P, H], h13 [P, 2H]."""
    base = rows[:, None] * (2 * H) + cc[None, :]
    g = _widen(_load_raw(da_ptr, rows[:, None] * H + cc[None, :], m, IS_BF16), IS_BF16)
    h1 = _widen(_load_raw(h13_ptr, base, m, IS_BF16), IS_BF16)
    h3 = _widen(_load_raw(h13_ptr, base + H, m, IS_BF16), IS_BF16)
    s = _sigmoid(h1)
    one = _k(s, 1.0)
    dsilu = _mul(s, _add(_mul(h1, _add(-s, one)), one))
    return _mul(_mul(g, h3), dsilu), _mul(g, _mul(h1, s))

@triton.jit
def _mx_store(v, pid_m, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, qc_ptr, sc_ptr, P, C,
              QB: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr, COL_TILE: tl.constexpr,
              AMAX_FIRST: tl.constexpr):
    """Quantize the tile v [BM, BD] (output columns cols; their 32-blocks kb) both ways and store it: the row copy,
    then the token-major copy. AMAX_FIRST: both amaxes are taken before the row copy is encoded (no other
    difference: same values, same bytes); for MODE 1 at 128 x 128 / 8 warps ptxas then needs 128 registers
    instead of 143 (sm_90a), i.e. two programs per SM instead of one."""
    xr = tl.reshape(v, [BM, BD // QB, QB])
    ar = _amax_bits(xr, 2)
    xc = tl.reshape(v, [BM // QB, QB, BD])
    if AMAX_FIRST:
        ac = _col_amax(xc, ar, BM, BD, QB, COL_TILE)
    _mx_store_rows(xr, ar, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, C, QB, BM, BD, HW_CAST)
    if not AMAX_FIRST:
        ac = _col_amax(xc, ar, BM, BD, QB, COL_TILE)
    _mx_store_cols(xc, ac, pid_m, rows, rmask, cols, cmask, qc_ptr, sc_ptr, P, C, QB, BM, BD, HW_CAST)

@triton.jit
def _amax_bits(x, axis: tl.constexpr):
    """Bits of max|x| along `axis` (sign cleared); >= 0x7F800000 iff the block holds NaN or inf. Compiled: one
    FMNMX.NAN with |.| operands per element (max.NaN.f32: a NaN anywhere makes the max NaN; no .ftz, so
    fp32 subnormals compare as themselves), the same order as the integer compare of the magnitude bits."""
    if _AMAX_ON_INT_BITS:
        return tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis)
    return tl.reduce(tl.abs(x), axis, _max_nan).to(tl.int32, bitcast=True) & 0x7FFFFFFF

_AMAX_ON_INT_BITS = tl.constexpr(False)

@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

@triton.jit
def _col_amax(xc, ar, BM: tl.constexpr, BD: tl.constexpr, QB: tl.constexpr, COL_TILE: tl.constexpr):
    """Amax bits [BM // QB, BD] of the token-major blocks (QB tokens of one column; COL_TILE == BD: of all the
    tile's columns, i.e. the max of those rows' amaxes ar, no second pass over the values)."""
    if COL_TILE > 1:
        ac = tl.max(tl.reshape(tl.max(ar, axis=1), [BM // QB, QB]), axis=1)
        ac = tl.broadcast_to(ac[:, None], [BM // QB, BD])
    else:
        ac = _amax_bits(xc, 1)
    return ac

@triton.jit
def _mx_store_rows(xr, ar, rows, rmask, cols, cmask, kb, kmask, qr_ptr, sr_ptr, C, QB: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr):
    """The row copy (blocks of QB along the features) of xr [BM, BD // QB, QB] with amax bits ar."""
    er = _exponent_from_amax_bits(ar)
    cr = _encode(xr * _multiplier(ar, er, HW_CAST)[:, :, None], (ar >= 0x7F800000)[:, :, None], HW_CAST)
    tl.store(qr_ptr + rows[:, None] * C + cols[None, :], tl.reshape(cr, [BM, BD]),
             mask=rmask[:, None] & cmask[None, :])
    sb = _scale_byte(ar, er).to(tl.uint8)
    sb = tl.reshape(tl.broadcast_to(sb[:, :, None], [BM, BD // QB, QB // 32]), [BM, BD // 32])
    tl.store(sr_ptr + rows[:, None] * (C // 32) + kb[None, :], sb, mask=rmask[:, None] & kmask[None, :])

@triton.jit
def _exponent_from_amax_bits(a):
    """a: int32 bits of amax (sign cleared). Returns e = clamp(ceil(log2(fl(amax / 448))), -127, 127)."""
    ea = a >> 23
    man = a & 0x7FFFFF
    e = ea - 135 + (man > 0x600000).to(tl.int32)
    e = tl.where((ea == 8) & (man == 0x600001), -127, e)
    return tl.minimum(tl.maximum(e, -127), 127)

@triton.jit
def _encode(y, nonfinite, HW_CAST: tl.constexpr):
    """y = x * 2^-e (fp32) -> e4m3fn byte (uint8) of clamp(y, -448, 448), round to nearest even; elements of a
    non-finite block -> 0x7F."""
    if HW_CAST:
        # cvt.rn.satfinite.e4m3x2.f32: RNE, saturates beyond +-448 (our clamp), NaN -> 0x7F
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        yb = y.to(tl.int32, bitcast=True)
        sign = (yb >> 24) & 0x80
        ab = tl.minimum(yb & 0x7FFFFFFF, 0x43E00000)  # |y| clamped to 448 (on the bits: same order)
        r = ab + 0x7FFFF + ((ab >> 20) & 1)  # round the 23-bit mantissa to 3 bits, nearest even
        code_n = (r >> 20) - 960  # (exp << 3 | mant) re-biased 127 -> 7
        f = ab.to(tl.float32, bitcast=True) + 16384.0  # ulp(2^14) = 2^-9: RNE onto the subnormal grid
        code_s = f.to(tl.int32, bitcast=True) - 0x46800000  # k * 2^-9 -> k (k = 8 is 2^-6 = 0x08: seamless)
        code = tl.where(ab < 0x3C800000, code_s, code_n) | sign
        code = tl.where(nonfinite, 0x7F, code).to(tl.uint8)
    return code

@triton.jit
def _multiplier(a, e, HW_CAST: tl.constexpr):
    """Per-block factor 2^-e. On the hardware-cast path a non-finite block gets NaN instead, so every element
    becomes NaN and the cvt writes e4m3fn's NaN byte 0x7F with no per-element select."""
    m = _pow2_neg(e)
    if HW_CAST:
        m = tl.where(a >= 0x7F800000, float("nan"), m)
    return m

@triton.jit
def _pow2_neg(e):
    """2^-e as fp32 for e in [-127, 121] (never subnormal)."""
    return ((127 - e) << 23).to(tl.float32, bitcast=True)

@triton.jit
def _scale_byte(a, e):
    return tl.where(a >= 0x7F800000, 255, e + 127)

@triton.jit
def _mx_store_cols(xc, ac, pid_m, rows, rmask, cols, cmask, qc_ptr, sc_ptr, P, C, QB: tl.constexpr,
                   BM: tl.constexpr, BD: tl.constexpr, HW_CAST: tl.constexpr):
    """The token-major copy (blocks of QB tokens, stored transposed) of xc [BM // QB, QB, BD] with amax bits ac."""
    ec = _exponent_from_amax_bits(ac)
    cc = _encode(xc * _multiplier(ac, ec, HW_CAST)[:, None, :], (ac >= 0x7F800000)[:, None, :], HW_CAST)
    cc = tl.reshape(cc, [BM, BD])
    tl.store(qc_ptr + cols[:, None].to(tl.int64) * P + rows[None, :], tl.trans(cc),
             mask=cmask[:, None] & rmask[None, :])
    sc = _scale_byte(ac, ec).to(tl.uint8)
    sc = tl.reshape(tl.broadcast_to(sc[:, None, :], [BM // QB, QB // 32, BD]), [BM // 32, BD])
    mb = pid_m.to(tl.int64) * (BM // 32) + tl.arange(0, BM // 32)
    tl.store(sc_ptr + mb[:, None] * C + cols[None, :], sc, mask=(mb < P // 32)[:, None] & cmask[None, :])
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/wq/cwqys52tqb4rmo2o5xwfdb6bo5tsl7u64xtaz73p7le336wwvyzv.py
# Topologically Sorted Source Nodes: [mod_2, eq, all_1, _assert_async], Original ATen: [aten.remainder, aten.eq, aten.all, aten._assert_async]
# Source node to ATen node mapping:
#   _assert_async => _assert_async
#   all_1 => any_1, logical_not, logical_not_1
#   eq => eq_61
#   mod_2 => remainder
# Graph fragment:
#   %convert_element_type_2 : Tensor "i32[8][1]cuda:0" = PlaceHolder[target=convert_element_type_2]
#   %any_1 : Tensor "b8[][]cuda:0" = PlaceHolder[target=any_1]
#   %logical_not_1 : Tensor "b8[][]cuda:0" = PlaceHolder[target=logical_not_1]
#   %remainder : Tensor "i32[8][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.remainder.Scalar](args = (%convert_element_type_2, 128), kwargs = {})
#   %eq_61 : Tensor "b8[8][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.eq.Scalar](args = (%remainder, 0), kwargs = {})
#   %logical_not : Tensor "b8[8][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.logical_not.default](args = (%eq_61,), kwargs = {})
#   %any_1 : Tensor "b8[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.any.dims](args = (%logical_not,), kwargs = {})
#   %logical_not_1 : Tensor "b8[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.logical_not.default](args = (%any_1,), kwargs = {})
#   %_assert_async : [num_users=0] = call_function[target=torch.ops.aten._assert_async.msg](args = (%logical_not_1, mxfp8_grouped_mm_wgrad (cutlass): every group must start and end on a multiple of 128 tokens (pad groups to 128)), kwargs = {})
#   return %any_1,%logical_not_1,%_assert_async
triton_per_fused__assert_async_all_eq_remainder_0 = async_compile.triton('triton_per_fused__assert_async_all_eq_remainder_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 1, 'r0_': 8},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*i32', 'xnumel': 'constexpr', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {'xnumel': 1}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__assert_async_all_eq_remainder_0', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': -1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'r0_': 32}}
)
@triton.jit
def triton_per_fused__assert_async_all_eq_remainder_0(in_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 1
    r0_numel = 8
    R0_BLOCK: tl.constexpr = 8
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_0 = r0_index
    tmp0 = tl.load(in_ptr0 + (r0_0), None)
    tmp1 = tl.full([1, 1], 128, tl.int32)
    tmp2 = (tmp0 % tmp1)
    tmp3 = tl.full([1, 1], 0, tl.int32)
    tmp4 = tmp2 != tmp3
    tmp5 = (libdevice.signbit(tmp2) != 0) if (tmp2).dtype is tl.float32 else tmp2 < 0
    tmp6 = (libdevice.signbit(tmp1) != 0) if (tmp1).dtype is tl.float32 else tmp1 < 0
    tmp7 = tmp5 != tmp6
    tmp8 = tmp4 & tmp7
    tmp9 = tmp2 + tmp1
    tmp10 = tl.where(tmp8, tmp9, tmp2)
    tmp11 = tmp10 == tmp3
    tmp12 = tmp11 == 0
    tmp13 = tl.broadcast_to(tmp12, [XBLOCK, R0_BLOCK])
    tmp15 = triton_helpers.any(tmp13, 1)[:, None].to(tl.int1)
    tmp16 = tmp15 == 0
    tl.device_assert(tmp16, 'mxfp8_grouped_mm_wgrad (cutlass): every group must start and end on a multiple of 128 tokens (pad groups to 128)')
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/2v/c2vg44o6fqhwmtkghdtcqaxtsup4lb6ra7nqfpzgn2fl2iktlr3a.py
# Topologically Sorted Source Nodes: [ones_like, dx], Original ATen: [aten.ones_like]
# Source node to ATen node mapping:
#   dx => triton_kernel_wrapper_mutation
#   ones_like => full_default_2
# Graph fragment:
#   %full_default_2 : Tensor "f32[s27, 2][2, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([%primals_1, 2], 1), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %triton_kernel_wrapper_mutation : [num_users=0] = call_function[target=torch.ops.higher_order.triton_kernel_wrapper_mutation](args = (), kwargs = {kernel_idx: 90, constant_args_idx: 86, grid: [(%mul_72, 1, 1)], tma_descriptor_metadata: {}, kwargs: {y_ptr: %mx128_dgrad_in_parts_cutlass_1, pos_ptr: %index_put_1, w_ptr: %full_default_2, out_ptr: %empty_27, N: %primals_1, D: 7168, K: 2, BN: 4, BD: 512, IS_BF16: False, OUT_BITS: False}})
#   return %buf29
triton_poi_fused_ones_like_1 = async_compile.triton('triton_poi_fused_ones_like_1', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 32768}, 
    filename=__file__,
    triton_meta={'signature': {'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused_ones_like_1', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 0, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 262144}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_ones_like_1(out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.full([1], 1.0, tl.float32)
    tl.store(out_ptr0 + (x0), tmp0, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/t2/ct2s4kmetg6fp4usr4pskij2eroguoylziqbgipk2fzmiol2mmyj.py
# Topologically Sorted Source Nodes: [moe_combine_backward_traced_default, full_default_3, scatter_add], Original ATen: [aten.index_select, aten.view, aten.new_zeros, aten.scatter_add]
# Source node to ATen node mapping:
#   full_default_3 => full_default_3
#   moe_combine_backward_traced_default => index_1, view_29
#   scatter_add => scatter_add
# Graph fragment:
#   %index_1 : Tensor "f32[2*s27][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.index.Tensor](args = (%sum_2, [%index_put_1]), kwargs = {})
#   %view_29 : Tensor "f32[s27, 2][2, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%index_1, [%primals_1, 2]), kwargs = {})
#   %full_default_3 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([%primals_1, 8], 0), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %scatter_add : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.scatter_add.default](args = (%full_default_3, 1, %getitem_1, %view_29), kwargs = {})
#   return %scatter_add
triton_poi_fused_index_select_new_zeros_scatter_add_view_2 = async_compile.triton('triton_poi_fused_index_select_new_zeros_scatter_add_view_2', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 131072}, 
    filename=__file__,
    triton_meta={'signature': {'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused_index_select_new_zeros_scatter_add_view_2', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 0, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 1048576}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_index_select_new_zeros_scatter_add_view_2(out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.full([1], 0.0, tl.float32)
    tl.store(out_ptr0 + (x0), tmp0, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/ns/cns57ibhsmdvhkcrz3776hhxlueuiycbazwi7ympyww4xtxl64hr.py
# Topologically Sorted Source Nodes: [moe_combine_backward_traced_default], Original ATen: [aten.sum]
# Source node to ATen node mapping:
#   moe_combine_backward_traced_default => sum_2
# Graph fragment:
#   %buf9 : Tensor  = PlaceHolder[target=buf9]
#   %sum_2 : Tensor "f32[128*(((2*s27 + 1143)//128))][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%empty_22, [0]), kwargs = {})
#   return %sum_2
triton_per_fused_sum_3 = async_compile.triton('triton_per_fused_sum_3', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 65536, 'r0_': 64},
    reduction_hint=ReductionHint.DEFAULT,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr0': '*fp32', 'ks0': 'i64', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused_sum_3', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 270336, 'r0_': 0}}
)
@triton.jit
def triton_per_fused_sum_3(in_ptr0, out_ptr0, ks0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    r0_numel = 56
    R0_BLOCK: tl.constexpr = 64
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = r0_index < r0_numel
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0 + 128*r0_1*((1143 + 2*ks0) // 128)), r0_mask & xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(r0_mask & xmask, tmp1, 0)
    tmp4 = tl.sum(tmp3, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp4, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/ns/cns2luefcg4rdhmska3z5mothlzpcmladuhhs463l5cnbe2x4qpw.py
# Topologically Sorted Source Nodes: [moe_combine_backward_traced_default, full_default_3, scatter_add], Original ATen: [aten.index_select, aten.view, aten.new_zeros, aten.scatter_add]
# Source node to ATen node mapping:
#   full_default_3 => full_default_3
#   moe_combine_backward_traced_default => index_1, view_29
#   scatter_add => scatter_add
# Graph fragment:
#   %getitem_1 : Tensor "i64[s27, 2][2, 1]cuda:0" = PlaceHolder[target=getitem_1]
#   %index_put_1 : Tensor "i64[2*s27][1]cuda:0" = PlaceHolder[target=index_put_1]
#   %sum_2 : Tensor "f32[128*(((2*s27 + 1143)//128))][1]cuda:0" = PlaceHolder[target=sum_2]
#   %scatter_add : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=scatter_add]
#   %index_1 : Tensor "f32[2*s27][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.index.Tensor](args = (%sum_2, [%index_put_1]), kwargs = {})
#   %view_29 : Tensor "f32[s27, 2][2, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%index_1, [%primals_1, 2]), kwargs = {})
#   %full_default_3 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([%primals_1, 8], 0), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %scatter_add : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.scatter_add.default](args = (%full_default_3, 1, %getitem_1, %view_29), kwargs = {})
#   return %buf34
triton_poi_fused_index_select_new_zeros_scatter_add_view_4 = async_compile.triton('triton_poi_fused_index_select_new_zeros_scatter_add_view_4', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 32768}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*i64', 'in_ptr1': '*i64', 'in_ptr2': '*fp32', 'out_ptr0': '*fp32', 'ks0': 'i64', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused_index_select_new_zeros_scatter_add_view_4', 'mutated_arg_names': ['out_ptr0'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': True, 'num_load': 2, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 524288}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_index_select_new_zeros_scatter_add_view_4(in_ptr0, in_ptr1, in_ptr2, out_ptr0, ks0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x2 = xindex
    x1 = xindex // 2
    tmp0 = tl.load(in_ptr0 + (x2), xmask)
    tmp2 = tl.load(in_ptr1 + (x2), xmask)
    tl.device_assert(((0 <= tmp0) & (tmp0 < 8)) | ~(xmask), "index out of bounds: 0 <= tmp0 < 8")
    tmp3 = 128*((1143 + 2*ks0) // 128)
    tmp4 = tmp2 + tmp3
    tmp5 = tmp2 < 0
    tmp6 = tl.where(tmp5, tmp4, tmp2)
    tl.device_assert(((0 <= tmp6) & (tmp6 < 128*((1143 + 2*ks0) // 128))) | ~(xmask), "index out of bounds: 0 <= tmp6 < 128*((1143 + 2*ks0) // 128)")
    tmp8 = tl.load(in_ptr2 + (tmp6), xmask, eviction_policy='evict_last')
    tl.atomic_add(out_ptr0 + (tmp0 + 8*x1), tmp8, xmask, sem='relaxed')
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/ih/cihm3ggi2prdxtbliyxscplgdevptgdtmqd66qf5png6ky7n6lxj.py
# Topologically Sorted Source Nodes: [mul_87, sum_3], Original ATen: [aten._softmax_backward_data]
# Source node to ATen node mapping:
#   mul_87 => mul_87
#   sum_3 => sum_3
# Graph fragment:
#   %buf34 : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=buf34]
#   %div : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=div]
#   %mul_87 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%scatter_add, %div), kwargs = {})
#   %sum_3 : Tensor "f32[s27, 1][1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_87, [-1], True), kwargs = {})
#   return %sum_3
triton_per_fused__softmax_backward_data_5 = async_compile.triton('triton_per_fused__softmax_backward_data_5', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 16384, 'r0_': 8},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'in_ptr1': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__softmax_backward_data_5', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 2, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 131072, 'r0_': 524288}}
)
@triton.jit
def triton_per_fused__softmax_backward_data_5(in_ptr0, in_ptr1, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    r0_numel = 8
    R0_BLOCK: tl.constexpr = 8
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 8*x0), xmask, other=0.0)
    tmp1 = tl.load(in_ptr1 + (r0_1 + 8*x0), xmask, other=0.0)
    tmp2 = tmp0 * tmp1
    tmp3 = tl.broadcast_to(tmp2, [XBLOCK, R0_BLOCK])
    tmp5 = tl.where(xmask, tmp3, 0)
    tmp6 = tl.sum(tmp5, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp6, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/lz/clz3w6xpxvu2z3unozfcfkrndevar6urq3th3k3wrgvhvr7e7qdf.py
# Topologically Sorted Source Nodes: [mul_87, neg, fma, view, and_, hi, r, view_2, and__1, mid, sub_1, cat, to_1], Original ATen: [aten._softmax_backward_data, aten.view, aten.bitwise_and, aten.sub, aten.cat, aten._to_copy]
# Source node to ATen node mapping:
#   and_ => bitwise_and
#   and__1 => bitwise_and_1
#   cat => cat_2
#   fma => fma
#   hi => view_39
#   mid => view_41
#   mul_87 => mul_87
#   neg => neg
#   r => sub_56
#   sub_1 => sub_57
#   to_1 => convert_element_type_5
#   view => view_38
#   view_2 => view_40
# Graph fragment:
#   %div : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=div]
#   %sum_3 : Tensor "f32[s27, 1][1, s27]cuda:0" = PlaceHolder[target=sum_3]
#   %buf34 : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=buf34]
#   %cat_2 : Tensor "f32[s27, 24][24, 1]cuda:0" = PlaceHolder[target=cat_2]
#   %mul_87 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%scatter_add, %div), kwargs = {})
#   %neg : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%div,), kwargs = {})
#   %fma : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=10] = call_function[target=torch.ops.prims.fma.default](args = (%neg, %sum_3, %mul_87), kwargs = {})
#   %view_38 : Tensor "i32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.view.dtype](args = (%fma, torch.int32), kwargs = {})
#   %bitwise_and : Tensor "i32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.bitwise_and.Scalar](args = (%view_38, -65536), kwargs = {})
#   %view_39 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.view.dtype](args = (%bitwise_and, torch.float32), kwargs = {})
#   %sub_56 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.sub.Tensor](args = (%fma, %view_39), kwargs = {})
#   %view_40 : Tensor "i32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.view.dtype](args = (%sub_56, torch.int32), kwargs = {})
#   %bitwise_and_1 : Tensor "i32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.bitwise_and.Scalar](args = (%view_40, -65536), kwargs = {})
#   %view_41 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.view.dtype](args = (%bitwise_and_1, torch.float32), kwargs = {})
#   %sub_57 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%sub_56, %view_41), kwargs = {})
#   %cat_2 : Tensor "f32[s27, 24][24, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cat.default](args = ([%view_39, %view_41, %sub_57], 1), kwargs = {})
#   %convert_element_type_5 : Tensor "bf16[s27, 24][24, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%cat_2, torch.bfloat16), kwargs = {})
#   return %cat_2,%convert_element_type_5
triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6 = async_compile.triton('triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 524288}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'in_ptr1': '*fp32', 'in_ptr2': '*fp32', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 9, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 3145728}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6(in_ptr0, in_ptr1, in_ptr2, out_ptr1, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = (xindex % 24)
    x1 = xindex // 24
    x2 = xindex
    tmp0 = x0
    tmp1 = tl.full([1], 0, tl.int64)
    tmp2 = tmp0 >= tmp1
    tmp3 = tl.full([1], 8, tl.int64)
    tmp4 = tmp0 < tmp3
    tmp5 = tl.load(in_ptr0 + (8*x1 + (x0)), tmp4 & xmask, eviction_policy='evict_last', other=0.0)
    tmp6 = -tmp5
    tmp7 = tl.load(in_ptr1 + (x1), tmp4 & xmask, eviction_policy='evict_last', other=0.0)
    tmp8 = tl.load(in_ptr2 + (8*x1 + (x0)), tmp4 & xmask, eviction_policy='evict_last', other=0.0)
    tmp9 = tmp8 * tmp5
    tmp10 = tl.fma(tmp6, tmp7, tmp9)
    tmp11 = tmp10.to(tl.int32, bitcast=True)
    tmp12 = tl.full([1], -65536, tl.int32)
    tmp13 = tmp11 & tmp12
    tmp14 = tmp13.to(tl.float32, bitcast=True)
    tmp15 = tl.full(tmp14.shape, 0.0, tmp14.dtype)
    tmp16 = tl.where(tmp4, tmp14, tmp15)
    tmp17 = tmp0 >= tmp3
    tmp18 = tl.full([1], 16, tl.int64)
    tmp19 = tmp0 < tmp18
    tmp20 = tmp17 & tmp19
    tmp21 = tl.load(in_ptr0 + (8*x1 + ((-8) + x0)), tmp20 & xmask, eviction_policy='evict_last', other=0.0)
    tmp22 = -tmp21
    tmp23 = tl.load(in_ptr1 + (x1), tmp20 & xmask, eviction_policy='evict_last', other=0.0)
    tmp24 = tl.load(in_ptr2 + (8*x1 + ((-8) + x0)), tmp20 & xmask, eviction_policy='evict_last', other=0.0)
    tmp25 = tmp24 * tmp21
    tmp26 = tl.fma(tmp22, tmp23, tmp25)
    tmp27 = tmp26.to(tl.int32, bitcast=True)
    tmp28 = tl.full([1], -65536, tl.int32)
    tmp29 = tmp27 & tmp28
    tmp30 = tmp29.to(tl.float32, bitcast=True)
    tmp31 = tmp26 - tmp30
    tmp32 = tmp31.to(tl.int32, bitcast=True)
    tmp33 = tmp32 & tmp28
    tmp34 = tmp33.to(tl.float32, bitcast=True)
    tmp35 = tl.full(tmp34.shape, 0.0, tmp34.dtype)
    tmp36 = tl.where(tmp20, tmp34, tmp35)
    tmp37 = tmp0 >= tmp18
    tmp38 = tl.full([1], 24, tl.int64)
    tmp39 = tmp0 < tmp38
    tmp40 = tl.load(in_ptr0 + (8*x1 + ((-16) + x0)), tmp37 & xmask, eviction_policy='evict_last', other=0.0)
    tmp41 = -tmp40
    tmp42 = tl.load(in_ptr1 + (x1), tmp37 & xmask, eviction_policy='evict_last', other=0.0)
    tmp43 = tl.load(in_ptr2 + (8*x1 + ((-16) + x0)), tmp37 & xmask, eviction_policy='evict_last', other=0.0)
    tmp44 = tmp43 * tmp40
    tmp45 = tl.fma(tmp41, tmp42, tmp44)
    tmp46 = tmp45.to(tl.int32, bitcast=True)
    tmp47 = tl.full([1], -65536, tl.int32)
    tmp48 = tmp46 & tmp47
    tmp49 = tmp48.to(tl.float32, bitcast=True)
    tmp50 = tmp45 - tmp49
    tmp51 = tmp50.to(tl.int32, bitcast=True)
    tmp52 = tmp51 & tmp47
    tmp53 = tmp52.to(tl.float32, bitcast=True)
    tmp54 = tmp50 - tmp53
    tmp55 = tl.full(tmp54.shape, 0.0, tmp54.dtype)
    tmp56 = tl.where(tmp37, tmp54, tmp55)
    tmp57 = tl.where(tmp20, tmp36, tmp56)
    tmp58 = tl.where(tmp4, tmp16, tmp57)
    tmp59 = tmp58.to(tl.float32)
    tl.store(out_ptr1 + (x2), tmp59, xmask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/he/chepzer5gjnbimgvmew6s5i4necjljldyg6wg3x3i7gardhxntug.py
# Topologically Sorted Source Nodes: [view_4, sum_1, dw], Original ATen: [aten.view, aten.sum, aten._to_copy]
# Source node to ATen node mapping:
#   dw => convert_element_type_8
#   sum_1 => sum_4
#   view_4 => view_42
# Graph fragment:
#   %mm_1 : Tensor "f32[24, 7168][7168, 1]cuda:0" = PlaceHolder[target=mm_1]
#   %view_42 : Tensor "f32[3, 8, 7168][57344, 7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_1, [3, 8, 7168]), kwargs = {})
#   %sum_4 : Tensor "f32[8, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%view_42, [0]), kwargs = {})
#   %convert_element_type_8 : Tensor "bf16[8, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%sum_4, torch.bfloat16), kwargs = {})
#   return %convert_element_type_8
triton_poi_fused__to_copy_sum_view_7 = async_compile.triton('triton_poi_fused__to_copy_sum_view_7', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 65536}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_sum_view_7', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 917504}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_sum_view_7(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 57344
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None)
    tmp1 = tl.load(in_ptr0 + (57344 + x0), None)
    tmp3 = tl.load(in_ptr0 + (114688 + x0), None)
    tmp2 = tmp0 + tmp1
    tmp4 = tmp2 + tmp3
    tmp5 = tmp4.to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp5, None)
''', device_str='cuda')


# Original path: /work/main/kernels/moe/triton.py:439
_combine_kernel_2 = async_compile.triton('_combine_kernel', '''

import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

@triton_heuristics.user_autotune(
    configs=[{'num_warps': 4, 'num_stages': 3}],
    inductor_meta={'grid_type': 'FixedGrid', 'fixed_grid': ['_grid_0', '_grid_1', '_grid_2'], 'extra_launcher_args': ['_grid_0', '_grid_1', '_grid_2'], 'kernel_name': '_combine_kernel_2', 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False},
    triton_meta={'signature': {'y_ptr': '*bf16', 'pos_ptr': '*i64', 'w_ptr': '*fp32', 'out_ptr': '*bf16', 'N': 'i32', 'D': 'i32', 'K': 'constexpr', 'BN': 'constexpr', 'BD': 'constexpr', 'IS_BF16': 'constexpr', 'OUT_BITS': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {'K': 2, 'BN': 4, 'BD': 512, 'IS_BF16': False, 'OUT_BITS': False}, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]]}]},
    filename=__file__,
    custom_kernel=True,
)
@triton.jit
def _combine_kernel(y_ptr, pos_ptr, w_ptr, out_ptr, N, D, K: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                    IS_BF16: tl.constexpr, OUT_BITS: tl.constexpr):
    # out [N, D] = sum_j w[t, j] * y[pos[t*K + j]] in slot order (fp32, each product and sum rounded once).
    # OUT_BITS (interpreter, bf16 out): round to bf16 on the bits (nearest even) and store int16.
    pid_n, pid_d = _tile_ids(N, D, BN, BD, True)
    t = pid_n.to(tl.int64) * BN + tl.arange(0, BN)
    cols = pid_d * BD + tl.arange(0, BD)
    tmask = t < N
    m = tmask[:, None] & (cols < D)[None, :]
    acc = tl.zeros([BN, BD], dtype=tl.float32)
    for j in tl.static_range(K):
        p = tl.load(pos_ptr + t * K + j, mask=tmask, other=0)
        w = tl.load(w_ptr + t * K + j, mask=tmask, other=0.0)
        yv = _widen(_load_raw(y_ptr, p[:, None] * D + cols[None, :], m, IS_BF16), IS_BF16)
        acc = _add(acc, _mul(w[:, None], yv))
    if OUT_BITS:
        b = acc.to(tl.int32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(acc != acc, 0x7FC0, r)
        out = r.to(tl.int16)
    else:
        out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t[:, None] * D + cols[None, :], out, mask=m)

@triton.jit
def _tile_ids(M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, K_FAST: tl.constexpr, GROUP_M: tl.constexpr = 0):
    """1-D grid -> (pid_m, pid_k). K_FAST: neighbouring programs walk along K, so the programs in flight read
    whole row bands (long contiguous runs); else they walk down M (one BLOCK_K-wide strip of many rows).
    GROUP_M > 0 (overrides K_FAST): bands of GROUP_M row tiles, walked down M first and then along K, so the
    programs in flight cover GROUP_M * BLOCK_M consecutive rows of a few K strips: for a [K, M] output
    every K row then receives GROUP_M * BLOCK_M contiguous bytes at about the same time (whole lines to
    merge in L2) while each program still reads BLOCK_K-wide row runs."""
    pid = tl.program_id(0)
    if GROUP_M > 0:
        n_m = tl.cdiv(M, BLOCK_M)
        per_group = GROUP_M * tl.cdiv(K, BLOCK_K)
        first_m = (pid // per_group) * GROUP_M
        g_size = tl.minimum(n_m - first_m, GROUP_M)
        in_group = pid % per_group
        pid_m = first_m + in_group % g_size
        pid_k = in_group // g_size
    elif K_FAST:
        n_k = tl.cdiv(K, BLOCK_K)
        pid_m = pid // n_k
        pid_k = pid - pid_m * n_k
    else:
        n_m = tl.cdiv(M, BLOCK_M)
        pid_k = pid // n_m
        pid_m = pid - pid_k * n_m
    return pid_m, pid_k

@triton.jit
def _widen(x, IS_BF16: tl.constexpr):
    """Storage type -> fp32. IS_BF16 (interpreter only): bf16 arrives as its int16 bits and is widened by a
    shift, because the Triton interpreter's bf16 -> fp32 conversion gets bf16 subnormals wrong (triton 3.6:
    5.23e-39 -> 9.18e-39, 1e-40 -> 0)."""
    if IS_BF16:
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)

@triton.jit
def _load_raw(ptr, offs, mask, IS_BF16: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """Load x in its storage type (bf16 as int16 bits under the interpreter, see _widen). EVICT_FIRST: the
    input is read exactly once, so ask L2 to drop it first and keep room for the outputs being merged."""
    other = 0 if IS_BF16 else 0.0
    if EVICT_FIRST:
        x = tl.load(ptr + offs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(ptr + offs, mask=mask, other=other)
    return x

@triton.jit
def _add(a, b):
    return _rounded(a, b, _ADD)

@triton.jit
def _rounded(a, b, ASM: tl.constexpr):
    """One correctly rounded fp32 op (see the module docstring): inline PTX when compiled, numpy when interpreted."""
    a, b = tl.broadcast(a, b)
    if _RN:
        r = tl.inline_asm_elementwise(ASM, "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)
    elif ASM == _MUL:
        r = a * b
    else:
        r = a + b
    return r

_RN = tl.constexpr(True)

_MUL = tl.constexpr('mul.rn.f32 $0, $1, $2;')

_ADD = tl.constexpr('add.rn.f32 $0, $1, $2;')

@triton.jit
def _mul(a, b):
    return _rounded(a, b, _MUL)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/qr/cqrb3w5x7jydjroikqcppm6n6doszpvjadexmoegnxk3mgfzq2if.py
# Topologically Sorted Source Nodes: [mul_87, neg, fma, float_1, getitem, getitem_1, element, value, getitem_2, getitem_3, element_1, value_1, getitem_4, getitem_5, element_2, value_2, getitem_6, getitem_7, element_3, value_3, getitem_8, getitem_9, element_4, value_4, getitem_10, getitem_11, element_5, value_5, getitem_12, getitem_13, element_6, value_6, getitem_14, getitem_15, element_7, value_7, dx, add_127], Original ATen: [aten._softmax_backward_data, aten._to_copy, aten.select, aten.unsqueeze, aten.mul, aten.add]
# Source node to ATen node mapping:
#   add_127 => add_127
#   dx => convert_element_type_4
#   element => mul_88
#   element_1 => mul_89
#   element_2 => mul_90
#   element_3 => mul_91
#   element_4 => mul_92
#   element_5 => mul_93
#   element_6 => mul_94
#   element_7 => mul_95
#   float_1 => convert_element_type_3
#   fma => fma
#   getitem => select, unsqueeze_4
#   getitem_1 => select_1
#   getitem_10 => select_10, unsqueeze_9
#   getitem_11 => select_11
#   getitem_12 => select_12, unsqueeze_10
#   getitem_13 => select_13
#   getitem_14 => select_14, unsqueeze_11
#   getitem_15 => select_15
#   getitem_2 => select_2, unsqueeze_5
#   getitem_3 => select_3
#   getitem_4 => select_4, unsqueeze_6
#   getitem_5 => select_5
#   getitem_6 => select_6, unsqueeze_7
#   getitem_7 => select_7
#   getitem_8 => select_8, unsqueeze_8
#   getitem_9 => select_9
#   mul_87 => mul_87
#   neg => neg
#   value => add_119
#   value_1 => add_120
#   value_2 => add_121
#   value_3 => add_122
#   value_4 => add_123
#   value_5 => add_124
#   value_6 => add_125
#   value_7 => add_126
# Graph fragment:
#   %div : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=div]
#   %sum_3 : Tensor "f32[s27, 1][1, s27]cuda:0" = PlaceHolder[target=sum_3]
#   %buf34 : Tensor "f32[s27, 8][8, 1]cuda:0" = PlaceHolder[target=buf34]
#   %primals_3 : Tensor "bf16[8, 7168][7168, 1]cuda:0" = PlaceHolder[target=primals_3]
#   %add_121 : Tensor "f32[s27, 7168][7168, 1]cuda:0" = PlaceHolder[target=add_121]
#   %buf30 : Tensor  = PlaceHolder[target=buf30]
#   %add_124 : Tensor "f32[s27, 7168][7168, 1]cuda:0" = PlaceHolder[target=add_124]
#   %mul_87 : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%scatter_add, %div), kwargs = {})
#   %neg : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%div,), kwargs = {})
#   %fma : Tensor "f32[s27, 8][8, 1]cuda:0"[num_users=10] = call_function[target=torch.ops.prims.fma.default](args = (%neg, %sum_3, %mul_87), kwargs = {})
#   %convert_element_type_3 : Tensor "f32[8, 7168][7168, 1]cuda:0"[num_users=8] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%primals_3, torch.float32), kwargs = {})
#   %select : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 0), kwargs = {})
#   %unsqueeze_4 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select, 1), kwargs = {})
#   %select_1 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 0), kwargs = {})
#   %mul_88 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_4, %select_1), kwargs = {})
#   %add_119 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_88, 0), kwargs = {})
#   %select_2 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 1), kwargs = {})
#   %unsqueeze_5 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_2, 1), kwargs = {})
#   %select_3 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 1), kwargs = {})
#   %mul_89 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_5, %select_3), kwargs = {})
#   %add_120 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_119, %mul_89), kwargs = {})
#   %select_4 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 2), kwargs = {})
#   %unsqueeze_6 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_4, 1), kwargs = {})
#   %select_5 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 2), kwargs = {})
#   %mul_90 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_6, %select_5), kwargs = {})
#   %add_121 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_120, %mul_90), kwargs = {})
#   %select_6 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 3), kwargs = {})
#   %unsqueeze_7 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_6, 1), kwargs = {})
#   %select_7 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 3), kwargs = {})
#   %mul_91 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_7, %select_7), kwargs = {})
#   %add_122 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_121, %mul_91), kwargs = {})
#   %select_8 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 4), kwargs = {})
#   %unsqueeze_8 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_8, 1), kwargs = {})
#   %select_9 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 4), kwargs = {})
#   %mul_92 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_8, %select_9), kwargs = {})
#   %add_123 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_122, %mul_92), kwargs = {})
#   %select_10 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 5), kwargs = {})
#   %unsqueeze_9 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_10, 1), kwargs = {})
#   %select_11 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 5), kwargs = {})
#   %mul_93 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_9, %select_11), kwargs = {})
#   %add_124 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_123, %mul_93), kwargs = {})
#   %select_12 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 6), kwargs = {})
#   %unsqueeze_10 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_12, 1), kwargs = {})
#   %select_13 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 6), kwargs = {})
#   %mul_94 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_10, %select_13), kwargs = {})
#   %add_125 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_124, %mul_94), kwargs = {})
#   %select_14 : Tensor "f32[s27][8]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%fma, 1, 7), kwargs = {})
#   %unsqueeze_11 : Tensor "f32[s27, 1][8, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%select_14, 1), kwargs = {})
#   %select_15 : Tensor "f32[7168][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.select.int](args = (%convert_element_type_3, 0, 7), kwargs = {})
#   %mul_95 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze_11, %select_15), kwargs = {})
#   %add_126 : Tensor "f32[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_125, %mul_95), kwargs = {})
#   %convert_element_type_4 : Tensor "bf16[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_126, torch.bfloat16), kwargs = {})
#   %add_127 : Tensor "bf16[s27, 7168][7168, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%empty_27, %convert_element_type_4), kwargs = {})
#   return %add_121,%add_124,%add_127
triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8 = async_compile.triton('triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 134217728}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'in_ptr1': '*fp32', 'in_ptr2': '*fp32', 'in_ptr3': '*bf16', 'in_ptr4': '*bf16', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 26, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 469876736}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x1 = xindex // 7168
    x0 = (xindex % 7168)
    x2 = xindex
    tmp0 = tl.load(in_ptr0 + (8*x1), xmask, eviction_policy='evict_last')
    tmp2 = tl.load(in_ptr1 + (x1), xmask, eviction_policy='evict_last')
    tmp3 = tl.load(in_ptr2 + (8*x1), xmask, eviction_policy='evict_last')
    tmp6 = tl.load(in_ptr3 + (x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp11 = tl.load(in_ptr0 + (1 + 8*x1), xmask, eviction_policy='evict_last')
    tmp13 = tl.load(in_ptr2 + (1 + 8*x1), xmask, eviction_policy='evict_last')
    tmp16 = tl.load(in_ptr3 + (7168 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp20 = tl.load(in_ptr0 + (2 + 8*x1), xmask, eviction_policy='evict_last')
    tmp22 = tl.load(in_ptr2 + (2 + 8*x1), xmask, eviction_policy='evict_last')
    tmp25 = tl.load(in_ptr3 + (14336 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp29 = tl.load(in_ptr0 + (3 + 8*x1), xmask, eviction_policy='evict_last')
    tmp31 = tl.load(in_ptr2 + (3 + 8*x1), xmask, eviction_policy='evict_last')
    tmp34 = tl.load(in_ptr3 + (21504 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp38 = tl.load(in_ptr0 + (4 + 8*x1), xmask, eviction_policy='evict_last')
    tmp40 = tl.load(in_ptr2 + (4 + 8*x1), xmask, eviction_policy='evict_last')
    tmp43 = tl.load(in_ptr3 + (28672 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp47 = tl.load(in_ptr0 + (5 + 8*x1), xmask, eviction_policy='evict_last')
    tmp49 = tl.load(in_ptr2 + (5 + 8*x1), xmask, eviction_policy='evict_last')
    tmp52 = tl.load(in_ptr3 + (35840 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp56 = tl.load(in_ptr4 + (x2), xmask).to(tl.float32)
    tmp57 = tl.load(in_ptr0 + (6 + 8*x1), xmask, eviction_policy='evict_last')
    tmp59 = tl.load(in_ptr2 + (6 + 8*x1), xmask, eviction_policy='evict_last')
    tmp62 = tl.load(in_ptr3 + (43008 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp66 = tl.load(in_ptr0 + (7 + 8*x1), xmask, eviction_policy='evict_last')
    tmp68 = tl.load(in_ptr2 + (7 + 8*x1), xmask, eviction_policy='evict_last')
    tmp71 = tl.load(in_ptr3 + (50176 + x0), xmask, eviction_policy='evict_last').to(tl.float32)
    tmp1 = -tmp0
    tmp4 = tmp3 * tmp0
    tmp5 = tl.fma(tmp1, tmp2, tmp4)
    tmp7 = tmp6.to(tl.float32)
    tmp8 = tmp5 * tmp7
    tmp9 = tl.full([1], 0.0, tl.float32)
    tmp10 = tmp8 + tmp9
    tmp12 = -tmp11
    tmp14 = tmp13 * tmp11
    tmp15 = tl.fma(tmp12, tmp2, tmp14)
    tmp17 = tmp16.to(tl.float32)
    tmp18 = tmp15 * tmp17
    tmp19 = tmp10 + tmp18
    tmp21 = -tmp20
    tmp23 = tmp22 * tmp20
    tmp24 = tl.fma(tmp21, tmp2, tmp23)
    tmp26 = tmp25.to(tl.float32)
    tmp27 = tmp24 * tmp26
    tmp28 = tmp19 + tmp27
    tmp30 = -tmp29
    tmp32 = tmp31 * tmp29
    tmp33 = tl.fma(tmp30, tmp2, tmp32)
    tmp35 = tmp34.to(tl.float32)
    tmp36 = tmp33 * tmp35
    tmp37 = tmp28 + tmp36
    tmp39 = -tmp38
    tmp41 = tmp40 * tmp38
    tmp42 = tl.fma(tmp39, tmp2, tmp41)
    tmp44 = tmp43.to(tl.float32)
    tmp45 = tmp42 * tmp44
    tmp46 = tmp37 + tmp45
    tmp48 = -tmp47
    tmp50 = tmp49 * tmp47
    tmp51 = tl.fma(tmp48, tmp2, tmp50)
    tmp53 = tmp52.to(tl.float32)
    tmp54 = tmp51 * tmp53
    tmp55 = tmp46 + tmp54
    tmp58 = -tmp57
    tmp60 = tmp59 * tmp57
    tmp61 = tl.fma(tmp58, tmp2, tmp60)
    tmp63 = tmp62.to(tl.float32)
    tmp64 = tmp61 * tmp63
    tmp65 = tmp55 + tmp64
    tmp67 = -tmp66
    tmp69 = tmp68 * tmp66
    tmp70 = tl.fma(tmp67, tmp2, tmp69)
    tmp72 = tmp71.to(tl.float32)
    tmp73 = tmp70 * tmp72
    tmp74 = tmp65 + tmp73
    tmp75 = tmp74.to(tl.float32)
    tmp76 = tmp56 + tmp75
    tl.store(out_ptr0 + (x2), tmp76, xmask)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        primals_1, mul_24, floordiv_3, mul_45, mul_58, mul_72, primals_3, primals_4, primals_5, view, div, getitem_1, gather, convert_element_type_2, index_put, index_put_1, mx128_grouped_mm_rows_cutlass, mx128_grouped_mm_rows_cutlass_1, view_32, permute_5, view_37, permute_8, tangents_1 = args
        args.clear()
        s27 = primals_1
        assert_size_stride(primals_3, (8, 7168), (7168, 1))
        assert_size_stride(primals_4, (8, 4096, 7168), (29360128, 7168, 1))
        assert_size_stride(primals_5, (8, 7168, 2048), (14680064, 2048, 1))
        assert_size_stride(view, (s27, 7168), (7168, 1))
        assert_size_stride(div, (s27, 8), (8, 1))
        assert_size_stride(getitem_1, (s27, 2), (2, 1))
        assert_size_stride(gather, (s27, 2), (2, 1))
        assert_size_stride(convert_element_type_2, (8, ), (1, ))
        assert_size_stride(index_put, (128*((1143 + 2*s27) // 128), ), (1, ))
        assert_size_stride(index_put_1, (2*s27, ), (1, ))
        assert_size_stride(mx128_grouped_mm_rows_cutlass, (128*((1143 + 2*s27) // 128), 4096), (4096, 1))
        assert_size_stride(mx128_grouped_mm_rows_cutlass_1, (128*((1143 + 2*s27) // 128), 7168), (7168, 1))
        assert_size_stride(view_32, (2048, 128*((1143 + 2*s27) // 128)), (max(1, 128*((1143 + 2*s27) // 128)), 1))
        assert_size_stride(permute_5, (2048, 4*((1143 + 2*s27) // 128)), (1, 2048))
        assert_size_stride(view_37, (7168, 128*((1143 + 2*s27) // 128)), (max(1, 128*((1143 + 2*s27) // 128)), 1))
        assert_size_stride(permute_8, (7168, 4*((1143 + 2*s27) // 128)), (1, 7168))
        assert_size_stride(tangents_1, (1, s27, 7168), (7168*s27, 7168, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf1 = empty_strided_cuda((128*((1143 + 2*s27) // 128), 224), (224, 1), torch.uint8)
            buf3 = empty_strided_cuda((4*((1143 + 2*s27) // 128), 7168), (7168, 1), torch.uint8)
            buf4 = empty_strided_cuda((56, 128*((1143 + 2*s27) // 128)), (128*((1143 + 2*s27) // 128), 1), torch.float32)
            buf0 = empty_strided_cuda((128*((1143 + 2*s27) // 128), 7168), (7168, 1), torch.uint8)
            buf2 = empty_strided_cuda((7168, 128*((1143 + 2*s27) // 128)), (128*((1143 + 2*s27) // 128), 1), torch.uint8)
            # Topologically Sorted Source Nodes: [view_26, moe_combine_backward_traced_default], Original ATen: [aten.view]
            stream0 = get_raw_stream(0)
            _mx_kernel_0.run(reinterpret_tensor(tangents_1, (s27, 7168), (7168, 1), 0), index_put, index_put_1, gather, mx128_grouped_mm_rows_cutlass_1, buf0, buf1, buf2, buf3, buf4, s27, 128*((1143 + 2*s27) // 128), 7168, 0, 56*((1143 + 2*s27) // 128), 1, 1, stream=stream0)
            del gather
            del index_put
            del mx128_grouped_mm_rows_cutlass_1
            del tangents_1
            # Topologically Sorted Source Nodes: [da], Original ATen: [aten.view, titan_fp8.mx128_dgrad_in_parts_cutlass]
            buf11 = torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default(aten.view.dtype(buf0, torch.float8_e4m3fn), buf1, primals_5, convert_element_type_2, 2)
            del buf0
            del buf1
            del primals_5
            buf12 = buf11
            assert_size_stride(buf12, (128*((1143 + 2*s27) // 128), 2048), (2048, 1), 'torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default')
            assert_alignment(buf12, 16, 'torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default')
            del buf11
            # Topologically Sorted Source Nodes: [dw], Original ATen: [aten.view, aten.t, titan_fp8.mx128_grouped_mm_wgrad_cutlass]
            buf16 = torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default(aten.view.dtype(buf2, torch.float8_e4m3fn), reinterpret_tensor(buf3, (7168, 4*((1143 + 2*s27) // 128)), (1, 7168), 0), view_32, permute_5, convert_element_type_2, torch.bfloat16, 'wgrad')
            del buf2
            del buf3
            del permute_5
            del view_32
            buf17 = buf16
            assert_size_stride(buf17, (8, 7168, 2048), (14680064, 2048, 1), 'torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default')
            assert_alignment(buf17, 16, 'torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default')
            del buf16
            buf19 = empty_strided_cuda((128*((1143 + 2*s27) // 128), 128), (128, 1), torch.uint8)
            buf21 = empty_strided_cuda((4*((1143 + 2*s27) // 128), 4096), (4096, 1), torch.uint8)
            buf18 = empty_strided_cuda((128*((1143 + 2*s27) // 128), 4096), (4096, 1), torch.uint8)
            buf20 = empty_strided_cuda((4096, 128*((1143 + 2*s27) // 128)), (128*((1143 + 2*s27) // 128), 1), torch.uint8)
            # Topologically Sorted Source Nodes: [moe_swiglu_quantize_backward_traced_default], Original ATen: []
            stream0 = get_raw_stream(0)
            _mx_kernel_1.run(buf12, mx128_grouped_mm_rows_cutlass, buf12, buf12, buf12, buf18, buf19, buf20, buf21, buf19, 0, 128*((1143 + 2*s27) // 128), 4096, 2048, 16*((1143 + 2*s27) // 128), 1, 1, stream=stream0)
            del buf12
            del mx128_grouped_mm_rows_cutlass
            # Topologically Sorted Source Nodes: [dx_buf], Original ATen: [aten.view, titan_fp8.mx128_dgrad_in_parts_cutlass]
            buf26 = torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default(aten.view.dtype(buf18, torch.float8_e4m3fn), buf19, primals_4, convert_element_type_2, 2)
            del buf18
            del buf19
            del primals_4
            buf27 = buf26
            assert_size_stride(buf27, (128*((1143 + 2*s27) // 128), 7168), (7168, 1), 'torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default')
            assert_alignment(buf27, 16, 'torch.ops.titan_fp8.mx128_dgrad_in_parts_cutlass.default')
            del buf26
            # Topologically Sorted Source Nodes: [dw_1], Original ATen: [aten.view, aten.t, titan_fp8.mx128_grouped_mm_wgrad_cutlass]
            buf31 = torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default(aten.view.dtype(buf20, torch.float8_e4m3fn), reinterpret_tensor(buf21, (4096, 4*((1143 + 2*s27) // 128)), (1, 4096), 0), view_37, permute_8, convert_element_type_2, torch.bfloat16, 'wgrad')
            del buf20
            del buf21
            del permute_8
            del view_37
            buf32 = buf31
            assert_size_stride(buf32, (8, 4096, 7168), (29360128, 7168, 1), 'torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default')
            assert_alignment(buf32, 16, 'torch.ops.titan_fp8.mx128_grouped_mm_wgrad_cutlass.default')
            del buf31
            # Topologically Sorted Source Nodes: [mod_2, eq, all_1, _assert_async], Original ATen: [aten.remainder, aten.eq, aten.all, aten._assert_async]
            stream0 = get_raw_stream(0)
            triton_per_fused__assert_async_all_eq_remainder_0.run(convert_element_type_2, 1, 8, stream=stream0)
            del convert_element_type_2
            buf29 = empty_strided_cuda((s27, 2), (2, 1), torch.float32)
            # Topologically Sorted Source Nodes: [ones_like, dx], Original ATen: [aten.ones_like]
            triton_poi_fused_ones_like_1_xnumel = 2*s27
            stream0 = get_raw_stream(0)
            triton_poi_fused_ones_like_1.run(buf29, triton_poi_fused_ones_like_1_xnumel, stream=stream0)
            buf33 = empty_strided_cuda((s27, 8), (8, 1), torch.float32)
            # Topologically Sorted Source Nodes: [moe_combine_backward_traced_default, full_default_3, scatter_add], Original ATen: [aten.index_select, aten.view, aten.new_zeros, aten.scatter_add]
            triton_poi_fused_index_select_new_zeros_scatter_add_view_2_xnumel = 8*s27
            stream0 = get_raw_stream(0)
            triton_poi_fused_index_select_new_zeros_scatter_add_view_2.run(buf33, triton_poi_fused_index_select_new_zeros_scatter_add_view_2_xnumel, stream=stream0)
            buf10 = empty_strided_cuda((128*((1143 + 2*s27) // 128), ), (1, ), torch.float32)
            # Topologically Sorted Source Nodes: [moe_combine_backward_traced_default], Original ATen: [aten.sum]
            triton_per_fused_sum_3_xnumel = 128*((1143 + 2*s27) // 128)
            stream0 = get_raw_stream(0)
            triton_per_fused_sum_3.run(buf4, buf10, s27, triton_per_fused_sum_3_xnumel, 56, stream=stream0)
            del buf4
            # Topologically Sorted Source Nodes: [moe_combine_backward_traced_default, full_default_3, scatter_add], Original ATen: [aten.index_select, aten.view, aten.new_zeros, aten.scatter_add]
            triton_poi_fused_index_select_new_zeros_scatter_add_view_4_xnumel = 2*s27
            stream0 = get_raw_stream(0)
            triton_poi_fused_index_select_new_zeros_scatter_add_view_4.run(getitem_1, index_put_1, buf10, buf33, s27, triton_poi_fused_index_select_new_zeros_scatter_add_view_4_xnumel, stream=stream0)
            del buf10
            del getitem_1
            buf35 = empty_strided_cuda((s27, 1), (1, s27), torch.float32)
            # Topologically Sorted Source Nodes: [mul_87, sum_3], Original ATen: [aten._softmax_backward_data]
            stream0 = get_raw_stream(0)
            triton_per_fused__softmax_backward_data_5.run(buf33, div, buf35, s27, 8, stream=stream0)
            buf39 = empty_strided_cuda((s27, 24), (24, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [mul_87, neg, fma, view, and_, hi, r, view_2, and__1, mid, sub_1, cat, to_1], Original ATen: [aten._softmax_backward_data, aten.view, aten.bitwise_and, aten.sub, aten.cat, aten._to_copy]
            triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6_xnumel = 24*s27
            stream0 = get_raw_stream(0)
            triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6.run(div, buf35, buf33, buf39, triton_poi_fused__softmax_backward_data__to_copy_bitwise_and_cat_sub_view_6_xnumel, stream=stream0)
            buf40 = empty_strided_cuda((24, 7168), (7168, 1), torch.float32)
            # Topologically Sorted Source Nodes: [to_1, terms, parts], Original ATen: [aten._to_copy, aten.t, aten.mm]
            extern_kernels.mm_dtype(reinterpret_tensor(buf39, (24, s27), (1, 24), 0), view, out_dtype=torch.float32, out=buf40)
            del buf39
            del view
            buf41 = empty_strided_cuda((8, 7168), (7168, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_4, sum_1, dw], Original ATen: [aten.view, aten.sum, aten._to_copy]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_sum_view_7.run(buf40, buf41, 57344, stream=stream0)
            del buf40
            buf28 = empty_strided_cuda((s27, 7168), (7168, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [ones_like, dx], Original ATen: [aten.ones_like]
            stream0 = get_raw_stream(0)
            _combine_kernel_2.run(buf27, index_put_1, buf29, buf28, s27, 7168, 14*((3 + s27) // 4), 1, 1, stream=stream0)
            del buf27
            del buf29
            del index_put_1
            buf42 = empty_strided_cuda((s27, 7168), (7168, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [mul_87, neg, fma, float_1, getitem, getitem_1, element, value, getitem_2, getitem_3, element_1, value_1, getitem_4, getitem_5, element_2, value_2, getitem_6, getitem_7, element_3, value_3, getitem_8, getitem_9, element_4, value_4, getitem_10, getitem_11, element_5, value_5, getitem_12, getitem_13, element_6, value_6, getitem_14, getitem_15, element_7, value_7, dx, add_127], Original ATen: [aten._softmax_backward_data, aten._to_copy, aten.select, aten.unsqueeze, aten.mul, aten.add]
            triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8_xnumel = 7168*s27
            stream0 = get_raw_stream(0)
            triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8.run(div, buf35, buf33, primals_3, buf28, buf42, triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_8_xnumel, stream=stream0)
            del buf28
            del buf33
            del buf35
            del div
            del primals_3
        return (None, reinterpret_tensor(buf42, (1, s27, 7168), (7168*s27, 7168, 1), 0), buf41, buf32, buf17, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    primals_1 = 16384
    mul_24 = 33792
    floordiv_3 = 1056
    mul_45 = 14784
    mul_58 = 4224
    mul_72 = 57344
    primals_3 = rand_strided((8, 7168), (7168, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_4 = rand_strided((8, 4096, 7168), (29360128, 7168, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_5 = rand_strided((8, 7168, 2048), (14680064, 2048, 1), device='cuda:0', dtype=torch.bfloat16)
    view = rand_strided((16384, 7168), (7168, 1), device='cuda:0', dtype=torch.bfloat16)
    div = rand_strided((16384, 8), (8, 1), device='cuda:0', dtype=torch.float32)
    getitem_1 = rand_strided((16384, 2), (2, 1), device='cuda:0', dtype=torch.int64)
    gather = rand_strided((16384, 2), (2, 1), device='cuda:0', dtype=torch.float32)
    convert_element_type_2 = rand_strided((8, ), (1, ), device='cuda:0', dtype=torch.int32)
    index_put = rand_strided((33792, ), (1, ), device='cuda:0', dtype=torch.int64)
    index_put_1 = rand_strided((32768, ), (1, ), device='cuda:0', dtype=torch.int64)
    mx128_grouped_mm_rows_cutlass = rand_strided((33792, 4096), (4096, 1), device='cuda:0', dtype=torch.bfloat16)
    mx128_grouped_mm_rows_cutlass_1 = rand_strided((33792, 7168), (7168, 1), device='cuda:0', dtype=torch.bfloat16)
    view_32 = rand_strided((2048, 33792), (33792, 1), device='cuda:0', dtype=torch.float8_e4m3fn)
    permute_5 = rand_strided((2048, 1056), (1, 2048), device='cuda:0', dtype=torch.uint8)
    view_37 = rand_strided((7168, 33792), (33792, 1), device='cuda:0', dtype=torch.float8_e4m3fn)
    permute_8 = rand_strided((7168, 1056), (1, 7168), device='cuda:0', dtype=torch.uint8)
    tangents_1 = rand_strided((1, 16384, 7168), (117440512, 7168, 1), device='cuda:0', dtype=torch.bfloat16)
    return [primals_1, mul_24, floordiv_3, mul_45, mul_58, mul_72, primals_3, primals_4, primals_5, view, div, getitem_1, gather, convert_element_type_2, index_put, index_put_1, mx128_grouped_mm_rows_cutlass, mx128_grouped_mm_rows_cutlass_1, view_32, permute_5, view_37, permute_8, tangents_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
