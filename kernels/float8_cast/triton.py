"""Rowwise float8 (E4M3, power-of-two scale per row / column) casts in Triton: bit-identical to reference.py.

A float8 linear with rowwise scaling casts each GEMM operand with scales along its non-contracted dim:
  forward     x [M, K] per row,  w [N, K] per row
  grad-input  g [M, N] per row,  w per column (stored [K, N]: the column-major operand)
  grad-weight g per column (stored [N, M]), x per column (stored [K, M])
torch.compile (torchao's recipe, and ours before these kernels) reads every operand twice for its column
cast (a column amax reduction, then the cast), at 48-66% of the copy bandwidth on an H100
(benchmarks/float8_cast.py). Here:
  _rows_kernel     ONE read of x: row amax, row cast, and the column amax (a running maximum per program,
                   written as one row of partial maxima and reduced by a small second kernel), so the later
                   column cast needs no amax pass
  _cols_t_kernel   ONE read of x with the column amax known: column cast stored transposed ([N, M] row-major,
                   what the GEMM reads); with one given scale it is also the tensorwise transposing cast
                   (backward's recast of x for grad-weight), and with the row-major copy stored too, from the same
                   read, the tensorwise cast of the output gradient (e5m2) that both backward GEMMs read
x: 2 + 1 bytes per element for each cast instead of 2 + 2 + 1 for the column one.

Rows longer than _MAX_ROW elements do not fit one program's registers: they take the reference path
(kernels/float8_cast/__init__.py decides).

Scale: fl32(448 / max(amax, 1e-12)) computed in float64 (the reference's rule, amax_to_scale), rounded down to
a power of two on its bits; non-finite amax (NaN counted as inf) -> NaN scale -> every element of the row or
column is the NaN byte 0x7F.
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from kernels.grouped_gemm.triton_mx import _fix_interpreter_scalar_index
from kernels.launch_table import cached_table, next_pow2, table_member
from kernels.mxfp8.triton import _INTERPRET, _as_kernel_input, _encode, _load_raw, _tile_ids, _widen, default_hw_cast

if _INTERPRET:
    _fix_interpreter_scalar_index()  # the row-block loop has a run-time bound

_MAX_ROW = 16384  # widest row held in one program (elements); wider rows use the reference (__init__._MAX_ROW)


@triton.jit
def _pow2_scale(amax):
    """fp32 amax >= 0 (inf for NaN/inf groups) -> fp32 power-of-two scale, NaN where amax is inf."""
    q = (448.0 / tl.maximum(amax.to(tl.float64), 1e-12)).to(tl.float32)
    pow2 = (q.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where(amax == float("inf"), float("nan"), pow2)


@triton.jit
def _abs_nan_as_inf(x):
    return tl.where(x != x, float("inf"), tl.abs(x))


@triton.jit
def _rows_kernel(x_ptr, q_ptr, s_ptr, camax_ptr, M, N, n_iters, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # x, q [M, N] contiguous; s [M]; camax [programs, N]. Persistent over row blocks: the column amax stays in
    # registers until the end, then goes out as row pid of camax (partial maxima, reduced by the launcher).
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    cmask = c < N
    cmax = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in range(n_iters):  # row block pid + i * n_prog (past M: fully masked)
        rows = (pid + i * n_prog) * BLOCK_M + r
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        offs = rows.to(tl.int64)[:, None] * N + c[None, :]
        x = _widen(_load_raw(x_ptr, offs, mask, IS_BF16), IS_BF16)
        a = _abs_nan_as_inf(x)
        scale = _pow2_scale(tl.max(a, axis=1))
        cmax = tl.maximum(cmax, tl.max(a, axis=0))
        code = _encode(x * scale[:, None], (scale != scale)[:, None], HW_CAST)
        tl.store(q_ptr + offs, code, mask=mask)
        tl.store(s_ptr + rows, scale, mask=rmask)
    tl.store(camax_ptr + pid.to(tl.int64) * N + c, cmax, mask=cmask)


@triton.jit
def _encode_e5m2(y, nonfinite, HW_CAST: tl.constexpr):
    """fp32 y -> e5m2 byte of clamp(y, -57344, 57344), round to nearest even; nonfinite -> 0x7F."""
    if HW_CAST:
        y = tl.where(y > 57344.0, 57344.0, tl.where(y < -57344.0, -57344.0, y))  # NaN stays NaN
        code = y.to(tl.float8e5).to(tl.uint8, bitcast=True)
        code = tl.where(nonfinite, 0x7F, code)
    else:  # integer RNE on the fp32 bits (the interpreter's fp8 casts round wrongly, FACTS.md)
        yb = y.to(tl.int32, bitcast=True)
        sign = (yb >> 24) & 0x80
        ab = tl.minimum(yb & 0x7FFFFFFF, 0x47600000)  # |y| clamped to 57344
        r = ab + 0xFFFFF + ((ab >> 21) & 1)  # round the 23-bit mantissa to 2 bits, nearest even
        code_n = (r >> 21) - 448  # (exp << 2 | mant) re-biased 127 -> 15
        f = ab.to(tl.float32, bitcast=True) + 128.0  # ulp(128) = 2^-16: RNE onto the subnormal grid
        code_s = f.to(tl.int32, bitcast=True) - 0x43000000
        code = tl.where(ab < 0x38800000, code_s, code_n) | sign
        code = tl.where(nonfinite, 0x7F, code).to(tl.uint8)
    return code


@triton.jit
def _cols_t_kernel(x_ptr, c_ptr, q_ptr, s_ptr, r_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SCALAR: tl.constexpr, ROW_OUT: tl.constexpr, E5M2: tl.constexpr, N_FAST: tl.constexpr,
                   HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # x [M, N] contiguous -> q [N, M] row-major. SCALAR: c is ONE given scale (tensorwise; E5M2 picks the
    # format, ROW_OUT also stores the row-major copy r [M, N] from the same read); else c is the column amax
    # [N], the per-column power-of-two e4m3 scales are derived here and stored to s [N].
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, N_FAST)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = _widen(_load_raw(x_ptr, offs, mask, IS_BF16), IS_BF16)
    if SCALAR:
        scale = tl.load(c_ptr)
        if E5M2:
            code = _encode_e5m2(x * scale, scale != scale, HW_CAST)
        else:
            code = _encode(x * scale, scale != scale, HW_CAST)
        if ROW_OUT:
            tl.store(r_ptr + offs, code, mask=mask)
    else:
        scale = _pow2_scale(tl.load(c_ptr + cols, mask=cmask, other=0.0))
        code = _encode(x * scale[None, :], (scale != scale)[None, :], HW_CAST)
        if pid_m == 0:
            tl.store(s_ptr + cols, scale, mask=cmask)
    tl.store(q_ptr + cols.to(tl.int64)[:, None] * M + rows[None, :], tl.trans(code),
             mask=cmask[:, None] & rmask[None, :])


@triton.jit
def _cast_kernel(x_ptr, c_ptr, q_ptr, n, BLOCK: tl.constexpr, E5M2: tl.constexpr, HW_CAST: tl.constexpr,
                 IS_BF16: tl.constexpr):
    # x flat [n] -> q flat [n] with ONE given scale (tensorwise), _cols_t_kernel's SCALAR encoding without the
    # transpose: the weight casts of FSDP2's float8 all-gather, launched eagerly
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = _widen(_load_raw(x_ptr, offs, mask, IS_BF16), IS_BF16)
    scale = tl.load(c_ptr)
    if E5M2:
        code = _encode_e5m2(x * scale, scale != scale, HW_CAST)
    else:
        code = _encode(x * scale, scale != scale, HW_CAST)
    tl.store(q_ptr + offs, code, mask=mask)


_CAST = (8192, 8)  # BLOCK elements per program, num_warps (a plain streaming pass; 32 bf16 per thread)
_INTERP_CAST = (64, 4)


def to_float8_tensorwise_triton(x: torch.Tensor, scale: torch.Tensor, float8_dtype=torch.float8_e4m3fn,
                                hw_cast=None) -> torch.Tensor:
    """x (any shape, contiguous), scale fp32 (one element) -> to_float8(x, scale, dtype), one pass, launched
    through Triton's own launcher (no custom op, no compiled-graph call: ~10x less host time than a
    torch.compile'd cast called eagerly)."""
    if not (x.is_cuda or _INTERPRET):
        raise RuntimeError(f"to_float8_tensorwise: x is on {x.device}; the Triton kernel needs a CUDA tensor, or "
                           f"TRITON_INTERPRET=1 set before kernels.float8_cast.triton is imported")
    if not x.is_contiguous():
        raise ValueError(f"to_float8_tensorwise: x must be contiguous, got strides {x.stride()}")
    hw = default_hw_cast(x.device) if hw_cast is None else hw_cast
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    n = x.numel()
    if n:
        block, warps = _INTERP_CAST if _INTERPRET else _CAST
        xin, is_bf16 = _as_kernel_input(x)
        _cast_kernel[(triton.cdiv(n, block),)](xin, scale.reshape(1).to(torch.float32), q, n, BLOCK=block,
                                               E5M2=float8_dtype == torch.float8_e5m2, HW_CAST=hw,
                                               IS_BF16=is_bf16, num_warps=warps)
    return q.view(float8_dtype)


