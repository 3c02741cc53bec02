"""Gluon (triton.experimental.gluon, triton 3.6) MXFP8 grouped GEMMs for Hopper with true 1x32 scales ("mx32").

Same contracts as the Triton kernels in triton_mx.py with block=32 and a 128x128-tiled weight (fprop/dgrad,
w_tile=128) or a 128-row-tiled x^T (wgrad, a_tile=128): the promotion factor of reduction block j is a per-row
vector f_j[m] = s_a[m, j] * s_b[tile, j], and the result is sum_j P_j * f_j in fp32 (P_j = the exact fp8
product of block j).

Why Gluon: Triton 3.6 waits for each wgmma right after issuing it, so the tensor cores idle while the CUDA
cores promote (acc += P_j * f_j: one FMA per accumulator element every 32 of K, as much issue time as the
MMA itself). Here the mainloop is written out by hand:

    step j:  wait for the TMA tiles of step j; issue wgmma j asynchronously into a fresh partial;
             wait until only wgmma j is in flight (so partial j-1 is done); refill the freed ring slot;
             promote partial j-1 into acc while wgmma j runs on the tensor cores.

Three fp32 register tiles are live (acc, the partial in flight, the partial being promoted): in MODE 2 the
partial of step j-2 (already promoted) is handed to wgmma j as its ignored accumulator, so no zeroing. The
loop is unrolled in blocks of U steps so that no wgmma is in flight across the back edge (see _mainloop).

Operands arrive through TMA in a STAGES-deep ring; one stage holds SUBK steps ([BM, 32*SUBK] boxes, the
wgmmas read 32-wide slices), so the barrier waits and TMA issues come once per SUBK wgmmas and 16 steps can be
in flight. WS picks who refills the ring: 0 the kernel's own warps (Gluon then inserts CTA barriers around
every TMA issue, which tie the warpgroups together), 1 a 1-warp producer partition, 2 (fprop/dgrad) a producer
plus two independent 4-warp consumers that each own 64 rows of the 128x128 tile and their own epilogue, so one
consumer's FMAs overlap the other's wgmmas as well (fprop/dgrad and wgrad). Scales are read with plain loads:
MODE 0-2 one byte per row and step, one step ahead; MODE 3-6 one int32 per row and TMA
stage (the stage's 4 E8M0 bytes), one stage ahead (wgrad: two aligned words funnel-shifted, a group starts at
any 32-token step); scales that cannot be read as aligned words run MODE 2 instead. The defaults run on persistent
grids (one CTA per SM; the TMA warp loads the next tile while the consumer stores this one): fprop/dgrad deal the
tiles out (pid, pid + grid, ...), wgrad's CTAs take them from a queue (_wgrad_persistent: its tiles' lengths follow
the group sizes). Measured variants and numbers: NOTES.md ("Gluon mx32"). MODE 5/6 = MODE 4/3 with the E8M0 decode
split into one SWAR pass per stage word and one byte permute (PRMT) per step (_e8m0_prep/_e8m0_pick); MODE 5 was
the fprop/dgrad default of sessions 14-24 (WS=2). MODE 10 = MODE 5 with A's factors decoded once by the launcher
(e8m0_table; wgrad:
e8m0_group_table, every group's first full step on a 16-byte column) and loaded by TMA with each stage into shared
memory, read as one 16-byte row per accumulator row (_stage_rows): no A words and no A decode in the mainloop
(wgrad: 81-83 instead of 92 instructions per step); it was the wgrad default of sessions 24-25 (WS=1, 8 warps,
U = 16: one consumer partition whose two warpgroups run one copy of the mainloop, which makes 16-step blocks fit
the i-cache). The defaults now are MODE 12 (static ring, both factors as fp32: _mainloop).

The fprop/dgrad default also moves the epilogue out of the consumer: a 2-warp storer partition writes each
finished tile from shared memory while the consumer multiplies the next (_nt_persistent, EPI).

Groups (offs, cumulative END rows, any sizes incl. 0, no host sync) are found by walking offs as in
triton_mx.py. fprop/dgrad: rows at or after offs[-1] are written as zeros. wgrad: the tokens of group e are
[offs[e-1], offs[e]); the full 32-token steps run through the TMA ring, the (at most two) steps that a group
boundary cuts are loaded together with token masks before the mainloop, into separate shared buffers, and
multiplied synchronously (_boundary_steps).
"""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

SK = gl.constexpr(32)  # the scale block along the reduction axis: one wgmma (m64nBNk32) per warpgroup per step


@gluon.jit
def _e8m0_to_f32(b):
    """E8M0 bytes -> fp32 2^(b-127); 0 -> 2^-127 (subnormal bits 0x00400000), 255 -> NaN."""
    # branch-free (it runs for every row every 32 of K): bit 8 of (b-1)|(b+1) is set exactly for b = 0 and
    # b = 255, and that bit moved to 22 is the subnormal 2^-127 (b = 0) or the quiet-NaN bit (b = 255)
    bi = b.to(gl.int32)
    bits = (bi << 23) | ((((bi - 1) | (bi + 1)) & 0x100) << 14)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _issue_load(a_desc, b_desc, a_row, b_row, k, bar, a_buf, b_buf, pred, f_desc=None, f_bufs=None, f_off=0,
                slot=0):
    """One stage: A's and B's [rows, 32 * SUBK] boxes at k; MODE 10/11 also A's fp32 factors [rows, SUBK] of those
    steps into f_bufs[slot] (f_desc over e8m0_table's factors: column k / 32 + f_off, a multiple of 4)."""
    if f_desc is None:
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    else:
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes + f_desc.block_type.nbytes,
                        pred=pred)
        tma.async_copy_global_to_shared(f_desc, [a_row, k // SK + f_off], bar, f_bufs.index(slot), pred=pred)
    tma.async_copy_global_to_shared(a_desc, [a_row, k], bar, a_buf, pred=pred)
    tma.async_copy_global_to_shared(b_desc, [b_row, k], bar, b_buf, pred=pred)


@gluon.jit
def _scale(sa_ptrs, stride_sak, sbt_ptr, stride_sbk, kb):
    return _e8m0_to_f32(gl.load(sa_ptrs + kb * stride_sak)) * _e8m0_to_f32(gl.load(sbt_ptr + kb * stride_sbk))


@gluon.jit
def _word(ptrs, i, ok):
    """Aligned int32 number i of each row's scale bytes (4 E8M0 bytes, little-endian: byte b = step 4*i + b).
    The launcher guarantees 4-byte aligned rows (base and row stride) with the steps contiguous."""
    return gl.load((ptrs + 4 * i).to(gl.pointer_type(gl.int32), bitcast=True), mask=ok, other=0)


@gluon.jit
def _funnel(lo, hi, sh):
    """The 4 bytes starting at byte sh/8 of the 8 bytes hi:lo (sh in {0, 8, 16, 24}, uniform)."""
    return (lo.to(gl.uint32, bitcast=True) >> sh).to(gl.int32, bitcast=True) | ((hi << 1) << (31 - sh))


@gluon.jit
def _byte_f32(w, i: gl.constexpr):
    return _e8m0_to_f32((w >> (8 * i)) & 0xFF)


# MODE 5: the E8M0 decode split into a per-stage SWAR pass over the word of 4 bytes and one PRMT per step.
# fp32 bits of byte b: 2^(b-127) = b << 23, except b = 0 (2^-127: 0x00400000) and b = 255 (NaN: 0x7FC00000),
# i.e. always (b << 23) | (special << 22). Byte 3 of those bits is b >> 1, byte 2 is (b & 1) << 7 | special << 6,
# bytes 1 and 0 are zero. The stage pass builds hi (byte i = b_i >> 1, top bits clear) and lo (byte i =
# (b_i & 1) << 7 | special_i << 6); step i is then one byte permute: [hi_i, lo_i, 0, 0] (the zero bytes are
# hi's byte 0 with its clear top bit replicated). special_i: b_i is 0 or 255 <=> all 8 bits equal <=> byte i of
# (w ^ (w >> 1)) & 0x7F7F7F7F is zero; adding 0x7F to that byte (no carry out: it is <= 0x7F) sets its top bit
# exactly when it is nonzero.
@gluon.jit
def _e8m0_prep(w):
    """A word of 4 E8M0 bytes -> (hi, lo) for _e8m0_pick (8 integer ops per word = 2 per step)."""
    u = w.to(gl.uint32, bitcast=True)
    s1 = u >> 1
    hi = s1 & 0x7F7F7F7F
    y = (u ^ s1) & 0x7F7F7F7F
    sp = ~(y + 0x7F7F7F7F) & 0x80808080  # top bit of byte i set <=> b_i in {0, 255}
    lo = ((u & 0x01010101) << 7) | (sp >> 1)
    return hi.to(gl.int32, bitcast=True), lo.to(gl.int32, bitcast=True)


@gluon.jit
def _e8m0_pick(hi, lo, i: gl.constexpr):
    """fp32 2^(b_i - 127) of byte i of the word _e8m0_prep saw (exact, as _e8m0_to_f32): one PRMT."""
    SEL: gl.constexpr = (i << 12) | ((4 + i) << 8) | 0x88
    bits = gl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [hi, lo], dtype=gl.int32,
                                     is_pure=True, pack=1)
    return bits.to(gl.float32, bitcast=True)


def e8m0_prep_reference(w):
    """Python mirror of _e8m0_prep + _e8m0_pick for the CPU test: int word -> the 4 fp32 bit patterns."""
    u = w & 0xFFFFFFFF
    s1 = u >> 1
    hi = s1 & 0x7F7F7F7F
    y = (u ^ s1) & 0x7F7F7F7F
    sp = ~(y + 0x7F7F7F7F) & 0x80808080
    lo = (((u & 0x01010101) << 7) | (sp >> 1)) & 0xFFFFFFFF
    out = []
    for i in range(4):  # prmt.b32 d, hi, lo, sel: d bytes [3] = hi byte i, [2] = lo byte i, [1], [0] = 0
        out.append((((hi >> (8 * i)) & 0xFF) << 24) | (((lo >> (8 * i)) & 0xFF) << 16))
    return out


@gluon.constexpr_function
def _factor_layout(rows, num_warps):
    """[rows, 4] fp32 factors (MODE 10): thread t of warp w holds the 4 factors of rows 16w + t/4 and that + 8,
    i.e. the rows of its wgmma accumulator registers (SliceLayout(1, the m64 wgmma layout)), with the 4 steps
    in registers and lanes 4l .. 4l + 3 sharing them."""
    warp_bases = [[16 << i, 0] for i in range(num_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [8, 0]],
                                      lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=warp_bases,
                                      block_bases=[], shape=[rows, 4])


@gluon.jit
def _pick4(c0, c1, c2, c3, i: gl.constexpr):
    c = c0
    if i == 1:
        c = c1
    elif i == 2:
        c = c2
    elif i == 3:
        c = c3
    return c


@gluon.jit
def _stage_rows(f_bufs, slot, AROW: gl.constexpr, AROWS: gl.constexpr, NCOL: gl.constexpr):
    """MODE 10: the 4 factors of this warpgroup's rows for the stage in ring slot `slot`, as 4 row vectors in the
    accumulator's row layout (one 16-byte shared load per row; the splits and the layout change move nothing)."""
    buf = f_bufs.index(slot)
    if AROWS > 0:
        buf = buf.slice(AROW, AROWS, dim=0)
    R: gl.constexpr = buf.shape[0]
    x = buf.load(_factor_layout(R, gl.num_warps()))
    lo, hi = gl.split(x.reshape([R, 2, 2]))  # columns (0, 2) and (1, 3)
    c0, c2 = gl.split(lo)
    c1, c3 = gl.split(hi)
    row: gl.constexpr = gl.SliceLayout(1, _mma_layout(R, NCOL, gl.num_warps()))
    return (gl.convert_layout(c0, row, assert_trivial=True), gl.convert_layout(c1, row, assert_trivial=True),
            gl.convert_layout(c2, row, assert_trivial=True), gl.convert_layout(c3, row, assert_trivial=True))


@gluon.jit
def _f32x4(base, off):
    """MODE 12: the 4 fp32 B factors of one stage at base + off (off a multiple of 4: one 16-byte load), the same
    for every thread (a broadcast load: each thread holds all 4), as a [1, 4] tensor. Unmasked: the launcher pads
    the table by a stage, so the load one stage past a tile's last stays inside it."""
    lay: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32, 1],
                                         warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
    cols = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, lay)), 0)
    offs = gl.max_contiguous(gl.multiple_of(off + cols, [1, 4]), [1, 4])
    return gl.load(base + offs)


@gluon.jit
def _split4(v):
    """[1, 4] (_f32x4) -> its 4 values as scalars (each thread holds all of them: no data moves)."""
    lo, hi = gl.split(v.reshape([1, 2, 2]))  # (v0, v2) and (v1, v3)
    c0, c2 = gl.split(lo)
    c1, c3 = gl.split(hi)
    return gl.max(c0, axis=0), gl.max(c1, axis=0), gl.max(c2, axis=0), gl.max(c3, axis=0)


