"""Triton MXFP8 grouped GEMMs for Hopper (sm_90): fprop/dgrad (one kernel) and wgrad.

Hopper has no block-scaled MMA, so each kernel runs plain fp8 tensor-core dots over one scale block of the
reduction axis at a time (P_j = A_j @ B_j^T, exact fp8 products, fp32 sums) and "promotes" each partial
product into the fp32 accumulator with its power-of-two factor: acc += P_j * (s_a * s_b). The result is the
format's value for the quantized operands (sum over blocks of 2^(ea+eb) * P_j), summed in fp32.

Two knobs trade speed for how the caller quantized the operands; both keep the arithmetic exact for the
operands actually passed, they only state what the scales must look like:
  SK        promotion interval along the reduction axis, in elements (32, 64 or 128). SK > 32 requires that
            the 1x32 scales of each operand are equal across every aligned SK-run of the reduction axis
            (e.g. activations quantized with 1x128 blocks: still a valid MXFP8 tensor). The kernel reads the
            scale of the first 32-block of each run.
  B_TILE    True: the B operand's scale is equal across the whole BN (fprop) / BK (wgrad) rows of a tile
            (weights quantized with square tiles of >= BN rows): the factor is then a per-row vector and the
            promotion costs one FMA per accumulator element. False: factor = outer product s_a[m] * s_b[n].
The Python launchers (kernels/grouped_gemm/__init__.py) pick SK/B_TILE from what the caller declares and
check the declaration on the device (torch._assert_async), so a mismatch fails loudly, never silently.
Launch knobs measured in NOTES.md: USE_TMA (operand tiles through TMA descriptors instead of pointer loads;
a few % at most shapes, used by the default configs) and PIPE (issue the next dot before promoting the
previous one; slower on triton 3.6, which waits for each wgmma right after issuing it; kept for the record).

Groups: offs[e] is the cumulative END row of group e (as torch._grouped_mm); groups may be empty; rows at or
after offs[-1] are padding and the fprop/dgrad kernel writes zeros there. No host synchronisation: every
program finds its (group, m-tile) by walking offs (E scalar loads).
"""

import os

import triton
import triton.language as tl