@triton.jit
def _cast_many_kernel(table_ptr, s_ptr, q_ptr, T: tl.constexpr, T_PAD: tl.constexpr, X_DTYPE: tl.constexpr,
                      BLOCK: tl.constexpr, E5M2: tl.constexpr, HW_CAST: tl.constexpr, IS_BF16: tl.constexpr):
    # T tensors, each cast with its own scale s[t], into one flat byte buffer q. table int64 [4, T_PAD]:
    # input address, numel, first program, output offset of each tensor (first program of the padding
    # entries: a huge value, so no program picks them). Program pid casts BLOCK elements of tensor t, the last
    # tensor whose first program is <= pid.
    t, x_ptr, i = table_member(table_ptr, T_PAD, X_DTYPE)
    n = tl.load(table_ptr + T_PAD + t)
    out = tl.load(table_ptr + 3 * T_PAD + t)
    offs = i * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = _widen(_load_raw(x_ptr, offs, mask, IS_BF16), IS_BF16)
    scale = tl.load(s_ptr + t)
    if E5M2:
        code = _encode_e5m2(x * scale, scale != scale, HW_CAST)
    else:
        code = _encode(x * scale, scale != scale, HW_CAST)
    tl.store(q_ptr + out + offs, code, mask=mask)


_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
             torch.int16: tl.int16}