@gluon.jit
def _mma_step(j, sub: gl.constexpr, acc, a_bufs, b_bufs, ready, STAGES: gl.constexpr, SUBK: gl.constexpr,
              FRESH: gl.constexpr, p_free, AROW: gl.constexpr = 0, AROWS: gl.constexpr = 0, st0=0):
    """Issue the wgmma of step j (32 of K; sub = j % SUBK, static) asynchronously into a partial
    (use_acc=False): into fresh zeros (FRESH) or into the registers of p_free, a partial already promoted.
    A stage holds SUBK steps; its TMA barrier is waited on at its first step."""
    st = st0 + j // SUBK  # st0: stages this ring ran before (persistent grid)
    s = st % STAGES
    if sub == 0:
        mbarrier.wait(ready.index(s), (st // STAGES) & 1)
    if FRESH:
        p_free = gl.zeros_like(acc)
    a = a_bufs.index(s)
    if AROWS > 0:  # WS=2: this warpgroup's rows of the A tile
        a = a.slice(AROW, AROWS, dim=0)
    a = a.slice(sub * SK, SK, dim=1)
    b = b_bufs.index(s).slice(sub * SK, SK, dim=1).permute((1, 0))
    return warpgroup_mma(a, b, p_free, use_acc=False, is_async=True)


@gluon.jit
def _mma_slot(a_bufs, b_bufs, s: gl.constexpr, sub: gl.constexpr, acc, p_free, FRESH: gl.constexpr,
              AROW: gl.constexpr, AROWS: gl.constexpr):
    """MODE 3: the async wgmma of step sub of ring slot s (both static) into fresh zeros or p_free's registers."""
    if FRESH:
        p_free = gl.zeros_like(acc)
    a = a_bufs.index(s)
    if AROWS > 0:
        a = a.slice(AROW, AROWS, dim=0)
    a = a.slice(sub * SK, SK, dim=1)
    b = b_bufs.index(s).slice(sub * SK, SK, dim=1).permute((1, 0))
    return warpgroup_mma(a, b, p_free, use_acc=False, is_async=True)


@gluon.jit
def _refill(st, n_st, a_desc, b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready, STAGES: gl.constexpr,
            SUBK: gl.constexpr):
    """All wgmmas of stage st are known to be finished: its ring slot takes stage st + STAGES."""
    nxt = st + STAGES
    s = st % STAGES
    _issue_load(a_desc, b_desc, a_row, b_row, k0 + nxt * (SUBK * SK), ready.index(s), a_bufs.index(s),
                b_bufs.index(s), nxt < n_st)


@gluon.jit
def _release(st, n_st, a_desc, b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready, empty, STAGES: gl.constexpr,
             SUBK: gl.constexpr, WS: gl.constexpr):
    """The wgmmas of stage st have finished: hand its slot to the producer warp (WS) or refill it here."""
    if WS:
        mbarrier.arrive(empty.index(st % STAGES))
    else:
        _refill(st, n_st, a_desc, b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready, STAGES, SUBK)


@gluon.jit
def _producer(a_desc, b_desc, a_row, b_row, k0, n_st, a_bufs, b_bufs, ready, empty, STAGES: gl.constexpr,
              SUBK: gl.constexpr, f_desc=None, f_bufs=None, f_off=0):
    """WS: the TMA warp. Fills stage st into slot st % STAGES once the consumers released its last use
    (mbarriers start as if phase 1 had completed, so the first round does not wait)."""
    for st in range(n_st):
        s = st % STAGES
        mbarrier.wait(empty.index(s), ((st // STAGES) & 1) ^ 1)
        _issue_load(a_desc, b_desc, a_row, b_row, k0 + st * (SUBK * SK), ready.index(s), a_bufs.index(s),
                    b_bufs.index(s), True, f_desc, f_bufs, f_off, s)


@gluon.jit
def _consumer(acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk, a_bufs, b_bufs,
              ready, empty, STAGES: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr, SUBK: gl.constexpr,
              FUNNEL: gl.constexpr, f_bufs=None, fbt_ptr=None, fb_off=0):
    # the default partition's results travel as a tuple
    return (_mainloop(acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk, a_bufs,
                      b_bufs, ready, empty, STAGES, MODE, U, SUBK, True, 0, 0, FUNNEL, 0, f_bufs, fbt_ptr, fb_off), )


@gluon.jit
def _boundary_consumer(bnd, xm_bufs, ym_bufs, BM: gl.constexpr, BN: gl.constexpr, acc, a_desc, b_desc, a_row, b_row,
                       k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk, a_bufs, b_bufs, ready, empty,
                       STAGES: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr, SUBK: gl.constexpr,
                       FUNNEL: gl.constexpr, f_bufs, fbt_ptr, fb_off):
    """MODE 12 wgrad's consumer partition: the boundary blocks (_boundary_steps), then the mainloop."""
    acc = _boundary_steps(acc, bnd, xm_bufs, ym_bufs, BM, BN)
    return _consumer(acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk, a_bufs,
                     b_bufs, ready, empty, STAGES, MODE, U, SUBK, FUNNEL, f_bufs, fbt_ptr, fb_off)


@gluon.jit
def _run_mainloop(acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk,
                  BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr,
                  SUBK: gl.constexpr, WS: gl.constexpr, FUNNEL: gl.constexpr = False, f_desc=None, f_off=0,
                  fbt_ptr=None, fb_off=0, bnd=None):
    """Allocate the TMA ring and run the mainloop: in the kernel's own warps (each refills the ring behind
    itself, with the CTA barriers Gluon inserts around the TMA issue), or (WS) with a 1-warp TMA producer
    partition and the mainloop in the default partition, which only waits for full slots and releases them.
    bnd (wgrad): the group's boundary blocks (_boundary_steps) go first: with MODE 12 in the consumer
    partition, overlapped with the producer's first TMA loads; otherwise in all warps before the partitions."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, SUBK * SK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, SUBK * SK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    MODE12: gl.constexpr = f_desc is not None and fbt_ptr is not None
    if bnd is not None:
        xm_bufs = gl.allocate_shared_memory(a_desc.dtype, [2, BM, SK], _step_smem_layout())
        ym_bufs = gl.allocate_shared_memory(b_desc.dtype, [2, BN, SK], _step_smem_layout())
        if not MODE12:
            acc = _boundary_steps(acc, bnd, xm_bufs, ym_bufs, BM, BN)
    if MODE12 and bnd is not None:  # (wgrad) the boundary blocks in the consumer while the ring fills
        f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, SUBK], f_desc.layout)
        res = gl.warp_specialize([
            (_boundary_consumer, (bnd, xm_bufs, ym_bufs, BM, BN, acc, a_desc, b_desc, a_row, b_row, k0, nk,
                                  sa_ptrs, stride_sak, sbt_ptr, stride_sbk, a_bufs, b_bufs, ready, empty, STAGES,
                                  MODE, U, SUBK, FUNNEL, f_bufs, fbt_ptr, fb_off)),
            (_producer, (a_desc, b_desc, a_row, b_row, k0, gl.cdiv(nk, SUBK), a_bufs, b_bufs, ready, empty,
                         STAGES, SUBK, f_desc, f_bufs, f_off)),
        ], [1], [24])
        acc = res[0]
    elif MODE12:  # MODE 12: and B's factors as fp32 (global loads)
        gl.static_assert(WS != 0, "MODE 12 needs the TMA producer partition")
        f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, SUBK], f_desc.layout)
        res = gl.warp_specialize([
            (_consumer, (acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk,
                         a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, FUNNEL, f_bufs, fbt_ptr, fb_off)),
            (_producer, (a_desc, b_desc, a_row, b_row, k0, gl.cdiv(nk, SUBK), a_bufs, b_bufs, ready, empty,
                         STAGES, SUBK, f_desc, f_bufs, f_off)),
        ], [1], [24])
        acc = res[0]
    elif f_desc is not None:  # MODE 10: A's factors ride with each stage
        gl.static_assert(WS != 0, "MODE 10 needs the TMA producer partition")
        f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, SUBK], f_desc.layout)
        res = gl.warp_specialize([
            (_consumer, (acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk,
                         a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, FUNNEL, f_bufs)),
            (_producer, (a_desc, b_desc, a_row, b_row, k0, gl.cdiv(nk, SUBK), a_bufs, b_bufs, ready, empty,
                         STAGES, SUBK, f_desc, f_bufs, f_off)),
        ], [1], [24])
        acc = res[0]
    elif WS:
        res = gl.warp_specialize([
            (_consumer, (acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk,
                         a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, FUNNEL)),
            (_producer, (a_desc, b_desc, a_row, b_row, k0, gl.cdiv(nk, SUBK), a_bufs, b_bufs, ready, empty,
                         STAGES, SUBK)),
        ], [1], [24])
        acc = res[0]
    else:
        acc = _mainloop(acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk,
                        a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, WS, 0, 0, FUNNEL)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    return acc


@gluon.jit
def _blocks(acc, wa_lo, wa_hi, wb_lo, wb_hi, t0, n_b, n_stg, st0, q0, sh, sa_ptrs, sbt_ptr, a_desc, b_desc, a_row,
            b_row, k0, a_bufs, b_bufs, ready, empty, f_bufs, STAGES: gl.constexpr, SUBK: gl.constexpr,
            NS: gl.constexpr, STATIC: gl.constexpr, CHEAP: gl.constexpr, FSM: gl.constexpr, FUNNEL: gl.constexpr,
            AROW: gl.constexpr, AROWS: gl.constexpr, FB: gl.constexpr = False, fbt_ptr=None, fb_off=0):
    """MODE 3-6/10-12's mainloop body: n_b blocks of NS stages from stage t0 of this mainloop (n_stg stages in all
    run in blocks), unrolled; the scale words (wa_*, wb_*) ride along. STATIC: the block is one ring round on
    static slots (t0 and st0 whole rounds). FB (MODE 12): B's factors as fp32 from fbt_ptr + fb_off (4 per stage,
    one stage ahead in wb_hi) instead of B's words. Returns (acc, wa_lo, wa_hi, wb_lo, wb_hi)."""
    for b in range(n_b):
        ph = (st0 // STAGES + t0 // STAGES + b) & 1  # STATIC; st0: stages this ring ran before (persistent grid)
        p_prev = acc  # (placeholders: set at step 0 before their first use)
        p_free = acc
        f_prev = gl.full([acc.shape[0]], 0.0, gl.float32, layout=gl.SliceLayout(1, acc.type.layout))
        for s in gl.static_range(NS):
            t = t0 + b * NS + s
            if FB:  # this stage's 4 B factors; the next stage's are loaded now
                fb0, fb1, fb2, fb3 = _split4(wb_hi)
                wb_hi = _f32x4(fbt_ptr, fb_off + 4 * (t + 1))
            elif FUNNEL:
                if not FSM:
                    wa = _funnel(wa_lo, wa_hi, sh)
                    wa_lo = wa_hi
                wb = _funnel(wb_lo, wb_hi, sh)
                wb_lo = wb_hi
                ok = ((t + 1 < n_stg) & (sh != 0)) | (t + 2 < n_stg)
                if not FSM:
                    wa_hi = _word(sa_ptrs, q0 + t + 2, ok)
                wb_hi = _word(sbt_ptr, q0 + t + 2, ok)
            else:
                if not FSM:
                    wa = wa_hi
                    wa_hi = _word(sa_ptrs, q0 + t + 1, t + 1 < n_stg)
                wb = wb_hi
                wb_hi = _word(sbt_ptr, q0 + t + 1, t + 1 < n_stg)
            if STATIC:
                mbarrier.wait(ready.index(s), ph)
            if CHEAP:  # MODE 5: the stage's decode pass (one PRMT per step below)
                if not FSM:
                    ha, la = _e8m0_prep(wa)
                if not FB:
                    hb, lb = _e8m0_prep(wb)
            for sub in gl.static_range(SUBK):
                u = s * SUBK + sub
                # MODE 2's register reuse: wgmma u overwrites partial u-2 (already promoted)
                if STATIC:
                    p_new = _mma_slot(a_bufs, b_bufs, s, sub, acc, p_free, u < 2, AROW, AROWS)
                else:
                    # (step t * SUBK + sub, spelled so that the MODE 4/5/10 blocks compile as before)
                    p_new = _mma_step(t0 * SUBK + b * (NS * SUBK) + u, sub, acc, a_bufs, b_bufs, ready, STAGES, SUBK,
                                      u < 2, p_free, AROW, AROWS, st0)
                if FSM:
                    if sub == 0:  # the stage has landed (_mma_step waited): its rows' 4 factors
                        slot = s if STATIC else (st0 + t) % STAGES
                        fa0, fa1, fa2, fa3 = _stage_rows(f_bufs, slot, AROW, AROWS, acc.shape[1])
                    if FB:
                        f_new = _pick4(fa0, fa1, fa2, fa3, sub) * _pick4(fb0, fb1, fb2, fb3, sub)
                    else:
                        f_new = _pick4(fa0, fa1, fa2, fa3, sub) * _e8m0_pick(hb, lb, sub)
                elif CHEAP:
                    f_new = _e8m0_pick(ha, la, sub) * _e8m0_pick(hb, lb, sub)
                else:
                    f_new = _byte_f32(wa, sub) * _byte_f32(wb, sub)
                if u > 0:
                    p_done, acc = warpgroup_mma_wait(num_outstanding=1, deps=(p_prev, acc))
                    if sub == 0:  # the previous stage's wgmmas have all finished
                        # (STATIC: st0 + t is s modulo STAGES, so the slot is static)
                        _release(s + STAGES - 1 if STATIC else st0 + t - 1, 0, a_desc, b_desc, a_row, b_row, k0,
                                 a_bufs, b_bufs, ready, empty, STAGES, SUBK, True)
                    acc = acc + p_done * gl.expand_dims(f_prev, 1)
                    p_free = p_done
                p_prev = p_new
                f_prev = f_new
        p_done, acc = warpgroup_mma_wait(num_outstanding=0, deps=(p_prev, acc))
        _release(NS - 1 if STATIC else st0 + t0 + b * NS + NS - 1, 0, a_desc, b_desc, a_row, b_row, k0, a_bufs,
                 b_bufs, ready, empty, STAGES, SUBK, True)
        acc = acc + p_done * gl.expand_dims(f_prev, 1)
    return acc, wa_lo, wa_hi, wb_lo, wb_hi


@gluon.jit
def _mainloop(acc, a_desc, b_desc, a_row, b_row, k0, nk, sa_ptrs, stride_sak, sbt_ptr, stride_sbk,
              a_bufs, b_bufs, ready, empty, STAGES: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr,
              SUBK: gl.constexpr, WS: gl.constexpr, AROW: gl.constexpr = 0, AROWS: gl.constexpr = 0,
              FUNNEL: gl.constexpr = False, st0=0, f_bufs=None, fbt_ptr=None, fb_off=0):
    """acc += sum over nk steps of 32 (reduction from k0) of (A[a_row:+BM, k] @ B[b_row:+BN, k]^T) * f_k with
    f_k = e8m0(sa_ptrs[k/32]) * e8m0(sbt_ptr[k/32]) per row. Uses each ring barrier's phase from 0, so a CTA
    calls it once (fresh barriers). One TMA stage holds SUBK steps ([BM, 32*SUBK] boxes; the wgmmas read
    32-wide slices of it), so barrier waits, TMA issues and the CTA barriers around them come once per stage.

    MODE 0: wait for each wgmma before promoting it (Triton's schedule; only the other warpgroup overlaps).
    MODE 1/2: blocks of U steps, unrolled: wgmma j+1 is issued before partial j is promoted, so the tensor
    cores run while the CUDA cores promote; the last partial of a block is promoted after wait(0), so no
    wgmma is in flight across the loop's back edge (a loop-carried in-flight accumulator costs register
    copies, which make ptxas serialize all wgmmas: C7514/C7515). MODE 1 gives each wgmma fresh zeros as its
    ignored accumulator, MODE 2 the registers of the partial promoted just before. MODE 4 = MODE 2 with one int32
    of scales per row and stage (SUBK = 4, WS only); MODE 3 = MODE 4 with blocks of all STAGES stages unrolled
    (static slots; measured slower: instruction cache). MODE 5/6 = MODE 4/3 with the stage-wise E8M0 decode
    (_e8m0_prep once per stage word, one _e8m0_pick = PRMT per step; bit-identical factors). MODE 10 = MODE 5 with
    A's factors from f_bufs (fp32, filled by the producer's TMA with each stage; B keeps its words); MODE 11 = MODE 6
    with them; MODE 12 = MODE 11 with B's factors as fp32 too (fbt_ptr + fb_off: 4 per stage, one 16-byte load; the
    default). Static slots (MODE 3/6/11/12) run whole ring rounds, then blocks of 2 stages
    on dynamic slots (_blocks). st0: ring stages used before this call (persistent grid; a multiple of STAGES with
    static slots);
    FUNNEL: the reduction may start at any step (wgrad), else at a multiple of 4 steps."""
    gl.static_assert(U % SUBK == 0, "U must be a multiple of SUBK")
    gl.static_assert(U // SUBK <= STAGES, "the tail after the unrolled blocks must already be in flight")
    n_st = gl.cdiv(nk, SUBK)
    if not WS:
        for i in gl.static_range(STAGES):
            _issue_load(a_desc, b_desc, a_row, b_row, k0 + i * (SUBK * SK), ready.index(i), a_bufs.index(i),
                        b_bufs.index(i), i < n_st)
    kb0 = k0 // SK
    n_main = 0
    if MODE >= 3:
        # MODE 3: static ring: blocks of STAGES stages (STAGES * SUBK steps) fully unrolled, so every ring index,
        # smem slice and barrier is static and the phase is the block's parity (measured slower: the 16-step
        # body of each of the two consumers overflows the instruction cache). MODE 4: MODE 2's blocks of U steps
        # (dynamic slots). Both read the scales of a stage as one int32 per row (4 E8M0 bytes), one stage ahead.
        gl.static_assert(SUBK == 4, "MODE 3/4 read a stage's 4 scale bytes as one word")
        gl.static_assert(WS != 0, "MODE 3/4 need the TMA producer partition (WS)")
        STATIC: gl.constexpr = (MODE == 3) or (MODE == 6) or (MODE == 11) or (MODE == 12)
        # MODE 5 = MODE 4, MODE 6 = MODE 3, with the stage-wise E8M0 decode (_e8m0_prep / _e8m0_pick)
        CHEAP: gl.constexpr = (MODE == 5) or (MODE == 6) or (MODE == 10) or (MODE == 11) or (MODE == 12)
        # MODE 10 = MODE 5 (MODE 11 = MODE 6) with A's factors from shared memory (fp32, loaded by TMA with each
        # stage: no A words, no A decode); B's word as in MODE 5
        FSM: gl.constexpr = ((MODE == 10) or (MODE == 11) or (MODE == 12)) and (f_bufs is not None)  # (else: dead)
        # MODE 12 = MODE 11 with B's factors as fp32 (a [tiles, steps] table: 4 per stage, one 16-byte load)
        FB: gl.constexpr = (MODE == 12) and (fbt_ptr is not None)
        BLK: gl.constexpr = STAGES * SUBK if STATIC else U
        gl.static_assert(BLK % SUBK == 0, "blocks of whole stages")
        NS: gl.constexpr = BLK // SUBK
        n_blk = nk // BLK
        n_main = n_blk * BLK
        # static slots (MODE 3/6/11/12) and the factor modes (MODE 10: wgrad's groups end anywhere): whole blocks
        # first, then blocks of 2 stages on dynamic slots (MODE 4's loop), so only a last odd stage runs
        # synchronously
        TNS: gl.constexpr = 2 if STAGES >= 2 else 1
        TAIL: gl.constexpr = STATIC or (FSM and BLK > TNS * SUBK)
        n_blk2 = (nk - n_main) // (TNS * SUBK) if TAIL else 0
        n_async = n_main + n_blk2 * (TNS * SUBK)
        # scale words: stage t of this mainloop covers steps kb0 + 4t .. +3; FUNNEL (wgrad: kb0 % 4 may be
        # nonzero, uniform) = the aligned words q0 + t and q0 + t + 1 funnel-shifted by sh; each word is loaded
        # one stage before its first use and carried (lo, hi)
        n_stg = n_async // SUBK
        q0 = kb0 // 4
        sh = (kb0 % 4) * 8
        if FB:
            wb_hi = _f32x4(fbt_ptr, fb_off + kb0)
            wb_lo = wb_hi
        elif FUNNEL:
            if not FSM:
                wa_lo = _word(sa_ptrs, q0, n_stg > 0)
                wa_hi = _word(sa_ptrs, q0 + 1, (n_stg > 0) & (sh != 0) | (n_stg > 1))
            wb_lo = _word(sbt_ptr, q0, n_stg > 0)
            wb_hi = _word(sbt_ptr, q0 + 1, (n_stg > 0) & (sh != 0) | (n_stg > 1))
        else:
            if not FSM:
                wa_hi = _word(sa_ptrs, q0, n_stg > 0)
                wa_lo = wa_hi
            wb_hi = _word(sbt_ptr, q0, n_stg > 0)
            wb_lo = wb_hi
        if FSM:  # (A has no words: placeholders that _blocks never reads)
            wa_lo = wb_lo
            wa_hi = wb_hi
        acc, wa_lo, wa_hi, wb_lo, wb_hi = _blocks(
            acc, wa_lo, wa_hi, wb_lo, wb_hi, 0, n_blk, n_stg, st0, q0, sh, sa_ptrs, sbt_ptr, a_desc, b_desc, a_row,
            b_row, k0, a_bufs, b_bufs, ready, empty, f_bufs, STAGES, SUBK, NS, STATIC, CHEAP, FSM, FUNNEL, AROW, AROWS,
            FB, fbt_ptr, fb_off + kb0)
        if TAIL:
            acc, wa_lo, wa_hi, wb_lo, wb_hi = _blocks(
                acc, wa_lo, wa_hi, wb_lo, wb_hi, n_blk * NS, n_blk2, n_stg, st0, q0, sh, sa_ptrs, sbt_ptr, a_desc,
                b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready, empty, f_bufs, STAGES, SUBK, TNS, False, CHEAP, FSM,
                FUNNEL, AROW, AROWS, FB, fbt_ptr, fb_off + kb0)
        n_main = n_async
    elif MODE != 0:
        n_main = (nk // U) * U
        for j0 in range(0, n_main, U):
            p_prev = _mma_step(j0, 0, acc, a_bufs, b_bufs, ready, STAGES, SUBK, True, acc, AROW, AROWS)
            f_prev = _scale(sa_ptrs, stride_sak, sbt_ptr, stride_sbk, kb0 + j0)
            p_free = acc
            for u in gl.static_range(1, U):
                p_new = _mma_step(j0 + u, u % SUBK, acc, a_bufs, b_bufs, ready, STAGES, SUBK, MODE == 1 or u == 1,
                                  p_free, AROW, AROWS)
                f_new = _scale(sa_ptrs, stride_sak, sbt_ptr, stride_sbk, kb0 + j0 + u)
                # acc rides through the wait so that the previous FMAs cannot sink below it (LLVM would
                # otherwise delay them all to the end of the block and keep every partial live)
                p_done, acc = warpgroup_mma_wait(num_outstanding=1, deps=(p_prev, acc))
                if (u - 1) % SUBK == SUBK - 1:
                    _release((j0 + u - 1) // SUBK, n_st, a_desc, b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready,
                             empty, STAGES, SUBK, WS)
                acc = acc + p_done * gl.expand_dims(f_prev, 1)
                p_free = p_done
                p_prev = p_new
                f_prev = f_new
            p_done, acc = warpgroup_mma_wait(num_outstanding=0, deps=(p_prev, acc))
            _release((j0 + U - 1) // SUBK, n_st, a_desc, b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready, empty,
                     STAGES, SUBK, WS)
            acc = acc + p_done * gl.expand_dims(f_prev, 1)
    # the rest (MODE 0: everything), one stage at a time, each wgmma waited for before its promotion. fprop/dgrad
    # MODE 12 takes the factors from its tables here too (the stage's A rows in f_bufs, B's 4 in fbt_ptr), not the
    # scales: the consumer then needs no scale pointers (the storer-partition default spilled without it); wgrad
    # (FUNNEL) keeps the scale bytes (the tables measured -0 to -3% there: session 27, call 3)
    TABLES: gl.constexpr = (MODE == 12) and (f_bufs is not None) and (fbt_ptr is not None) and (not FUNNEL)
    for jt in range(n_main, nk, SUBK):
        if TABLES:
            fb0, fb1, fb2, fb3 = _split4(_f32x4(fbt_ptr, fb_off + kb0 + jt))
            fa0 = gl.full([acc.shape[0]], 0.0, gl.float32, layout=gl.SliceLayout(1, acc.type.layout))  # (set below)
            fa1 = fa0
            fa2 = fa0
            fa3 = fa0
        for sub in gl.static_range(SUBK):
            j = jt + sub
            if j < nk:
                if not TABLES:
                    f = _scale(sa_ptrs, stride_sak, sbt_ptr, stride_sbk, kb0 + j)
                p = _mma_step(j, sub, acc, a_bufs, b_bufs, ready, STAGES, SUBK, True, acc, AROW, AROWS, st0)
                if TABLES:
                    if sub == 0:  # the stage has landed (_mma_step waited)
                        fa0, fa1, fa2, fa3 = _stage_rows(f_bufs, (st0 + j // SUBK) % STAGES, AROW, AROWS,
                                                         acc.shape[1])
                    f = _pick4(fa0, fa1, fa2, fa3, sub) * _pick4(fb0, fb1, fb2, fb3, sub)
                p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
                acc = acc + p * gl.expand_dims(f, 1)
        _release(st0 + jt // SUBK, n_st, a_desc, b_desc, a_row, b_row, k0, a_bufs, b_bufs, ready, empty, STAGES, SUBK,
                 WS)
    return acc


@gluon.constexpr_function
def _mma_layout(BM, BN, num_warps):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, SK])


@gluon.constexpr_function
def _step_smem_layout():
    # a [rows, 32] fp8 tile: 32-byte rows, 32-byte swizzle
    return gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)


@gluon.constexpr_function
def _epi_smem_layout(elem_bits):
    # EPI's output buffer: 16-byte chunks XOR-swizzled by row, so the accumulator's row pairs and the storer's
    # 16-byte row reads both spread over the banks
    return gl.SwizzledSharedLayout(vec=128 // elem_bits, per_phase=1, max_phase=8, order=[1, 0])


@gluon.constexpr_function
def _store_layout(BN, elem_bits, num_warps):
    # 16-byte stores along the row, a warp covers whole rows of the tile
    vec = 128 // elem_bits
    tpw_n = min(32, BN // vec)
    return gl.BlockedLayout(size_per_thread=[1, vec], threads_per_warp=[32 // tpw_n, tpw_n],
                            warps_per_cta=[num_warps, 1], order=[1, 0])


@gluon.jit
def _nt_tile(pid, offs_ptr, M, N, K, NUM_M_TILES, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr,
             E: gl.constexpr):
    """Output tile number pid -> (expert (-1: past the last group), first A row, rows base + [0, BM) of which
    [lo, hi) are written, column tile nt, reduction steps nk)."""
    num_n = gl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gsz = gl.minimum(NUM_M_TILES - first_m, GROUP_M)
    mt = first_m + (pid % width) % gsz
    nt = (pid % width) // gsz

    # which group owns global m-tile `mt` (tiles are numbered group after group; offs clamped so that bad
    # offs give wrong groups, never stray writes)
    expert = -1
    row0 = 0
    row_end = 0
    tile_base = 0
    start = 0
    for e in gl.static_range(E):
        end = gl.minimum(gl.maximum(gl.load(offs_ptr + e), start), M)
        n_t = gl.cdiv(end - start, BM)
        hit = (mt >= tile_base) & (mt < tile_base + n_t)
        expert = gl.where(hit, e, expert)
        row0 = gl.where(hit, start + (mt - tile_base) * BM, row0)
        row_end = gl.where(hit, end, row_end)
        tile_base += n_t
        start = end

    # a tile past the last group (expert < 0) runs an empty mainloop and writes zeros into the padding rows
    # [offs[-1], M) it covers; tiles further out write nothing
    real = expert >= 0
    pad0 = start + (mt - tile_base) * BM
    base = gl.where(real, row0, pad0)
    lo = gl.where(real, row0, start)
    hi = gl.where(real, row_end, M)
    nk = gl.where(real, K // SK, 0)
    return expert, row0, base, lo, hi, nt, nk


@gluon.jit
def _pad_round(g, n_st, ready, empty, STAGES: gl.constexpr, PRODUCER: gl.constexpr):
    """Static ring slots need every tile to start a ring round: a tile of n_st stages that ended at ring stage g
    (all tiles) fills the rest of its last round with empty stages: the producer arrives on their ready barriers
    without data, the consumers take them and release them as any other. Returns the stage count after them."""
    for i in range(n_st, gl.cdiv(n_st, STAGES) * STAGES):
        s = g % STAGES
        if PRODUCER:
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            mbarrier.arrive(ready.index(s))
        else:
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            mbarrier.arrive(empty.index(s))
        g += 1
    return g


@gluon.jit
def _nt_persistent(a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, offs_ptr, M, N, K, NUM_M_TILES, stride_sam, stride_sak,
                   stride_sbe, stride_sbn, stride_sbk, stride_cm, BM: gl.constexpr, BN: gl.constexpr,
                   STAGES: gl.constexpr, GROUP_M: gl.constexpr, E: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr,
                   SUBK: gl.constexpr, WS: gl.constexpr = 2, NW: gl.constexpr = 4, f_desc=None, fb_ptr=None,
                   stride_fbr=0, EPI: gl.constexpr = False):
    """Persistent WS=2 grid (one CTA per SM, tiles pid, pid + grid, ...): the TMA warp runs ahead into the next
    tile while the consumers store the last one. The ring runs on across tiles, its stages counted across tiles;
    with static slots (MODE 3/6/11) each tile starts a ring round (PAD: the producer fills the rest of a tile's
    last round with empty stages, which the consumers take and release). WS=1 (NW = 8 warps): one consumer partition
    of two warpgroups running the same code (one copy of the mainloop: half the instruction-cache footprint of WS=2's
    two specialised partitions; the partition barriers Gluon inserts then span both warpgroups).

    EPI (MODE 12, WS=1; the default): the consumer only multiplies. The TMA warp hands it each tile's (expert,
    column tile, first row, steps) through a 2-slot shared ring (_put_ints), so it runs no group search, and it
    leaves each finished tile in a shared buffer (stmatrix) for a 2-warp storer partition that writes it out while
    the next tile's wgmmas run. Before (session 26) each tile's convert, layout change and global stores (and the
    group search's loads queued behind those stores) kept both consumer warpgroups off the tensor cores ~1.2 us a
    tile: ~10% of a 64-step tile (session 27: +6% in the 64-88-step cells, call 2)."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, SUBK * SK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, SUBK * SK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=WS)
    n_tiles = NUM_M_TILES * gl.cdiv(N, BN)
    PAD: gl.constexpr = (MODE == 3) or (MODE == 6) or (MODE == 11) or (MODE == 12)  # static: tiles start rounds
    if f_desc is not None and WS == 1 and EPI:  # + a 2-warp storer partition (_storer_persistent)
        f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, SUBK], f_desc.layout)
        epi_buf = gl.allocate_shared_memory(c_ptr.dtype.element_ty, [BM, BN], _epi_smem_layout(
            c_ptr.dtype.element_ty.primitive_bitwidth))
        epi_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # [full, empty]
        mbarrier.init(epi_bar.index(0), count=1)
        mbarrier.init(epi_bar.index(1), count=1)
        # each tile's (expert, nt, first row, steps) from the TMA warp: the consumer runs no group search
        tinfo = gl.allocate_shared_memory(gl.int32, [2, 4], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        t_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        t_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(t_ready.index(i), count=1)
            mbarrier.init(t_free.index(i), count=1)
        gl.warp_specialize([
            (_nt_half_persistent, (0, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK, NW, f_bufs,
                                   fb_ptr, stride_fbr, epi_buf, epi_bar, (tinfo, t_ready, t_free))),
            (_producer_persistent, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, K, NUM_M_TILES,
                                    n_tiles, BM, BN, STAGES, GROUP_M, E, SUBK, PAD, f_desc, f_bufs,
                                    (tinfo, t_ready, t_free))),
            (_storer_persistent, (epi_buf, epi_bar, c_ptr, offs_ptr, M, N, K, NUM_M_TILES, n_tiles, stride_cm, BM,
                                  BN, GROUP_M, E)),
        ], [1, 2], [40, 40])
        mbarrier.invalidate(epi_bar.index(0))
        mbarrier.invalidate(epi_bar.index(1))
        for i in gl.static_range(2):
            mbarrier.invalidate(t_ready.index(i))
            mbarrier.invalidate(t_free.index(i))
    elif f_desc is not None and WS == 1:  # MODE 10/11, one 8-warp consumer: A's factors ride with each stage
        f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, SUBK], f_desc.layout)
        gl.warp_specialize([
            (_nt_half_persistent, (0, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK, NW, f_bufs,
                                   fb_ptr, stride_fbr)),
            (_producer_persistent, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, K, NUM_M_TILES,
                                    n_tiles, BM, BN, STAGES, GROUP_M, E, SUBK, PAD, f_desc, f_bufs)),
        ], [1], [40])
    elif f_desc is not None:  # MODE 10/11, two 4-warp consumers (WS=2)
        f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, SUBK], f_desc.layout)
        gl.warp_specialize([
            (_nt_half_persistent, (0, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK, 4, f_bufs)),
            (_nt_half_persistent, (1, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK, 4, f_bufs)),
            (_producer_persistent, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, K, NUM_M_TILES,
                                    n_tiles, BM, BN, STAGES, GROUP_M, E, SUBK, PAD, f_desc, f_bufs)),
        ], [4, 1], [240, 40])
    elif WS == 1:
        gl.warp_specialize([
            (_nt_half_persistent, (0, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK, NW)),
            (_producer_persistent, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, K, NUM_M_TILES,
                                    n_tiles, BM, BN, STAGES, GROUP_M, E, SUBK, PAD)),
        ], [1], [40])
    else:
        gl.warp_specialize([
            (_nt_half_persistent, (0, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK)),
            (_nt_half_persistent, (1, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, offs_ptr,
                                   M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                                   stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK)),
            (_producer_persistent, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, K, NUM_M_TILES,
                                    n_tiles, BM, BN, STAGES, GROUP_M, E, SUBK, PAD)),
        ], [4, 1], [240, 40])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


@gluon.jit
def _nt_half_persistent(idx: gl.constexpr, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr,
                        offs_ptr, M, N, K, NUM_M_TILES, n_tiles, stride_sam, stride_sak, stride_sbe, stride_sbn,
                        stride_sbk, stride_cm, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                        GROUP_M: gl.constexpr, E: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr,
                        SUBK: gl.constexpr, NW: gl.constexpr = 4, f_bufs=None, fb_ptr=None, stride_fbr=0,
                        epi_buf=None, epi_bar=None, tring=None):
    """Consumer of the persistent grid: NW = 4: rows idx*BM/2 + [0, BM/2) of each tile (WS=2, one of two
    partitions); NW = 8: all BM rows, one 64-row half per warpgroup (WS=1, the same code for both)."""
    HB: gl.constexpr = BM // 2 if NW == 4 else BM
    AROWS: gl.constexpr = HB if NW == 4 else 0
    mma_layout: gl.constexpr = _mma_layout(HB, BN, NW)
    n_done = 0  # ring stages consumed so far (all tiles): slot and phase of the next one
    j = 0  # tiles done
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        if tring is not None:
            expert, nt, base, nk = _take_ints(tring[0], tring[1], tring[2], j)
            row0 = base
        else:
            expert, row0, base, lo, hi, nt, nk = _nt_tile(t, offs_ptr, M, N, K, NUM_M_TILES, BM, BN, GROUP_M, E)
        rows = gl.minimum(base + idx * HB + gl.arange(0, HB, layout=gl.SliceLayout(1, mma_layout)), M - 1)
        sbt_ptr = sb_ptr + gl.maximum(expert, 0) * stride_sbe + (nt * BN) * stride_sbn
        fbt_ptr = None
        fb_off = 0
        if MODE == 12:  # the tile's row of B's factor table
            fbt_ptr = fb_ptr
            fb_off = (gl.maximum(expert, 0) * gl.cdiv(N, BN) + nt) * stride_fbr
        acc = gl.zeros([HB, BN], gl.float32, mma_layout)
        acc = _mainloop(acc, a_desc, b_desc, row0, expert * N + nt * BN, 0, nk, sa_ptr + rows * stride_sam,
                        stride_sak, sbt_ptr, stride_sbk, a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, True,
                        idx * HB, AROWS, False, n_done, f_bufs, fbt_ptr, fb_off)
        n_st = gl.cdiv(nk, SUBK)
        if (MODE == 3) or (MODE == 6) or (MODE == 11) or (MODE == 12):
            n_done = _pad_round(n_done + n_st, n_st, ready, empty, STAGES, False)
        else:
            n_done += n_st
        if epi_buf is not None:  # hand the tile to the storer partition (its buffer is free once it has read it)
            mbarrier.wait(epi_bar.index(1), (j & 1) ^ 1)
            epi_buf.store(acc.to(c_ptr.dtype.element_ty))
            mbarrier.arrive(epi_bar.index(0))
        else:
            _store_tile(acc, c_ptr, base + idx * HB, lo, hi, nt * BN, N, stride_cm, HB, BN, NW)
        j += 1


@gluon.jit
def _storer_persistent(epi_buf, epi_bar, c_ptr, offs_ptr, M, N, K, NUM_M_TILES, n_tiles, stride_cm, BM: gl.constexpr,
                       BN: gl.constexpr, GROUP_M: gl.constexpr, E: gl.constexpr):
    """EPI: the persistent grid's epilogue in its own partition: each tile's output waits in epi_buf (the consumer
    stores it there and goes on with the next tile), this partition writes rows [lo, hi) of it to c."""
    st_layout: gl.constexpr = _store_layout(BN, c_ptr.dtype.element_ty.primitive_bitwidth, gl.num_warps())
    R: gl.constexpr = 16
    i = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        expert, row0, base, lo, hi, nt, nk = _nt_tile(t, offs_ptr, M, N, K, NUM_M_TILES, BM, BN, GROUP_M, E)
        offs_n = nt * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, st_layout))
        nmask = gl.expand_dims(offs_n < N, 0)
        mbarrier.wait(epi_bar.index(0), i & 1)
        for r0 in gl.static_range(0, BM, R):
            out = epi_buf.slice(r0, R, dim=0).load(st_layout)
            offs_m = base + r0 + gl.arange(0, R, layout=gl.SliceLayout(1, st_layout))
            smask = gl.expand_dims((offs_m >= lo) & (offs_m < hi), 1) & nmask
            gl.store(c_ptr + gl.expand_dims(offs_m, 1) * stride_cm + gl.expand_dims(offs_n, 0), out, mask=smask)
        mbarrier.arrive(epi_bar.index(1))
        i += 1


@gluon.jit
def _producer_persistent(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offs_ptr, M, N, K, NUM_M_TILES, n_tiles,
                         BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                         E: gl.constexpr, SUBK: gl.constexpr, PAD: gl.constexpr, f_desc=None, f_bufs=None,
                         tring=None):
    g = 0  # stages issued so far (all tiles)
    j = 0  # tiles so far
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        expert, row0, base, lo, hi, nt, nk = _nt_tile(t, offs_ptr, M, N, K, NUM_M_TILES, BM, BN, GROUP_M, E)
        if tring is not None:  # (expert, nt, the tile's first row, steps) for the consumer
            _put_ints(tring[0], tring[1], tring[2], j, expert, nt, base, nk)
        j += 1
        b_row = expert * N + nt * BN
        for st in range(gl.cdiv(nk, SUBK)):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            _issue_load(a_desc, b_desc, row0, b_row, st * (SUBK * SK), ready.index(s), a_bufs.index(s),
                        b_bufs.index(s), True, f_desc, f_bufs, 0, s)
            g += 1
        if PAD:  # static slots (MODE 3/6/11)
            g = _pad_round(g, gl.cdiv(nk, SUBK), ready, empty, STAGES, True)


@gluon.jit
def _nt_grouped_kernel(
    a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, offs_ptr, f_desc, fb_ptr,
    M, N, K, NUM_M_TILES,
    stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, stride_cm, stride_fbr,
    BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, E: gl.constexpr,
    MODE: gl.constexpr, U: gl.constexpr, SUBK: gl.constexpr, WS: gl.constexpr, num_warps: gl.constexpr,
    PERSIST: gl.constexpr = False, EPI: gl.constexpr = False,
):
    """out[rows of group e] = A[rows] @ B[e]^T; A [M, K] (a_desc box [BM, 32]), B [E, N, K] seen as [E*N, K]
    (b_desc box [BN, 32]); scales sa[m, k/32], sb[e, n, k/32] through strides; B's scale is constant over the
    BN rows of a tile (the tile's first row is read)."""
    mma_layout: gl.constexpr = _mma_layout(BM, BN, num_warps)
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)

    if PERSIST:
        gl.static_assert((WS == 2 and num_warps == 4) or (WS == 1 and num_warps == 8),
                         "the persistent grid runs two 4-warp consumers (WS=2) or one 8-warp consumer (WS=1)")
        _nt_persistent(a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, offs_ptr, M, N, K, NUM_M_TILES, stride_sam, stride_sak,
                       stride_sbe, stride_sbn, stride_sbk, stride_cm, BM, BN, STAGES, GROUP_M, E, MODE, U, SUBK, WS,
                       num_warps, f_desc, fb_ptr, stride_fbr, EPI)
        return
    expert, row0, base, lo, hi, nt, nk = _nt_tile(gl.program_id(0), offs_ptr, M, N, K, NUM_M_TILES, BM, BN, GROUP_M,
                                                  E)
    rows = gl.minimum(base + gl.arange(0, BM, layout=row_layout), M - 1)
    sa_ptrs = sa_ptr + rows * stride_sam
    sbt_ptr = sb_ptr + gl.maximum(expert, 0) * stride_sbe + (nt * BN) * stride_sbn
    if WS == 2:
        # two independent consumer warpgroups (rows 0-63 and 64-127 of the tile, each with its own epilogue)
        # and a TMA warp: no CTA barrier ties the consumers together, so one promotes while the other's
        # wgmmas run
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, SUBK * SK], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, SUBK * SK], b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        b_row = expert * N + nt * BN
        gl.warp_specialize([
            (_nt_half, (0, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sbt_ptr, c_ptr, row0, b_row, nk,
                        base, lo, hi, M, N, nt, stride_sam, stride_sak, stride_sbk, stride_cm, BM, BN, STAGES, MODE,
                        U, SUBK)),
            (_nt_half, (1, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sbt_ptr, c_ptr, row0, b_row, nk,
                        base, lo, hi, M, N, nt, stride_sam, stride_sak, stride_sbk, stride_cm, BM, BN, STAGES, MODE,
                        U, SUBK)),
            (_producer, (a_desc, b_desc, row0, b_row, 0, gl.cdiv(nk, SUBK), a_bufs, b_bufs, ready, empty, STAGES,
                         SUBK)),
        ], [4, 1], [240, 24])
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))
    else:
        acc = gl.zeros([BM, BN], gl.float32, mma_layout)
        acc = _run_mainloop(acc, a_desc, b_desc, row0, expert * N + nt * BN, 0, nk, sa_ptrs, stride_sak, sbt_ptr,
                            stride_sbk, BM, BN, STAGES, MODE, U, SUBK, WS)
        _store_tile(acc, c_ptr, base, lo, hi, nt * BN, N, stride_cm, BM, BN, num_warps)


@gluon.jit
def _store_tile(acc, c_ptr, base, lo, hi, n0, N, stride_cm, BM: gl.constexpr, BN: gl.constexpr,
                num_warps: gl.constexpr):
    """rows base + [0, BM) that lie in [lo, hi), columns n0 + [0, BN) below N, through coalesced stores (stores
    straight from the wgmma registers measured 0.81-0.95x: session 26)."""
    st_layout: gl.constexpr = _store_layout(BN, c_ptr.dtype.element_ty.primitive_bitwidth, num_warps)
    out = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), st_layout)
    offs_m = base + gl.arange(0, BM, layout=gl.SliceLayout(1, st_layout))
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, st_layout))
    smask = gl.expand_dims((offs_m >= lo) & (offs_m < hi), 1) & gl.expand_dims(offs_n < N, 0)
    gl.store(c_ptr + gl.expand_dims(offs_m, 1) * stride_cm + gl.expand_dims(offs_n, 0), out, mask=smask)