def _fix_interpreter_scalar_index():
    """TRITON_INTERPRET only: triton 3.6's interpreter holds scalar kernel arguments as 1-element arrays and
    converts them for range() with int(array), which numpy >= 2.4 refuses ("only 0-dimensional arrays can be
    converted"), so any loop with a run-time bound fails on CPU. Re-register __index__ to take the element."""
    from triton.runtime import interpreter as interp

    orig = interp._patch_lang_tensor
    if getattr(orig, "_titan_fp8_fixed", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._titan_fp8_fixed = True
    interp._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _fix_interpreter_scalar_index()


@triton.jit
def _e8m0_to_f32(b):
    """E8M0 bytes -> fp32 2^(b-127); 0 -> 2^-127 (subnormal bits 0x00400000), 255 -> NaN."""
    bi = b.to(tl.int32)
    bits = tl.where(bi == 0, 0x00400000, bi << 23)
    bits = tl.where(bi == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _to_out(acc, out_ty: tl.constexpr, SOFT_RNE: tl.constexpr):
    """Cast the fp32 accumulator to the output dtype. SOFT_RNE (set only under TRITON_INTERPRET, whose
    fp32 -> bf16 cast truncates) first rounds to nearest even on the bits, so the cast below is exact."""
    if SOFT_RNE:
        if out_ty == tl.bfloat16:
            bits = acc.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            nan = acc != acc
            acc = tl.where(nan, acc, bits.to(tl.float32, bitcast=True))
    return acc.to(out_ty)


@triton.jit
def _mx_grouped_mm_kernel(
    a_ptr, sa_ptr, b_ptr, sb_ptr, c_ptr, offs_ptr,
    M, N, K, NUM_M_TILES,
    stride_am, stride_sam, stride_sak,
    stride_be, stride_bn, stride_sbe, stride_sbn, stride_sbk,
    stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SK: tl.constexpr, SUB: tl.constexpr, B_TILE: tl.constexpr,
    EVEN_K: tl.constexpr, GROUP_M: tl.constexpr, E: tl.constexpr, SOFT_RNE: tl.constexpr,
    PIPE: tl.constexpr = False, USE_TMA: tl.constexpr = False, a_desc=None, b_desc=None,
):
    """out[rows of group e] = A[rows] @ B[e]^T.  A [M, K] fp8 (K contiguous), B [E, N, K] fp8 (K contiguous),
    scales: sa[m, k/32] and sb[e, n, k/32] addressed through strides (any layout)."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gsz = tl.minimum(NUM_M_TILES - first_m, GROUP_M)
    mt = first_m + (pid % width) % gsz
    nt = (pid % width) // gsz

    # Which group does global m-tile `mt` belong to? Tiles are numbered group after group.
    expert = -1
    row0 = 0
    row_end = 0
    tile_base = 0
    start = 0
    for e in tl.static_range(E):
        # clamped to [start, M]: invalid offs (decreasing, past M) give wrong groups, never stray writes
        end = tl.minimum(tl.maximum(tl.load(offs_ptr + e), start), M)
        n_t = tl.cdiv(end - start, BM)
        hit = (mt >= tile_base) & (mt < tile_base + n_t)
        expert = tl.where(hit, e, expert)
        row0 = tl.where(hit, start + (mt - tile_base) * BM, row0)
        row_end = tl.where(hit, end, row_end)
        tile_base += n_t
        start = end

    offs_n = nt * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    if expert < 0:
        # Past the last group: tiles of padding rows [offs[-1], M) get zeros; anything further does nothing.
        pad0 = start + (mt - tile_base) * BM
        offs_m = pad0 + tl.arange(0, BM)
        zmask = (offs_m[:, None] < M) & (offs_m[:, None] >= start) & n_ok[None, :]
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
                 tl.zeros((BM, BN), dtype=c_ptr.dtype.element_ty), mask=zmask)
    else:
        offs_m = row0 + tl.arange(0, BM)
        # Loads use clamped indices (no masks): rows past the group belong to the next group or are
        # clamped to row M-1; they are computed and never stored.
        lm = tl.minimum(offs_m, M - 1)
        ln = tl.minimum(offs_n, N - 1)
        offs_k = tl.arange(0, SK)
        a_ptrs = a_ptr + lm[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + expert * stride_be + ln[None, :] * stride_bn + offs_k[:, None]  # [SK, BN]
        sa_ptrs = sa_ptr + lm * stride_sam
        sb_base = sb_ptr + expert * stride_sbe
        sb_ptrs = sb_base + ln * stride_sbn
        sbt_ptr = sb_base + (nt * BN) * stride_sbn  # B_TILE: the tile's first row carries the tile scale
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if PIPE:
            # Software-pipelined promotion (B_TILE, EVEN_K only): the dot of step j+1 is issued before the
            # promotion of step j, so an asynchronous wgmma can overlap the FMAs.
            if USE_TMA:
                a = a_desc.load([row0, 0])
                b = tl.trans(b_desc.load([expert * N + nt * BN, 0]))
            else:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            p_prev = tl.dot(a, b)
            f_prev = _e8m0_to_f32(tl.load(sa_ptrs)) * _e8m0_to_f32(tl.load(sbt_ptr))
            for kk in range(SK, K, SK):
                kb = kk // 32
                if USE_TMA:
                    a = a_desc.load([row0, kk])
                    b = tl.trans(b_desc.load([expert * N + nt * BN, kk]))
                else:
                    a = tl.load(a_ptrs + kk)
                    b = tl.load(b_ptrs + kk)
                p = tl.dot(a, b)
                acc += p_prev * f_prev[:, None]
                f_prev = _e8m0_to_f32(tl.load(sa_ptrs + kb * stride_sak)) * \
                    _e8m0_to_f32(tl.load(sbt_ptr + kb * stride_sbk))
                p_prev = p
            acc += p_prev * f_prev[:, None]
        for k0 in range(0, K if not PIPE else 0, SK * SUB):
            for s in tl.static_range(SUB):
                kk = k0 + s * SK
                kb = kk // 32
                if USE_TMA:
                    a = a_desc.load([row0, kk])
                    b = tl.trans(b_desc.load([expert * N + nt * BN, kk]))
                    ea = tl.load(sa_ptrs + kb * stride_sak)
                elif EVEN_K:
                    a = tl.load(a_ptrs + kk)
                    b = tl.load(b_ptrs + kk)
                    ea = tl.load(sa_ptrs + kb * stride_sak)
                else:
                    k_ok = (kk + offs_k) < K
                    a = tl.load(a_ptrs + kk, mask=k_ok[None, :], other=0.0)
                    b = tl.load(b_ptrs + kk, mask=k_ok[:, None], other=0.0)
                    # a run entirely past K has zero data: any finite factor will do
                    ea = tl.load(sa_ptrs + kb * stride_sak, mask=(kk < K), other=127)
                p = tl.dot(a, b)
                fa = _e8m0_to_f32(ea)
                if B_TILE:
                    if EVEN_K:
                        eb = tl.load(sbt_ptr + kb * stride_sbk)
                    else:
                        eb = tl.load(sbt_ptr + kb * stride_sbk, mask=(kk < K), other=127)
                    acc += p * (fa * _e8m0_to_f32(eb))[:, None]
                else:
                    if EVEN_K:
                        eb = tl.load(sb_ptrs + kb * stride_sbk)
                    else:
                        eb = tl.load(sb_ptrs + kb * stride_sbk, mask=(kk < K), other=127)
                    acc += p * (fa[:, None] * _e8m0_to_f32(eb)[None, :])
        smask = (offs_m[:, None] < row_end) & n_ok[None, :]
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], _to_out(acc, c_ptr.dtype.element_ty, SOFT_RNE),
                 mask=smask)


@triton.jit
def _wgrad_step(acc, t0, start, end, x_ptrs, y_ptrs, sx_ptrs, sy_ptrs, syt_ptr, stride_sxt, stride_syt, offs_t,
                MASKED: tl.constexpr, Y_TILE: tl.constexpr, USE_TMA: tl.constexpr = False, x_desc=None,
                y_desc=None, n0=0, k0=0):
    """One promotion step of wgrad over tokens [t0, t0 + ST) (masked to [start, end) when MASKED)."""
    if MASKED:
        tt = t0 + offs_t
        t_ok = (tt >= start) & (tt < end)
        xa = tl.load(x_ptrs + t0, mask=t_ok[None, :], other=0.0)
        yb = tl.load(y_ptrs + t0, mask=t_ok[:, None], other=0.0)
    elif USE_TMA:
        xa = x_desc.load([n0, t0])
        yb = tl.trans(y_desc.load([k0, t0]))
    else:
        xa = tl.load(x_ptrs + t0)
        yb = tl.load(y_ptrs + t0)
    tb = t0 // 32
    p = tl.dot(xa, yb)
    fx = _e8m0_to_f32(tl.load(sx_ptrs + tb * stride_sxt))
    if Y_TILE:
        acc += p * (fx * _e8m0_to_f32(tl.load(syt_ptr + tb * stride_syt)))[:, None]
    else:
        acc += p * (fx[:, None] * _e8m0_to_f32(tl.load(sy_ptrs + tb * stride_syt))[None, :])
    return acc


@triton.jit
def _mx_grouped_wgrad_kernel(
    x_ptr, sx_ptr, y_ptr, sy_ptr, c_ptr, offs_ptr,
    M, N, K,
    stride_xn, stride_sxn, stride_sxt,
    stride_yk, stride_syk, stride_syt,
    stride_ce, stride_cn,
    BN: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, Y_TILE: tl.constexpr, GROUP_N: tl.constexpr,
    SOFT_RNE: tl.constexpr, USE_TMA: tl.constexpr = False, x_desc=None, y_desc=None,
):
    """dW[e] = X_e @ Y_e^T over the tokens of group e: X = dO^T [N, M] fp8, Y = A^T [K, M] fp8, both with
    the token axis contiguous and scaled along it (scales sx[n, t/32], sy[k, t/32] through strides).

    Scale blocks lie on the GLOBAL token grid (blocks of 32 from token 0: the plain MXFP8 quantization of
    the whole [M, *] tensor along the token axis). A block that straddles a group boundary has one scale
    for both groups; each group sums only its own tokens (masked loads)."""
    pid = tl.program_id(0)
    e = tl.program_id(1)
    num_n = tl.cdiv(N, BN)
    num_k = tl.cdiv(K, BK)
    width = GROUP_N * num_k
    first_n = (pid // width) * GROUP_N
    gsz = tl.minimum(num_n - first_n, GROUP_N)
    nt = first_n + (pid % width) % gsz
    kt = (pid % width) // gsz

    end = tl.minimum(tl.load(offs_ptr + e), M)  # clamped: invalid offs never read past the tensors
    start = tl.minimum(tl.maximum(tl.load(offs_ptr + e - 1, mask=e > 0, other=0), 0), end)
    offs_n = nt * BN + tl.arange(0, BN)
    offs_k = kt * BK + tl.arange(0, BK)
    ln = tl.minimum(offs_n, N - 1)
    lk = tl.minimum(offs_k, K - 1)
    offs_t = tl.arange(0, ST)
    x_ptrs = x_ptr + ln[:, None] * stride_xn + offs_t[None, :]   # [BN, ST]
    y_ptrs = y_ptr + lk[None, :] * stride_yk + offs_t[:, None]   # [ST, BK]
    sx_ptrs = sx_ptr + ln * stride_sxn
    sy_ptrs = sy_ptr + lk * stride_syk
    syt_ptr = sy_ptr + (kt * BK) * stride_syk
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    # Token steps of ST on the global grid. Only the (at most two) steps that a group boundary cuts are
    # loaded with a token mask: a mask along the contiguous axis forces byte-wide loads, so the steps in
    # between run unmasked (16-byte loads, pipelined).
    first_full = tl.cdiv(start, ST) * ST
    last_full = (end // ST) * ST
    if (start % ST != 0) & (start < end):
        acc = _wgrad_step(acc, (start // ST) * ST, start, end, x_ptrs, y_ptrs, sx_ptrs, sy_ptrs, syt_ptr,
                          stride_sxt, stride_syt, offs_t, True, Y_TILE)
    for t0 in range(first_full, last_full, ST):
        acc = _wgrad_step(acc, t0, start, end, x_ptrs, y_ptrs, sx_ptrs, sy_ptrs, syt_ptr,
                          stride_sxt, stride_syt, offs_t, False, Y_TILE, USE_TMA, x_desc, y_desc,
                          nt * BN, kt * BK)
    if (end % ST != 0) & (last_full >= first_full) & (start < end):
        acc = _wgrad_step(acc, last_full, start, end, x_ptrs, y_ptrs, sx_ptrs, sy_ptrs, syt_ptr,
                          stride_sxt, stride_syt, offs_t, True, Y_TILE)
    cmask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    tl.store(c_ptr + e * stride_ce + offs_n[:, None] * stride_cn + offs_k[None, :],
             _to_out(acc, c_ptr.dtype.element_ty, SOFT_RNE), mask=cmask)