def to_float8_tensorwise_many_triton(xs, scales: torch.Tensor, float8_dtype=torch.float8_e4m3fn,
                                     hw_cast=None) -> list:
    """xs: contiguous tensors of one dtype and device (any shapes), scales fp32 [len(xs)] -> [to_float8(x,
    scales[i], dtype)], ONE launch for all, the outputs views into one flat buffer. For FSDP2's float8 all-gather:
    a block's tensorwise weight shards cast together, one Python launch instead of one per weight."""
    x0 = xs[0]
    if not (x0.is_cuda or _INTERPRET):
        raise RuntimeError(f"to_float8_tensorwise_many: tensors on {x0.device}; the Triton kernel needs CUDA tensors, "
                           f"or TRITON_INTERPRET=1 set before kernels.float8_cast.triton is imported")
    hw = default_hw_cast(x0.device) if hw_cast is None else hw_cast
    block, warps = _INTERP_CAST if _INTERPRET else _CAST
    kin = [_as_kernel_input(x) for x in xs]
    is_bf16 = kin[0][1]
    ins = [k for k, _ in kin]
    t_pad = max(2, next_pow2(len(ins)))
    first, out, programs, total = [], [], 0, 0
    for x in ins:
        first.append(programs)
        out.append(total)
        programs += triton.cdiv(x.numel(), block)
        total += x.numel()
    pad = t_pad - len(ins)
    table = cached_table(ins, [[x.data_ptr() for x in ins] + [0] * pad, [x.numel() for x in ins] + [0] * pad,
                               first + [2 ** 62] * pad, out + [0] * pad])
    q = torch.empty(total, dtype=torch.uint8, device=x0.device)
    if programs:
        _cast_many_kernel[(programs,)](table, scales, q, T=len(xs), T_PAD=t_pad, X_DTYPE=_TL_DTYPE[kin[0][0].dtype],
                                       BLOCK=block, E5M2=float8_dtype == torch.float8_e5m2, HW_CAST=hw,
                                       IS_BF16=is_bf16, num_warps=warps)
    q = q.view(float8_dtype)
    outs, at = [], 0
    for x in xs:
        outs.append(q[at:at + x.numel()].view(x.shape))
        at += x.numel()
    return outs