@gluon.jit
def _nt_half(idx: gl.constexpr, a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sbt_ptr, c_ptr, row0, b_row,
             nk, base, lo, hi, M, N, nt, stride_sam, stride_sak, stride_sbk, stride_cm, BM: gl.constexpr,
             BN: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr, SUBK: gl.constexpr):
    """WS=2 consumer: one warpgroup computes rows idx*BM/2 + [0, BM/2) of the tile and stores them."""
    HB: gl.constexpr = BM // 2
    mma_layout: gl.constexpr = _mma_layout(HB, BN, 4)
    rows = gl.minimum(base + idx * HB + gl.arange(0, HB, layout=gl.SliceLayout(1, mma_layout)), M - 1)
    acc = gl.zeros([HB, BN], gl.float32, mma_layout)
    acc = _mainloop(acc, a_desc, b_desc, row0, b_row, 0, nk, sa_ptr + rows * stride_sam, stride_sak, sbt_ptr,
                    stride_sbk, a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, True, idx * HB, HB)
    _store_tile(acc, c_ptr, base + idx * HB, lo, hi, nt * BN, N, stride_cm, HB, BN, 4)


@gluon.jit
def _boundary_steps(acc, bnd, xm_bufs, ym_bufs, BN: gl.constexpr, BK: gl.constexpr):
    """acc + group e's tokens in the 32-token blocks its boundaries cut: [start, first_full) of the block
    holding start and [last_full, end) of the block holding end - 1 (one block masked [start, end) when both
    fall in it). bnd = (x_ptr, y_ptr, sx_ptrs, syt_ptr, stride_xn, stride_yk, stride_sxt, stride_syt, n0, k0,
    start, end, first_full, last_full, N, K). The operands are loaded with a token mask (the neighbour group's
    tokens may hold anything, NaN included), staged through shared memory (xm_bufs / ym_bufs: [2, rows, 32]) and
    promoted synchronously with the block's scales. Both blocks' loads are in flight together, before the
    mainloop (with MODE 12 in the consumer partition while the TMA warp fills the ring), and every wgrad config
    sums in one order: head block, tail block, mainloop. (Against a tail step after the mainloop: within the
    noise, session 26.)"""
    x_ptr, y_ptr, sx_ptrs, syt_ptr, stride_xn, stride_yk, stride_sxt, stride_syt, n0, k0, start, end, \
        first_full, last_full, N, K = bnd
    head = (start % SK != 0) & (start < end)
    tail = (end % SK != 0) & (last_full >= first_full) & (start < end)
    if head | tail:
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[16, 2],
                                                   warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
        cols = gl.arange(0, SK, layout=gl.SliceLayout(0, ld_layout))
        th = (start // SK) * SK + cols
        tt = last_full + cols
        h_ok = gl.expand_dims((th >= start) & (th < end), 0) & head
        t_ok = gl.expand_dims(tt < end, 0) & tail
        rn = gl.minimum(n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, ld_layout)), N - 1)
        rk = gl.minimum(k0 + gl.arange(0, BK, layout=gl.SliceLayout(1, ld_layout)), K - 1)
        x_rows = x_ptr + gl.expand_dims(rn, 1) * stride_xn
        y_rows = y_ptr + gl.expand_dims(rk, 1) * stride_yk
        xh = gl.load(x_rows + gl.expand_dims(th, 0), mask=h_ok, other=0.0)
        yh = gl.load(y_rows + gl.expand_dims(th, 0), mask=h_ok, other=0.0)
        xt = gl.load(x_rows + gl.expand_dims(tt, 0), mask=t_ok, other=0.0)
        yt = gl.load(y_rows + gl.expand_dims(tt, 0), mask=t_ok, other=0.0)
        # a block that is not cut reads factor 1 (byte 127) over zeros: it adds +0, whatever its scale holds
        hb = start // SK
        tb = last_full // SK
        fh = _e8m0_to_f32(gl.load(sx_ptrs + hb * stride_sxt, mask=head, other=127)) * \
            _e8m0_to_f32(gl.load(syt_ptr + hb * stride_syt, mask=head, other=127))
        ft = _e8m0_to_f32(gl.load(sx_ptrs + tb * stride_sxt, mask=tail, other=127)) * \
            _e8m0_to_f32(gl.load(syt_ptr + tb * stride_syt, mask=tail, other=127))
        xm_bufs.index(0).store(xh)
        ym_bufs.index(0).store(yh)
        xm_bufs.index(1).store(xt)
        ym_bufs.index(1).store(yt)
        fence_async_shared()
        gl.thread_barrier()
        ph = warpgroup_mma(xm_bufs.index(0), ym_bufs.index(0).permute((1, 0)), acc, use_acc=False, is_async=True)
        pt = warpgroup_mma(xm_bufs.index(1), ym_bufs.index(1).permute((1, 0)), acc, use_acc=False, is_async=True)
        ph, pt = warpgroup_mma_wait(num_outstanding=0, deps=(ph, pt))
        acc = acc + ph * gl.expand_dims(fh, 1)
        acc = acc + pt * gl.expand_dims(ft, 1)
    return acc


