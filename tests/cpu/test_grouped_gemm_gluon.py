"""Gluon backend of the MXFP8 grouped GEMMs on CPU: dispatch and refusals (the interpreter does not run Gluon's
wgmma/TMA), plus a compile-only check of the kernels for sm_90a with triton's bundled ptxas: the mainloop
must keep a wgmma in flight while it promotes (wait_group 1), without spills and without ptxas serializing
the wgmmas (its C7510-C7520 "Potential Performance Loss" notes). The numbers are checked on the GPU
(tests/gpu/test_grouped_gemm_gluon_gpu.py)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad, mxfp8_grouped_mm_fprop, mxfp8_grouped_mm_wgrad
from kernels.grouped_gemm.quant import to_mxfp8_blocked


def _operands(wtile=128):
    M, K, N, E = 96, 128, 128, 2
    ad, as_ = to_mxfp8_blocked(torch.randn(M, K), -1, 32, 1)
    wd, ws = to_mxfp8_blocked(torch.randn(E, N, K), -1, 32, wtile)
    offs = torch.tensor([40, 96], dtype=torch.int32)
    return ad, as_, wd, ws, offs


def test_unknown_backend_raises_naming_it():
    ad, as_, wd, ws, offs = _operands()
    with pytest.raises(ValueError, match="backend='cutlas'"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, w_tile=128, backend="cutlas")


def test_gluon_needs_tiled_scales():
    ad, as_, wd, ws, offs = _operands(wtile=1)
    with pytest.raises(ValueError, match="w_tile=1"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, backend="gluon")
    wtd, wts = to_mxfp8_blocked(torch.randn(2, 128, 128), -1, 32, 1)
    dd, ds = to_mxfp8_blocked(torch.randn(96, 128), -1, 32, 1)
    with pytest.raises(ValueError, match="w_tile=1"):
        mxfp8_grouped_mm_dgrad(dd, ds, wtd.transpose(1, 2), wts.transpose(1, 2), offs, backend="gluon")
    xt, xs = to_mxfp8_blocked(torch.randn(128, 96), -1, 32, 1)
    with pytest.raises(ValueError, match="a_tile=1"):
        mxfp8_grouped_mm_wgrad(xt, xs, xt, xs, offs, backend="gluon")


def test_gluon_refuses_cpu_tensors_instead_of_falling_back():
    ad, as_, wd, ws, offs = _operands()
    with pytest.raises(ValueError, match="Gluon kernels need a CUDA device"):
        mxfp8_grouped_mm_fprop(ad, as_, wd, ws, offs, w_tile=128, backend="gluon", validate=False)
    xt, xs = to_mxfp8_blocked(torch.randn(128, 96), -1, 32, 128)
    with pytest.raises(ValueError, match="Gluon kernels need a CUDA device"):
        mxfp8_grouped_mm_wgrad(xt, xs, xt, xs, offs, a_tile=128, backend="gluon", validate=False)


# candidates of 2026-11-25: MODE 5 = MODE 4 with the stage-wise E8M0 decode (one PRMT per step), MODE 6 = the static
# ring (MODE 3) with it; WS=1 with 8 warps = one consumer partition running the same mainloop code on both
# warpgroups (one copy: half the instruction-cache footprint of WS=2), persistent or not
# MODE 10 (session 24): A's factors (fp32, e8m0_table / e8m0_group_table) through shared memory with each stage
NEW_NT = [(128, 128, 4, 8, 5, 8, 4, 4, 2, 1), (128, 128, 4, 8, 5, 8, 4, 4, 2), (128, 128, 4, 8, 5, 8, 4, 8, 1, 1),
          (128, 128, 4, 8, 5, 16, 4, 8, 1, 1), (128, 128, 4, 8, 6, 16, 4, 8, 1, 1), (128, 128, 4, 8, 6, 16, 4, 8, 1),
          (128, 128, 4, 8, 10, 8, 4, 4, 2, 1), (128, 128, 4, 8, 10, 8, 4, 8, 1, 1),
          (128, 128, 4, 8, 11, 16, 4, 8, 1, 1),  # MODE 11 = MODE 6's static ring with MODE 10's factors
          (128, 128, 4, 8, 12, 16, 4, 8, 1, 1),  # MODE 12 = MODE 11 with B's factors as fp32 (no decode left)
          (128, 128, 4, 8, 12, 16, 4, 8, 1, 1, 1)]  # + the storer partition and the tile ring (the default)
NEW_WGRAD = [(128, 128, 4, 8, 5, 8, 4, 4, 2), (128, 128, 4, 8, 5, 8, 4, 8, 1), (128, 128, 4, 8, 5, 16, 4, 8, 1),
             (128, 128, 4, 8, 10, 16, 4, 8, 1),
             (128, 128, 4, 8, 11, 16, 4, 8, 1), (128, 128, 5, 8, 11, 16, 4, 8, 1),  # session 25: MODE 11, 4/5 stages
             (128, 128, 4, 8, 12, 16, 4, 8, 1),  # and MODE 12
             (128, 128, 4, 8, 12, 16, 4, 8, 1, 1)]  # session 26: MODE 12 on the persistent grid (a tile queue)


def _sync_config():
    """The default with MODE 0 (wait for every wgmma): the comparison schedule."""
    from kernels.grouped_gemm.gluon_mx import DEFAULT_CONFIG
    return DEFAULT_CONFIG[:4] + (0,) + DEFAULT_CONFIG[5:]


def _sm90_jobs():
    return ([("nt", None, "bf16"), ("wgrad", None, "fp32"), ("nt", _sync_config(), "bf16")]
            + [("nt", c, "bf16") for c in NEW_NT] + [("wgrad", c, "fp32") for c in NEW_WGRAD])


_COMPILE_ALL = """
import json, sys
sys.path.insert(0, sys.argv[3])
from kernels.grouped_gemm.gluon_mx import compile_sm90
worker, workers = int(sys.argv[4]), int(sys.argv[5])
for i, (kernel, config, out) in enumerate(json.load(open(sys.argv[1]))):
    if i % workers != worker:
        continue
    ptx, log = compile_sm90(kernel, tuple(config) if config else None, out)
    with open(f"{sys.argv[2]}/{i}.ptx", "w") as f:
        f.write(ptx)
    with open(f"{sys.argv[2]}/{i}.log", "w") as f:
        f.write(log)