# Launch configs, from a sweep on an H100 (bf16 x at the llama_moe linear shapes; see benchmarks/float8_cast.py
# for the measured bandwidth). Fixed rather than autotuned so that torch.compile can trace the launch into its
# generated code (torch.library.triton_op): no Python launcher, no dispatcher, per call.
#   rows: the column amax goes out as one row of partial maxima per program, reduced by a small second
#   kernel; one atomic max per column per program instead ran 2x slower in the sweep (the programs finish
#   together and the atomics on the same N addresses serialize), so that variant is gone.
_INTERP_COLS_T = (32, 32, 4, False)
_COLS_T = (64, 128, 4, True)  # BLOCK_M, BLOCK_N, num_warps, N_FAST (neighbouring programs walk along N)
_SM_COUNT = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    if device.index not in _SM_COUNT:
        _SM_COUNT[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT[device.index]


def _check(x: torch.Tensor, who: str):
    if not (x.is_cuda or _INTERPRET):
        raise RuntimeError(f"{who}: x is on {x.device}; the Triton kernels need a CUDA tensor, or "
                           f"TRITON_INTERPRET=1 set before kernels.float8_cast.triton is imported")
    if x.ndim != 2 or not x.is_contiguous():
        raise ValueError(f"{who}: x must be a contiguous 2-D tensor, got shape {tuple(x.shape)}, "
                         f"strides {x.stride()}")


def rows_config(N: int, config=None):
    """(BLOCK_M, BLOCK_N, num_warps, programs per SM (0: one row block each)) of _rows_kernel; config:
    (elements per iteration, num_warps, programs per SM)."""
    # short rows: more of them per program iteration, fewer programs (each writes a partial row of N)
    elems, warps, per_sm = config or ((4096, 4, 4) if N >= 2048 else (16384, 4, 2))
    block_n = triton.next_power_of_2(max(N, 16))
    if config is None and block_n >= 8192:
        warps = block_n // 1024  # one whole row per program iteration: 16 fp32 values per thread, no spills
    return max(1, elems // block_n), block_n, warps, per_sm


def to_float8_rowwise_triton(x: torch.Tensor, hw_cast=None, config=None):
    """x [M, N] (N <= _MAX_ROW) -> (data e4m3 [M, N], scale fp32 [M, 1], col_amax fp32 [N])."""
    _check(x, "to_float8_rowwise")
    M, N = x.shape
    if M == 0 or N == 0:
        raise ValueError(f"to_float8_rowwise (Triton): empty x {tuple(x.shape)}; the reference handles empty "
                         f"tensors")
    if N > _MAX_ROW:
        raise ValueError(f"to_float8_rowwise (Triton): rows of {N} elements; at most {_MAX_ROW} fit one program")
    hw = default_hw_cast(x.device) if hw_cast is None else hw_cast
    q = torch.empty((M, N), dtype=torch.uint8, device=x.device)
    s = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    block_m, block_n, warps, per_sm = rows_config(N, config)
    n_blocks = triton.cdiv(M, block_m)
    # a few resident programs per SM, each keeping its column amax in registers: the partial maxima number
    # programs x N, not M / BLOCK_M x N
    grid = (min(n_blocks, per_sm * _sm_count(x.device)) if per_sm else n_blocks,)
    n_iters = triton.cdiv(n_blocks, grid[0])
    camax = torch.empty((grid[0], N), dtype=torch.float32, device=x.device)
    xin, is_bf16 = _as_kernel_input(x)
    wrap_triton(_rows_kernel)[grid](xin, q, s, camax, M, N, n_iters, BLOCK_M=block_m, BLOCK_N=block_n,
                                    HW_CAST=hw, IS_BF16=is_bf16, num_warps=warps)
    return q.view(torch.float8_e4m3fn), s, camax.amax(0)


def _launch_cols_t(xin, c, q, s, r, M, N, cfg, scalar, row_out, e5m2, hw, is_bf16):
    bm, bn, warps, n_fast = cfg
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    wrap_triton(_cols_t_kernel)[grid](xin, c, q, s, r, M, N, BLOCK_M=bm, BLOCK_N=bn, SCALAR=scalar, ROW_OUT=row_out,
                                      E5M2=e5m2, N_FAST=n_fast, HW_CAST=hw, IS_BF16=is_bf16, num_warps=warps)


def _cols_t(x, c, scalar, hw_cast, config, who, row_out=False, float8_dtype=torch.float8_e4m3fn):
    _check(x, who)
    M, N = x.shape
    if M == 0 or N == 0:
        raise ValueError(f"{who} (Triton): empty x {tuple(x.shape)}; the reference handles empty tensors")
    if float8_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"{who}: float8_dtype must be float8_e4m3fn or float8_e5m2, got {float8_dtype}")
    hw = default_hw_cast(x.device) if hw_cast is None else hw_cast
    q = torch.empty((N, M), dtype=torch.uint8, device=x.device)
    s = torch.empty((1, N), dtype=torch.float32, device=x.device)
    r = torch.empty((M, N) if row_out else (0,), dtype=torch.uint8, device=x.device)
    xin, is_bf16 = _as_kernel_input(x)
    c = c.contiguous()
    if config is None:
        config = _INTERP_COLS_T if _INTERPRET else _COLS_T
    _launch_cols_t(xin, c, q, s, r, M, N, config, scalar, row_out, float8_dtype == torch.float8_e5m2, hw, is_bf16)
    return q.view(float8_dtype), s, r.view(float8_dtype)


def to_float8_colwise_transposed_triton(x: torch.Tensor, col_amax: torch.Tensor, hw_cast=None, config=None):
    """x [M, N], col_amax fp32 [N] -> (data_t e4m3 [N, M] row-major, scale fp32 [1, N])."""
    return _cols_t(x, col_amax, False, hw_cast, config, "to_float8_colwise_transposed")[:2]


def to_float8_transposed_triton(x: torch.Tensor, scale: torch.Tensor, float8_dtype=torch.float8_e4m3fn,
                                hw_cast=None, config=None):
    """x [M, N], scale fp32 (one element) -> data_t [N, M] row-major = to_float8(x, scale, dtype).t()."""
    return _cols_t(x, scale.reshape(1).to(torch.float32), True, hw_cast, config, "to_float8_transposed",
                   float8_dtype=float8_dtype)[0]


def to_float8_with_transpose_triton(x: torch.Tensor, scale: torch.Tensor, float8_dtype=torch.float8_e4m3fn,
                                    hw_cast=None, config=None):
    """x [M, N], scale fp32 (one element) -> (data [M, N], data_t [N, M] row-major), from one read of x."""
    q, _, r = _cols_t(x, scale.reshape(1).to(torch.float32), True, hw_cast, config, "to_float8_with_transpose",
                      row_out=True, float8_dtype=float8_dtype)
    return r, q