@gluon.jit
def _wgrad_tile(pid, e, offs_ptr, M, N, K, BN: gl.constexpr, BK: gl.constexpr, GROUP_N: gl.constexpr):
    """Tile pid of group e's dW -> (n0, k0, the group's tokens [start, end), its full 32-token steps
    [first_full, last_full), their number nk)."""
    num_n = gl.cdiv(N, BN)
    num_k = gl.cdiv(K, BK)
    width = GROUP_N * num_k
    first_n = (pid // width) * GROUP_N
    gsz = gl.minimum(num_n - first_n, GROUP_N)
    nt = first_n + (pid % width) % gsz
    kt = (pid % width) // gsz
    end = gl.minimum(gl.load(offs_ptr + e), M)
    start = gl.minimum(gl.maximum(gl.load(offs_ptr + e - 1, mask=e > 0, other=0), 0), end)
    first_full = gl.cdiv(start, SK) * SK
    last_full = (end // SK) * SK
    nk = gl.maximum((last_full - first_full) // SK, 0)
    return nt * BN, kt * BK, start, end, first_full, last_full, nk


@gluon.jit
def _wgrad_kernel(
    x_desc, y_desc, x_ptr, sx_ptr, y_ptr, sy_ptr, c_ptr, offs_ptr, f_desc, fpad_ptr, fb_ptr, next_ptr,
    M, N, K, E,
    stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syk, stride_syt, stride_ce, stride_cn, stride_fbr,
    BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, GROUP_N: gl.constexpr, MODE: gl.constexpr,
    U: gl.constexpr, SUBK: gl.constexpr, WS: gl.constexpr, num_warps: gl.constexpr, PERSIST: gl.constexpr = False,
):
    """dW[e] = X_e @ Y_e^T over the tokens of group e: X = dO^T [N, M], Y = A^T [K, M] fp8, token axis
    contiguous and scaled along it on the global 32-token grid; Y's scale is constant over the BK rows of a
    tile. A block straddling a group boundary has one scale for both groups; each group sums its own tokens.
    PERSIST (MODE 12, WS=1): one CTA per SM taking tiles from a queue (_wgrad_persistent); else one tile a CTA."""
    mma_layout: gl.constexpr = _mma_layout(BN, BK, num_warps)
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)

    if PERSIST:
        gl.static_assert(MODE == 12 and WS == 1, "the persistent wgrad runs MODE 12 with one consumer (WS=1)")
        _wgrad_persistent(x_desc, y_desc, x_ptr, sx_ptr, y_ptr, sy_ptr, c_ptr, offs_ptr, f_desc, fpad_ptr, fb_ptr,
                          next_ptr, M, N, K, E, stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syk, stride_syt,
                          stride_ce, stride_cn, stride_fbr, BN, BK, STAGES, GROUP_N, MODE, U, SUBK)
        return
    e = gl.program_id(1)
    n0, k0, start, end, first_full, last_full, nk = _wgrad_tile(gl.program_id(0), e, offs_ptr, M, N, K, BN, BK,
                                                                GROUP_N)
    syt_ptr = sy_ptr + k0 * stride_syk
    if WS == 2:
        # two independent consumer warpgroups (rows n0 + [0, 64) and n0 + [64, 128) of dO^T, each with its own
        # masked boundary steps and epilogue) and a TMA warp, as in the fprop/dgrad kernel
        HB: gl.constexpr = BN // 2
        a_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BN, SUBK * SK], x_desc.layout)
        b_bufs = gl.allocate_shared_memory(y_desc.dtype, [STAGES, BK, SUBK * SK], y_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        xm0 = gl.allocate_shared_memory(x_desc.dtype, [2, HB, SK], _step_smem_layout())  # each half's 2 blocks
        ym0 = gl.allocate_shared_memory(y_desc.dtype, [2, BK, SK], _step_smem_layout())
        xm1 = gl.allocate_shared_memory(x_desc.dtype, [2, HB, SK], _step_smem_layout())
        ym1 = gl.allocate_shared_memory(y_desc.dtype, [2, BK, SK], _step_smem_layout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        gl.warp_specialize([
            (_wgrad_half, (0, x_desc, y_desc, x_ptr, sx_ptr, y_ptr, syt_ptr, c_ptr, a_bufs, b_bufs, ready, empty,
                           xm0, ym0, e, n0, k0, start, end, first_full, last_full, nk,
                           N, K, stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syt, stride_ce, stride_cn,
                           BN, BK, STAGES, MODE, U, SUBK)),
            (_wgrad_half, (1, x_desc, y_desc, x_ptr, sx_ptr, y_ptr, syt_ptr, c_ptr, a_bufs, b_bufs, ready, empty,
                           xm1, ym1, e, n0, k0, start, end, first_full, last_full, nk,
                           N, K, stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syt, stride_ce, stride_cn,
                           BN, BK, STAGES, MODE, U, SUBK)),
            (_producer, (x_desc, y_desc, n0, k0, first_full, gl.cdiv(nk, SUBK), a_bufs, b_bufs, ready, empty,
                         STAGES, SUBK)),
        ], [4, 1], [240, 24])
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))
    else:
        rows = gl.minimum(n0 + gl.arange(0, BN, layout=row_layout), N - 1)
        sx_ptrs = sx_ptr + rows * stride_sxn
        acc = gl.zeros([BN, BK], gl.float32, mma_layout)
        f_off = 0
        if (MODE == 10) or (MODE == 11) or (MODE == 12):  # the group's column shift in the factor tables
            f_off = gl.load(fpad_ptr + e)
        fbt_ptr = None
        fb_off = 0
        if MODE == 12:  # the k-tile's row of Y's factor table, shifted as the group's columns are
            fbt_ptr = fb_ptr
            fb_off = (k0 // BK) * stride_fbr + f_off
        bnd = (x_ptr, y_ptr, sx_ptrs, syt_ptr, stride_xn, stride_yk, stride_sxt, stride_syt, n0, k0, start, end,
               first_full, last_full, N, K)
        acc = _run_mainloop(acc, x_desc, y_desc, n0, k0, first_full, nk, sx_ptrs, stride_sxt, syt_ptr, stride_syt,
                            BN, BK, STAGES, MODE, U, SUBK, WS, True, f_desc, f_off, fbt_ptr, fb_off, bnd)
        _store_wgrad(acc, c_ptr, e, n0, k0, N, K, stride_ce, stride_cn, BN, BK, num_warps)


@gluon.jit
def _wgrad_persistent(x_desc, y_desc, x_ptr, sx_ptr, y_ptr, sy_ptr, c_ptr, offs_ptr, f_desc, fpad_ptr, fb_ptr,
                      next_ptr, M, N, K, E, stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syk, stride_syt,
                      stride_ce, stride_cn, stride_fbr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                      GROUP_N: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr, SUBK: gl.constexpr):
    """Persistent MODE 12 wgrad: one CTA per SM; tile t = (group t // T, tile t % T of its dW), T tiles a group.
    A CTA starts at tile program_id and takes each next one from a global counter (num_programs + the counter's
    old value) when its TMA warp has issued the last stage of the current tile: groups of any size balance over
    the SMs as the hardware's block dispatch balanced the one-tile CTAs, while the TMA warp fills the ring for the
    next tile during the current tile's last stages, boundary blocks and store (the CTA launch, barrier set-up and
    ring fill that each one-tile CTA paid). The TMA warp hands each tile number to the consumer through a 2-slot
    shared ring with its own barriers; a number past the last tile ends both partitions."""
    a_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BN, SUBK * SK], x_desc.layout)
    b_bufs = gl.allocate_shared_memory(y_desc.dtype, [STAGES, BK, SUBK * SK], y_desc.layout)
    f_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BN, SUBK], f_desc.layout)
    xm_bufs = gl.allocate_shared_memory(x_desc.dtype, [2, BN, SK], _step_smem_layout())
    ym_bufs = gl.allocate_shared_memory(y_desc.dtype, [2, BK, SK], _step_smem_layout())
    tid_bufs = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    t_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    t_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(t_ready.index(i), count=1)
        mbarrier.init(t_free.index(i), count=1)
    T = gl.cdiv(N, BN) * gl.cdiv(K, BK)
    gl.warp_specialize([
        (_wgrad_persistent_consumer, (x_desc, y_desc, x_ptr, sx_ptr, y_ptr, sy_ptr, c_ptr, offs_ptr, fpad_ptr, fb_ptr,
                                      M, N, K, T, E * T, stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syk,
                                      stride_syt, stride_ce, stride_cn, stride_fbr, a_bufs, b_bufs, f_bufs, xm_bufs,
                                      ym_bufs, tid_bufs, ready, empty, t_ready, t_free, BN, BK, STAGES, GROUP_N,
                                      MODE, U, SUBK)),
        (_wgrad_persistent_producer, (x_desc, y_desc, f_desc, offs_ptr, fpad_ptr, next_ptr, M, N, K, T, E * T,
                                      a_bufs, b_bufs, f_bufs, tid_bufs, ready, empty, t_ready, t_free, BN, BK,
                                      STAGES, GROUP_N, SUBK)),
    ], [1], [40])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(t_ready.index(i))
        mbarrier.invalidate(t_free.index(i))