"""


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    """(kernel, config, out dtype) -> (ptx, ptxas log) for every kernel this module checks, compiled for sm_90a in
    fresh processes without TRITON_INTERPRET (one per CPU core up to 4, each compiling every n-th job: a cold
    triton cache takes ~5 s a kernel, and pytest leaves the other cores idle meanwhile). Not in this process:
    triton 3.6's interpreter leaves triton.language.core's builtins patched after an interpreted kernel calls a
    @triton.jit helper (InterpretedFunction.__call__ patches and never restores), and a real compile after that
    fails inside gl.cdiv ("'block_argument' object has no attribute 'dtype'"): seen in full CPU runs with an empty
    triton cache, after tests/cpu/test_grouped_gemm.py's interpreted kernels (test_interpreter_leaves_core_patched pins the cause)."""
    jobs = _sm90_jobs()
    d = tmp_path_factory.mktemp("sm90")
    (d / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workers = max(1, min(4, len(os.sched_getaffinity(0)), len(jobs)))
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_ALL, str(d / "jobs.json"), str(d), root, str(w),
                               str(workers)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(workers)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=900)
            assert p.returncode == 0, err[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return {(k, tuple(c) if c else None, o): ((d / f"{i}.ptx").read_text(), (d / f"{i}.log").read_text())
            for i, (k, c, o) in enumerate(jobs)}


@triton.jit
def _block_max_kernel(p, BLOCK: tl.constexpr):
    # tl.max is a @triton.jit function of triton.language.standard, whose globals hold triton.language.core
    tl.store(p, tl.max(tl.load(p + tl.arange(0, BLOCK)), axis=0))


def test_interpreter_leaves_core_patched():
    """Why the fixture above compiles in a fresh process: an interpreted kernel that calls a triton.language
    library function (tl.max here; our kernels call many) changes triton.language.core for the rest of the process.
    If a triton release stops leaking, this fails and the subprocess can go."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the interpreter (CPU runs)")
    import triton.language.core as core

    before = dict(vars(core))
    t = torch.tensor([1.0, 5.0, -2.0, 3.0])
    _block_max_kernel[(1,)](t, BLOCK=4)
    assert t[0].item() == 5.0
    changed = [k for k, v in vars(core).items() if before.get(k) is not v]
    for k, v in before.items():  # put it back for the tests after this one
        setattr(core, k, v)
    assert changed, "triton's interpreter no longer leaks patches into triton.language.core"


@pytest.mark.parametrize("kernel,out", [("nt", "bf16"), ("wgrad", "fp32")])
def test_gluon_kernels_compile_for_sm90_with_wgmma_in_flight(sm90, kernel, out):
    ptx, log = sm90[(kernel, None, out)]
    assert "wgmma.mma_async" in ptx
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx), "no wgmma left in flight during promotion"
    assert "C75" not in log and "Potential Performance Loss" not in log, log
    assert "0 bytes spill stores" in log, log


def test_sync_schedule_never_waits_with_one_in_flight(sm90):
    """The guard above can fail: the comparison schedule (MODE 0) waits for every wgmma."""
    ptx, _ = sm90[("nt", _sync_config(), "bf16")]
    assert not re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)


@pytest.mark.parametrize("kernel,config", [("nt", c) for c in NEW_NT] + [("wgrad", c) for c in NEW_WGRAD])
def test_new_configs_compile_clean(sm90, kernel, config):
    ptx, log = sm90[(kernel, config, "bf16" if kernel == "nt" else "fp32")]
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 1;", ptx), "no wgmma left in flight during promotion"
    assert "C75" not in log and "Potential Performance Loss" not in log, log
    assert "0 bytes spill stores" in log, log
    if len(config) > 10:  # the storer partition: the consumer leaves each tile in shared memory by stmatrix
        assert "stmatrix" in ptx
    if config[4] == 12:  # both factors come as fp32: no decode left, B's 4 per stage in one 16-byte load
        assert "ld.global.v4.b32" in ptx or "ld.global.v4.f32" in ptx or "ld.global.nc.v4" in ptx, "B's factors"
        return
    # the per-step decode is one byte permute per scale word: selectors [hi_i, lo_i, 0, 0] for steps 0-3
    for i in range(4):
        assert "prmt.b32" in ptx and str((i << 12) | ((4 + i) << 8) | 0x88) in ptx, i


def test_stagewise_e8m0_decode_is_exact():
    """MODE 5/6's SWAR decode (mirrored in Python by e8m0_prep_reference) gives the bits of _e8m0_to_f32 for every
    byte value in every position of the word, next to every kind of neighbour (0, 255, 1, 254, random)."""
    import random

    from kernels.grouped_gemm.gluon_mx import e8m0_prep_reference

    def bits(b):  # _e8m0_to_f32
        return (b << 23) | ((((b - 1) | (b + 1)) & 0x100) << 14)

    assert bits(0) == 0x00400000 and bits(255) == 0x7FC00000 and bits(127) == 0x3F800000
    rng = random.Random(0)
    for pos in range(4):
        for b in range(256):
            for _ in range(24):
                word = [rng.choice([0, 255, 1, 254, 127, rng.randrange(256)]) for _ in range(4)]
                word[pos] = b
                w = sum(v << (8 * i) for i, v in enumerate(word))
                assert e8m0_prep_reference(w) == [bits(v) for v in word], (hex(w), pos)
    # signed int32 words (the kernel loads int32): the same bits
    assert e8m0_prep_reference(-1) == [0x7FC00000] * 4
    assert e8m0_prep_reference(0) == [0x00400000] * 4


def test_defaults_are_the_measured_configs():
    """The defaults are the configs measured fastest on the H100 (NOTES.md "Gluon mx32": MODE 12 for all three,
    session 25; wgrad on the persistent grid with a tile queue, session 26; fprop/dgrad with the storer partition,
    session 27); changing them needs a new measurement, so the test pins them."""
    from kernels.grouped_gemm.gluon_mx import DEFAULT_CONFIG, WGRAD_DEFAULT_CONFIG
    assert DEFAULT_CONFIG == (128, 128, 4, 8, 12, 16, 4, 8, 1, 1, 1)
    assert WGRAD_DEFAULT_CONFIG == (128, 128, 4, 8, 12, 16, 4, 8, 1, 1)


def test_wgrad_default_puts_short_dw_row_tiles_in_one_band():
    """Session 43 (H200): the wgrad's tile order with all row tiles of dW in one band (GROUP_N 32) ran faster at
    N = 2048 and 2816 and slower at 7168; a launch without a config gets the band up to N = 3072 and
    WGRAD_DEFAULT_CONFIG (GROUP_N 8) above, everything else unchanged."""
    from kernels.grouped_gemm.gluon_mx import WGRAD_DEFAULT_CONFIG, wgrad_default_config
    for n in (1, 128, 2048, 2816, 3072):
        c = wgrad_default_config(n)
        assert c[3] == 32 and c[3] * c[0] >= n and c[:3] + c[4:] == WGRAD_DEFAULT_CONFIG[:3] + WGRAD_DEFAULT_CONFIG[4:]
    for n in (3073, 4096, 7168):
        assert wgrad_default_config(n) == WGRAD_DEFAULT_CONFIG


def test_e8m0_table_is_the_kernels_decode_for_every_byte():
    """MODE 10's fp32 factor table (the launcher's one pass over the E8M0 scales) gives the bits of _e8m0_to_f32
    for all 256 bytes (0 -> 2^-127, 255 -> NaN), from a strided [rows, steps] view, with a 16-byte row stride
    (a TMA operand) whatever the step count."""
    import struct

    from kernels.grouped_gemm.gluon_mx import e8m0_table

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the table kernel in the interpreter (CPU)")
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    s = torch.stack([b, b.flip(0), b.roll(7)]).t()  # [256, 3], strides (1, 256)
    t = e8m0_table(s)
    assert t.shape == s.shape and t.stride(0) % 4 == 0 and t.stride(1) == 1
    bits = t.view(torch.int32)
    for i in range(256):
        for j in range(3):
            v = int(s[i, j])
            want = (v << 23) | ((((v - 1) | (v + 1)) & 0x100) << 14)
            assert int(bits[i, j]) & 0xFFFFFFFF == want, (v, hex(int(bits[i, j])))
    assert struct.unpack("f", struct.pack("I", 0x00400000))[0] == t[0, 0].item() and t[127, 0].item() == 1.0


def test_mode_12_runs_on_scales_it_cannot_read_as_words():
    """MODE 12 reads no scale words (its factors come from the launcher's tables), so scales in the MoE path's
    token-major layout ([C, P/32] with strides (1, C), kernels.moe) or with odd row lengths keep it; MODE 11 reads
    B's words and falls back to MODE 2 on them."""
    import torch

    from kernels.grouped_gemm.gluon_mx import WGRAD_DEFAULT_CONFIG, _mode3_fallback, _words_ok
    token_major = torch.empty_strided((256, 1032), (1, 256), dtype=torch.uint8)
    odd_rows = torch.empty((256, 33), dtype=torch.uint8)
    for scales in (token_major, odd_rows):
        assert not _words_ok(scales)
        cfg = tuple(WGRAD_DEFAULT_CONFIG[:8])
        assert _mode3_fallback(cfg, scales) == cfg
        m11 = cfg[:4] + (11,) + cfg[5:]
        assert _mode3_fallback(m11, scales)[4:6] == (2, 8)