@gluon.jit
def _ring_put(bufs, t_ready, t_free, j, v):
    """TMA warp: v (about this CTA's j-th tile) into slot j % 2 of a 2-slot shared ring, once the consumer has read
    the slot's last."""
    slot = j % 2
    mbarrier.wait(t_free.index(slot), ((j // 2) & 1) ^ 1)
    bufs.index(slot).store(v)
    mbarrier.arrive(t_ready.index(slot))


@gluon.jit
def _ring_take(bufs, t_ready, t_free, j, lay: gl.constexpr):
    """Consumer: the ring's slot for this CTA's j-th tile, loaded in layout lay (the slot is free again after)."""
    slot = j % 2
    mbarrier.wait(t_ready.index(slot), (j // 2) & 1)
    v = bufs.index(slot).load(lay)
    mbarrier.arrive(t_free.index(slot))
    return v


@gluon.jit
def _put_ints(bufs, t_ready, t_free, j, v0, v1, v2, v3):
    """TMA warp: 4 int32 about this CTA's j-th tile into a [2, 4] ring."""
    lay: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    i = gl.arange(0, 4, layout=lay)
    _ring_put(bufs, t_ready, t_free, j, gl.where(i == 0, v0, gl.where(i == 1, v1, gl.where(i == 2, v2, v3))))


@gluon.jit
def _take_ints(bufs, t_ready, t_free, j):
    """Consumer: the 4 int32 of this CTA's j-th tile (each thread loads all 4: the picks move no data)."""
    lay: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    v = _ring_take(bufs, t_ready, t_free, j, lay)
    i = gl.arange(0, 4, layout=lay)
    return (gl.sum(gl.where(i == 0, v, 0), axis=0), gl.sum(gl.where(i == 1, v, 0), axis=0),
            gl.sum(gl.where(i == 2, v, 0), axis=0), gl.sum(gl.where(i == 3, v, 0), axis=0))


@gluon.jit
def _put_tile(tid_bufs, t_ready, t_free, j, t):
    """TMA warp: tile number t is the j-th tile of this CTA ([2, 1] ring)."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    _ring_put(tid_bufs, t_ready, t_free, j, gl.full([1], t, gl.int32, lay))


@gluon.jit
def _take_tile(tid_bufs, t_ready, t_free, j):
    """Consumer: the number of this CTA's j-th tile."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.max(_ring_take(tid_bufs, t_ready, t_free, j, lay), axis=0)


@gluon.jit
def _wgrad_persistent_producer(x_desc, y_desc, f_desc, offs_ptr, fpad_ptr, next_ptr, M, N, K, T, n_tiles, a_bufs,
                               b_bufs, f_bufs, tid_bufs, ready, empty, t_ready, t_free, BN: gl.constexpr,
                               BK: gl.constexpr, STAGES: gl.constexpr, GROUP_N: gl.constexpr, SUBK: gl.constexpr):
    g = 0  # stages issued so far (all tiles)
    j = 0  # tiles taken so far
    t = gl.program_id(0)
    while t < n_tiles:
        _put_tile(tid_bufs, t_ready, t_free, j, t)
        e = t // T
        n0, k0, start, end, first_full, last_full, nk = _wgrad_tile(t % T, e, offs_ptr, M, N, K, BN, BK, GROUP_N)
        f_off = gl.load(fpad_ptr + e)
        n_st = gl.cdiv(nk, SUBK)
        for st in range(n_st):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            _issue_load(x_desc, y_desc, n0, k0, first_full + st * (SUBK * SK), ready.index(s), a_bufs.index(s),
                        b_bufs.index(s), True, f_desc, f_bufs, f_off, s)
            g += 1
        g = _pad_round(g, n_st, ready, empty, STAGES, True)
        t = gl.num_programs(0) + gl.atomic_add(next_ptr, 1)
        j += 1
    _put_tile(tid_bufs, t_ready, t_free, j, n_tiles)


@gluon.jit
def _wgrad_persistent_consumer(x_desc, y_desc, x_ptr, sx_ptr, y_ptr, sy_ptr, c_ptr, offs_ptr, fpad_ptr, fb_ptr,
                               M, N, K, T, n_tiles, stride_xn, stride_sxn, stride_sxt, stride_yk, stride_syk,
                               stride_syt, stride_ce, stride_cn, stride_fbr, a_bufs, b_bufs, f_bufs, xm_bufs,
                               ym_bufs, tid_bufs, ready, empty, t_ready, t_free, BN: gl.constexpr,
                               BK: gl.constexpr, STAGES: gl.constexpr, GROUP_N: gl.constexpr, MODE: gl.constexpr,
                               U: gl.constexpr, SUBK: gl.constexpr):
    mma_layout: gl.constexpr = _mma_layout(BN, BK, gl.num_warps())
    n_done = 0  # ring stages consumed so far (all tiles)
    j = 0
    t = _take_tile(tid_bufs, t_ready, t_free, j)
    while t < n_tiles:
        e = t // T
        n0, k0, start, end, first_full, last_full, nk = _wgrad_tile(t % T, e, offs_ptr, M, N, K, BN, BK, GROUP_N)
        rows = gl.minimum(n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma_layout)), N - 1)
        sx_ptrs = sx_ptr + rows * stride_sxn
        syt_ptr = sy_ptr + k0 * stride_syk
        fb_off = (k0 // BK) * stride_fbr + gl.load(fpad_ptr + e)
        acc = gl.zeros([BN, BK], gl.float32, mma_layout)
        bnd = (x_ptr, y_ptr, sx_ptrs, syt_ptr, stride_xn, stride_yk, stride_sxt, stride_syt, n0, k0, start, end,
               first_full, last_full, N, K)
        acc = _boundary_steps(acc, bnd, xm_bufs, ym_bufs, BN, BK)
        acc = _mainloop(acc, x_desc, y_desc, n0, k0, first_full, nk, sx_ptrs, stride_sxt, syt_ptr, stride_syt,
                        a_bufs, b_bufs, ready, empty, STAGES, MODE, U, SUBK, True, 0, 0, True, n_done, f_bufs,
                        fb_ptr, fb_off)
        n_st = gl.cdiv(nk, SUBK)
        n_done = _pad_round(n_done + n_st, n_st, ready, empty, STAGES, False)
        _store_wgrad(acc, c_ptr, e, n0, k0, N, K, stride_ce, stride_cn, BN, BK, gl.num_warps())
        j += 1
        t = _take_tile(tid_bufs, t_ready, t_free, j)


@gluon.jit
def _store_wgrad(acc, c_ptr, e, n0, k0, N, K, stride_ce, stride_cn, BN: gl.constexpr, BK: gl.constexpr,
                 num_warps: gl.constexpr):
    st_layout: gl.constexpr = _store_layout(BK, c_ptr.dtype.element_ty.primitive_bitwidth, num_warps)
    out = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), st_layout)
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, st_layout))
    offs_k = k0 + gl.arange(0, BK, layout=gl.SliceLayout(0, st_layout))
    cmask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(offs_k < K, 0)
    gl.store(c_ptr + e * stride_ce + gl.expand_dims(offs_n, 1) * stride_cn + gl.expand_dims(offs_k, 0), out,
             mask=cmask)


@gluon.jit
def _wgrad_half(idx: gl.constexpr, x_desc, y_desc, x_ptr, sx_ptr, y_ptr, syt_ptr, c_ptr, a_bufs, b_bufs, ready,
                empty, xm_bufs, ym_bufs, e, n0, k0, start, end, first_full, last_full, nk, N, K, stride_xn,
                stride_sxn, stride_sxt, stride_yk, stride_syt, stride_ce, stride_cn, BN: gl.constexpr,
                BK: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr, U: gl.constexpr, SUBK: gl.constexpr):
    """WS=2 wgrad consumer: rows n0 + idx*BN/2 + [0, BN/2) of dW[e]'s tile, boundary steps included."""
    HB: gl.constexpr = BN // 2
    mma_layout: gl.constexpr = _mma_layout(HB, BK, 4)
    nh = n0 + idx * HB
    rows = gl.minimum(nh + gl.arange(0, HB, layout=gl.SliceLayout(1, mma_layout)), N - 1)
    sx_ptrs = sx_ptr + rows * stride_sxn
    acc = gl.zeros([HB, BK], gl.float32, mma_layout)
    bnd = (x_ptr, y_ptr, sx_ptrs, syt_ptr, stride_xn, stride_yk, stride_sxt, stride_syt, nh, k0, start, end,
           first_full, last_full, N, K)
    acc = _boundary_steps(acc, bnd, xm_bufs, ym_bufs, HB, BK)
    acc = _mainloop(acc, x_desc, y_desc, n0, k0, first_full, nk, sx_ptrs, stride_sxt, syt_ptr, stride_syt, a_bufs,
                    b_bufs, ready, empty, STAGES, MODE, U, SUBK, True, idx * HB, HB, True)
    _store_wgrad(acc, c_ptr, e, nh, k0, N, K, stride_ce, stride_cn, HB, BK, 4)


# ------------------------------------------------------------------------------------------ launchers
# (BM, BN, STAGES, GROUP_M, MODE, U, SUBK, num_warps); wgrad reads (BN, BK, ...) the same way.
# MODE/U/SUBK: _mainloop; a TMA stage holds SUBK steps of 32 along the reduction axis.
# An optional 9th entry WS: 0 = no warp specialization (the kernel's warps refill the TMA ring themselves),
# 1 = a 1-warp TMA producer partition + the mainloop in the num_warps default partition, 2 (BM|BN = 128,
# num_warps = 4) = two independent 4-warp consumers (64 rows each) + the producer. An optional 10th entry
# = the persistent grid: fprop/dgrad (WS=2, or WS=1 with BM = 128 and 8 warps, with MODE 3-6/10-12; tiles dealt out
# pid, pid + grid, ...), wgrad (MODE 12, WS=1, 8 warps; tiles taken from a queue: _wgrad_persistent). MODE 10
# (fprop/dgrad: persistent only; wgrad: WS=1 only) and MODE 11 (MODE 6's static ring with MODE 10's factors;
# persistent only): see _mainloop.
# Defaults (session 25, H100; benchmarks/results/issue10_s25/NOTE.md): MODE 12 for all three GEMMs: the static
# ring with A's factors through shared memory (MODE 11) and B's factors as fp32 from a [tiles, steps] table, one
# 8-warp consumer; fprop/dgrad on the persistent grid. MODE 11 fprop/dgrad was +3 to +15% over session 14's MODE 5
# with two 4-warp consumers in every cell of three runs; MODE 12 +0.7 to +5.8% over MODE 11 (fprop/dgrad) and over
# session 24's MODE 10 wgrad in all 18 cells of one run. Session 26: wgrad on the persistent grid with a tile queue,
# +2.6 to +4.2% over the one-tile grid in all six wgrad cells of three runs (benchmarks/results/issue10_s26/
# NOTE.md). MODE 3-6, 10 and 11 on scales that cannot be read as words run MODE 2 (_mode3_fallback); MODE 12 runs
# on any scale strides.
DEFAULT_CONFIG = (128, 128, 4, 8, 12, 16, 4, 8, 1, 1, 1)
WGRAD_DEFAULT_CONFIG = (128, 128, 4, 8, 12, 16, 4, 8, 1, 1)
COL_TILE = 128  # the scale tile of B the kernels rely on (BN of fprop/dgrad, BK of wgrad)
# The wgrad's tile order walks GROUP_N row tiles of dW (dO^T's rows) before the next column tile. Session 43 (one
# H200, benchmarks/results/issue10_s43/NOTE.md): with every row tile in one band the wgrad ran +0.7 to +2.5% at
# steady state at N = 2048 and 2816 (16 and 22 row tiles; that band of dO^T, <= 23 MB an expert, fits the L2), by
# clock: fewer DRAM bytes, less power at the cap (round-robin at the cap: no difference). At N = 7168 (56 tiles,
# 58 MB a band) bands of 32 lost 1.6% and of 64 5-7%, so 8 stays there.
WGRAD_BAND_ROWS = 3072  # the largest N whose row tiles all go in one band (measured at 2048, 2816)
WGRAD_BAND_GROUP_N = 32  # GROUP_N >= N / BN: one band (the tile order clamps the last band to the tiles left)


def wgrad_default_config(N):
    """The wgrad config a launch without one runs for dW with N rows: WGRAD_DEFAULT_CONFIG, with all row tiles in
    one band of the tile order where N <= WGRAD_BAND_ROWS."""
    if N <= WGRAD_BAND_ROWS:
        return WGRAD_DEFAULT_CONFIG[:3] + (WGRAD_BAND_GROUP_N,) + WGRAD_DEFAULT_CONFIG[4:]
    return WGRAD_DEFAULT_CONFIG


@triton.jit
def _e8m0_bits(b):
    """int32 E8M0 bytes -> the bits of their fp32 factor, as _e8m0_to_f32 (0 -> 2^-127, 255 -> NaN)."""
    return (b << 23) | ((((b - 1) | (b + 1)) & 0x100) << 14)


@triton.jit
def _e8m0_table_kernel(s_ptr, o_ptr, R, C, stride_r, stride_c, stride_o, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)[:, None]
    c = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    m = (r < R) & (c < C)
    b = tl.load(s_ptr + r.to(tl.int64) * stride_r + c * stride_c, mask=m, other=127).to(tl.int32)
    tl.store(o_ptr + r.to(tl.int64) * stride_o + c, _e8m0_bits(b).to(tl.float32, bitcast=True), mask=m)


def e8m0_table(s):
    """E8M0 scales [rows, steps] (uint8, any strides) -> their fp32 factors 2^(b-127), bit for bit the kernels'
    decode, as a [rows, steps] view whose row stride is a multiple of 4 (16 bytes: a TMA operand). MODE 10 loads
    a stage's [rows, 4] box of it with the operands."""
    import torch

    R, C = s.shape
    cp = (C + 3) // 4 * 4
    out = torch.empty(R, cp, dtype=torch.float32, device=s.device)
    if out.numel():
        _e8m0_table_kernel[(triton.cdiv(R, 32), triton.cdiv(C, 64))](s, out, R, C, s.stride(0), s.stride(1), cp,
                                                                    BR=32, BC=64)
    return out[:, :C]


@triton.jit
def _e8m0_group_table_kernel(s_ptr, o_ptr, pad_ptr, offs_ptr, R, M, E, C_OUT, stride_r, stride_c, BR: tl.constexpr,
                             BC: tl.constexpr, SKB: tl.constexpr):
    """Program (row block, group e): the factors of group e's full 32-token steps [ceil(start/32), end // 32),
    written at columns shifted by pad[e] so that the group's first full step lands on a multiple of 4."""
    e = tl.program_id(1)
    pad = 0
    first = 0
    last = 0
    for i in range(0, E):  # pad[i] = pad[i-1] + what aligns group i's first full step; keep i = e's
        # group i's tokens clamped exactly as the wgrad kernel clamps them (_wgrad_tile), so that its first full
        # step lands on an aligned column whatever offs holds (monotone offs: the groups' columns never overlap)
        end_i = tl.minimum(tl.load(offs_ptr + i), M)
        start_i = tl.minimum(tl.maximum(tl.load(offs_ptr + i - 1, mask=i > 0, other=0), 0), end_i)
        first_i = (start_i + SKB - 1) // SKB
        pad_i = pad + (4 - (first_i + pad) % 4) % 4
        upto = (i <= e).to(tl.int32)  # (arithmetic blends, not tl.where: scalars stay scalars for range())
        here = (i == e).to(tl.int32)
        pad = pad + upto * (pad_i - pad)
        first = first + here * (first_i - first)
        last = last + here * (end_i // SKB - last)
    if tl.program_id(0) == 0:
        tl.store(pad_ptr + e, pad)
    r = tl.program_id(0) * BR + tl.arange(0, BR)[:, None]
    for c0 in range(first, last, BC):
        c = c0 + tl.arange(0, BC)[None, :]
        m = (r < R) & (c < last)
        b = tl.load(s_ptr + r.to(tl.int64) * stride_r + c * stride_c, mask=m, other=127).to(tl.int32)
        tl.store(o_ptr + r.to(tl.int64) * C_OUT + c + pad, _e8m0_bits(b).to(tl.float32, bitcast=True), mask=m)


def e8m0_group_table(s, offs, tokens):
    """wgrad's E8M0 scales [rows, tokens / 32] -> (fp32 factors with every group's full steps shifted right by
    pad[e] columns so that each group starts on a 16-byte column (a TMA box start), pad [E] int32). The groups'
    boundaries are clamped as the kernel clamps them (offs, tokens); the columns between groups are unused."""
    import torch

    R, C = s.shape
    E = offs.shape[0]
    c_out = (C + 3 * E + 3) // 4 * 4
    out = torch.empty(R, c_out, dtype=torch.float32, device=s.device)
    pad = torch.empty(E, dtype=torch.int32, device=s.device)
    if E and R:
        _e8m0_group_table_kernel[(triton.cdiv(R, 32), E)](s, out, pad, offs, R, tokens, E, c_out, s.stride(0),
                                                          s.stride(1), BR=32, BC=64, SKB=SK.value)
    return out, pad


def _padded(table):
    """MODE 12's B-factor table with one more stage (4 columns) per row: the kernel loads each stage's 4 factors one
    stage ahead without a mask, so the load past a tile's last stage must stay inside the table. Rows stay a
    multiple of 4 columns (16-byte aligned loads)."""
    import torch

    return torch.nn.functional.pad(table, (0, -table.shape[1] % 4 + 4))


def _factor_desc(table, rows):
    """MODE 10: a TMA descriptor over a factor table (e8m0_table / e8m0_group_table) with [rows, 4] boxes (one
    stage of 4 steps per row)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return TensorDescriptor.from_tensor(table, [rows, 4], layout)


def _fail(who, msg):
    raise ValueError(f"{who}: {msg}")


def check_device(who, *tensors):
    """The Gluon kernels are sm_90 code (wgmma + TMA); anything else is refused with one line."""
    import torch

    for t in tensors:
        if not t.is_cuda:
            _fail(who, f"backend='gluon' needs CUDA tensors on an sm_90 (Hopper) GPU, got a {t.device} tensor")
    cap = torch.cuda.get_device_capability(tensors[0].device)
    if cap != (9, 0):
        _fail(who, f"backend='gluon' runs on sm_90 (Hopper) only; this GPU is sm_{cap[0]}{cap[1]}")


def _desc(t2d, block):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)
    return TensorDescriptor.from_tensor(t2d, block, layout)


def _tma_operand(who, name, t):
    # TMA: 16-byte aligned base and row stride, contiguous rows
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 16 for s in t.stride()[:-1]):
        _fail(who, f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) is not TMA-compatible: needs "
                   f"contiguous rows, 16-byte aligned base and row strides")


def _split_config(config):
    """A launch config -> (its first 8 entries, WS); WS (the optional 9th entry) defaults to 0. An optional 10th
    entry (fprop/dgrad, WS=2 or 8-warp WS=1, MODE 3-6) asks for the persistent grid: see launch_nt; an 11th
    (fprop/dgrad) for the storer partition: _epi."""
    return tuple(config[:8]), int(config[8]) if len(config) > 8 else 0


def _persist(config):
    return bool(config[9]) if config is not None and len(config) > 9 else False


def _epi(config):
    """The optional 11th entry (fprop/dgrad, persistent MODE 12 with one 8-warp consumer): the epilogue runs in a
    2-warp storer partition (_storer_persistent) instead of the consumer."""
    return bool(config[10]) if config is not None and len(config) > 10 else False


def _words_ok(*scales):
    """MODE 3/4 read 4 scale bytes as one int32: every scale tensor needs a 4-byte aligned base, contiguous steps
    and 4-byte aligned row strides."""
    return all(t.data_ptr() % 4 == 0 and t.stride(-1) == 1 and all(st % 4 == 0 for st in t.stride()[:-1])
               for t in scales)


def _mode3_fallback(cfg, *scales):
    """MODE 3-6, 10 and 11 on scales they cannot read as words run MODE 2 (U = 8) with the same tiles and ring.
    MODE 12 reads no scale words (both factors come from the launcher's tables, which take any strides; the
    boundary and synchronous steps load single bytes): it runs on any scales, e.g. the MoE path's token-major
    scales [C, P/32] with strides (1, C), which sent the layer's wgrad to MODE 2 on the one-tile grid until
    session 26."""
    if cfg[4] in (3, 4, 5, 6, 10, 11) and not _words_ok(*scales):
        return cfg[:4] + (2, 8) + cfg[6:]
    return cfg


def _ws_launch(ws, warps):
    """WS adds a 1-warp producer partition (WS=2 also a second 4-warp consumer), each occupying a warpgroup's
    register share: cap the launch at 65536 registers over all warps; the producer drops to 24 registers and
    the consumers get the rest."""
    total = warps + 4 * ws
    return {"maxnreg": (65536 // (total * 32)) // 8 * 8} if ws else {}


def launch_nt(a, sa, b, sb, offs, out_dtype, config=None):
    """out[g] = A[g] @ B[e]^T (fprop/dgrad): A [M, R], B [E, C, R] contiguous, sa [M, R/32] and sb [E, C, R/32]
    as strided views; B's scale constant over 128-row tiles (declared by the caller)."""
    import torch

    from .nt_output import nt_output

    who = "mxfp8 grouped GEMM (gluon)"
    M, R = a.shape
    E, C, _ = b.shape
    out, done = nt_output(a, b, out_dtype)
    if done:
        return out
    check_device(who, a, b, sa, sb, offs)
    (BM, BN, STAGES, GROUP_M, MODE, U, SUBK, warps), WS = _split_config(config or DEFAULT_CONFIG)
    BM, BN, STAGES, GROUP_M, MODE, U, SUBK, warps = _mode3_fallback((BM, BN, STAGES, GROUP_M, MODE, U, SUBK, warps),
                                                                    sa, sb)
    if BN != COL_TILE:
        _fail(who, f"BN={BN}: the tiled weight scale is read per {COL_TILE}-row tile")
    if WS == 2 and (BM != 128 or warps != 4):
        _fail(who, f"WS=2 runs two 4-warp consumers on a 128-row tile; got BM={BM}, num_warps={warps}")
    b2 = b.reshape(E * C, R)
    _tma_operand(who, "A", a)
    _tma_operand(who, "B", b2)
    num_m = (M + BM - 1) // BM + E + 1  # each group adds at most one partial tile; then the padding rows
    grid = (num_m * ((C + BN - 1) // BN),)
    # persistent grid (asked for by the config) for MODE 3-6/10/11 with WS; else the plain grid
    persist = _persist(config or DEFAULT_CONFIG) and (WS == 2 or (WS == 1 and warps == 8 and BM == 128)) and (
        MODE in (3, 4, 5, 6, 10, 11, 12))
    if persist:
        grid = (min(grid[0], torch.cuda.get_device_properties(a.device).multi_processor_count),)
    f_desc, fb, stride_fbr = None, sb, 0
    if MODE == 12 and not (persist and WS == 1):
        _fail(who, f"MODE 12 runs with one 8-warp consumer (WS=1) on the persistent grid only; config {tuple(config)}")
    if MODE == 12:  # B's factors: one row per 128-row weight tile (its first row's scales), fp32
        fb = _padded(e8m0_table(sb[:, ::COL_TILE, :].reshape(-1, sb.shape[2])))
        stride_fbr = fb.stride(0)
    if MODE in (10, 11, 12):
        if not persist:
            _fail(who, f"MODE {MODE} (A's factors by TMA) runs on the persistent grid only: config {tuple(config)} "
                       f"needs a 10th entry 1 and WS=2, or WS=1 with 8 warps and BM=128")
        f_desc = _factor_desc(e8m0_table(sa), BM)
    epi = _epi(config or DEFAULT_CONFIG)
    if epi and not (MODE == 12 and f_desc is not None and WS == 1):
        _fail(who, f"the storer partition (11th config entry) runs with MODE 12 and one 8-warp consumer on the "
                   f"persistent grid; got {tuple(config)}")
    _nt_grouped_kernel[grid](
        _desc(a, [BM, SUBK * SK.value]), _desc(b2, [BN, SUBK * SK.value]), sa, sb, out, offs, f_desc, fb,
        M, C, R, num_m,
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1), sb.stride(2), out.stride(0), stride_fbr,
        BM=BM, BN=BN, STAGES=STAGES, GROUP_M=GROUP_M, E=E, MODE=MODE, U=U, SUBK=SUBK, WS=WS, num_warps=warps,
        PERSIST=persist, EPI=epi, **_ws_launch(WS, warps),
    )
    return out


def launch_wgrad(x, sx, y, sy, offs, out_dtype, config=None):
    """dW[e] = X_e @ Y_e^T: X = dO^T [N, M], Y = A^T [K, M] (token axis contiguous), sx [N, M/32], sy [K, M/32];
    Y's scale constant over 128-row tiles (declared by the caller)."""
    import torch

    who = "mxfp8 grouped wgrad (gluon)"
    N, M = x.shape
    K = y.shape[0]
    E = offs.shape[0]
    out = torch.empty(E, N, K, dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    if M == 0:
        return out.zero_()
    check_device(who, x, y, sx, sy, offs)
    config = config or wgrad_default_config(N)
    (BN, BK, STAGES, GROUP_N, MODE, U, SUBK, warps), WS = _split_config(config)
    persist = _persist(config)
    if persist and not (MODE == 12 and WS == 1 and warps == 8):
        # sessions 24/25's persistent wgrads (MODE 10/11, tiles dealt out statically) measured 0.93-0.99x the
        # plain grid (benchmarks/results/issue10_s25/call3) and are gone; session 26's takes tiles from a queue
        _fail(who, f"the persistent wgrad grid (10th config entry) runs MODE 12 with one 8-warp consumer (WS=1); "
                   f"got {tuple(config)}")
    BN, BK, STAGES, GROUP_N, MODE, U, SUBK, warps = _mode3_fallback((BN, BK, STAGES, GROUP_N, MODE, U, SUBK, warps),
                                                                    sx, sy)
    persist = persist and MODE == 12  # (scales that cannot be read as words: MODE 2 on the one-tile grid)
    if BK != COL_TILE:
        _fail(who, f"BK={BK}: the tiled x^T scale is read per {COL_TILE}-row tile")
    if WS == 2 and (BN != 128 or warps != 4):
        _fail(who, f"WS=2 runs two 4-warp consumers on a 128-row tile; got BN={BN}, num_warps={warps}")
    _tma_operand(who, "dO^T", x)
    _tma_operand(who, "A^T", y)
    grid = (((N + BN - 1) // BN) * ((K + BK - 1) // BK), E)
    next_tile = offs  # (unread without PERSIST)
    if persist:  # one CTA per SM; tiles past the first from a counter (_wgrad_persistent)
        grid = (min(grid[0] * E, torch.cuda.get_device_properties(x.device).multi_processor_count),)
        next_tile = torch.zeros(1, dtype=torch.int32, device=x.device)
    f_desc = f_pad = None
    fb, stride_fbr = sy, 0
    if MODE in (10, 11, 12):
        if WS != 1:
            _fail(who, f"MODE {MODE} (A's factors by TMA) runs with one consumer partition (WS=1) only")
        table, f_pad = e8m0_group_table(sx, offs, M)
        f_desc = _factor_desc(table, BN)
    if MODE == 12:  # Y's factors: one row per 128-row tile of A^T (its first row's scales), groups shifted alike
        fb = _padded(e8m0_group_table(sy[::COL_TILE], offs, M)[0])
        stride_fbr = fb.stride(0)
    _wgrad_kernel[grid](
        _desc(x, [BN, SUBK * SK.value]), _desc(y, [BK, SUBK * SK.value]), x, sx, y, sy, out, offs, f_desc, f_pad, fb,
        next_tile, M, N, K, E,
        x.stride(0), sx.stride(0), sx.stride(1), y.stride(0), sy.stride(0), sy.stride(1),
        out.stride(0), out.stride(1), stride_fbr,
        BN=BN, BK=BK, STAGES=STAGES, GROUP_N=GROUP_N, MODE=MODE, U=U, SUBK=SUBK, WS=WS, num_warps=warps,
        PERSIST=persist, **_ws_launch(WS, warps),
    )
    return out


def compile_sm90(kernel, config=None, out_dtype="bf16", with_cubin=False):
    """Compile one of the kernels for sm_90a without a GPU (ptxas ships with triton): ("nt" | "wgrad",
    config) -> (ptx, ptxas -v log + the shared memory size). Used by the CPU test that guards the wgmma pipelining: the log must not
    report serialized wgmmas (C751x) or spills, and the PTX must wait with one wgmma still in flight.
    with_cubin: also return the cubin bytes (benchmarks/gluon_sass_count.py disassembles them)."""
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(shape):
        lay = gl.NVMMASharedLayout.get_default_for(shape, gl.float8e4nv)
        return f"tensordesc<fp8e4nv[{shape[0]}, {shape[1]}],{lay!r}>"

    mode = (config or (DEFAULT_CONFIG if kernel == "nt" else WGRAD_DEFAULT_CONFIG))[4]
    sig_f10 = mode in (10, 11, 12)
    fb_sig = "*fp32" if mode == 12 else "*u8"  # MODE 12: B's factor table (else the scales, unread)

    def fdesc(rows):  # MODE 10's factor boxes (_factor_desc); "constexpr" = None otherwise
        if not sig_f10:
            return "constexpr"
        lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        return f"tensordesc<fp32[{rows}, 4],{lay!r}>"

    i32 = "i32"
    if kernel == "nt":
        (BM, BN, STAGES, GROUP, MODE, U, SUBK, warps), WS = _split_config(config or DEFAULT_CONFIG)
        sig = dict(a_desc=desc([BM, SUBK * SK.value]), b_desc=desc([BN, SUBK * SK.value]), sa_ptr="*u8", sb_ptr="*u8",
                   c_ptr="*" + out_dtype, offs_ptr="*i32", f_desc=fdesc(BM), fb_ptr=fb_sig, M=i32, N=i32, K=i32,
                   NUM_M_TILES=i32, stride_sam=i32, stride_sak=i32, stride_sbe=i32, stride_sbn=i32, stride_sbk=i32,
                   stride_cm=i32, stride_fbr=i32)
        cx = dict(BM=BM, BN=BN, STAGES=STAGES, GROUP_M=GROUP, E=8, MODE=MODE, U=U, SUBK=SUBK, WS=WS,
                  num_warps=warps, PERSIST=_persist(config or DEFAULT_CONFIG), EPI=_epi(config or DEFAULT_CONFIG))
        fn = _nt_grouped_kernel
    else:
        (BN, BK, STAGES, GROUP, MODE, U, SUBK, warps), WS = _split_config(config or WGRAD_DEFAULT_CONFIG)
        sig = dict(x_desc=desc([BN, SUBK * SK.value]), y_desc=desc([BK, SUBK * SK.value]), x_ptr="*fp8e4nv", sx_ptr="*u8",
                   y_ptr="*fp8e4nv", sy_ptr="*u8", c_ptr="*" + out_dtype, offs_ptr="*i32", f_desc=fdesc(BN),
                   fpad_ptr="*i32" if sig_f10 else "constexpr", fb_ptr=fb_sig, next_ptr="*i32", M=i32,
                   N=i32, K=i32, E=i32,
                   stride_xn=i32, stride_sxn=i32, stride_sxt=i32, stride_yk=i32, stride_syk=i32, stride_syt=i32,
                   stride_ce=i32, stride_cn=i32, stride_fbr=i32)
        cx = dict(BN=BN, BK=BK, STAGES=STAGES, GROUP_N=GROUP, MODE=MODE, U=U, SUBK=SUBK, WS=WS, num_warps=warps,
                  PERSIST=_persist(config or WGRAD_DEFAULT_CONFIG))
        fn = _wgrad_kernel
    if sig["f_desc"] == "constexpr":
        cx["f_desc"] = None
    if sig.get("fpad_ptr") == "constexpr":
        cx["fpad_ptr"] = None
    for k in cx:
        sig[k] = "constexpr"
    # MODE 12's B-factor table: 16-byte aligned, as the launch specializes it (its 16-byte loads depend on it)
    attrs = {(fn.arg_names.index("fb_ptr"), ): [["tt.divisibility", 16]]} if mode == 12 else None
    compiled = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, **_ws_launch(cx["WS"], warps)))
    ptx = compiled.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True)
        with open(os.path.join(d, "k.cubin"), "rb") as f:
            cubin = f.read()
    log = log.stdout + log.stderr + f"\nshared memory: {compiled.metadata.shared} bytes\n"
    return (ptx, log, cubin) if with_cubin else (ptx, log)
