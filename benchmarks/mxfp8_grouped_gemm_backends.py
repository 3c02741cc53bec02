"""MXFP8 grouped GEMM backends (Triton mx128 / mx32, CUTLASS mx128) beside bf16 torch._grouped_mm, torch's fp8
rowwise grouped GEMM, cuBLAS dense blockwise and torchao's fp8 rowwise grouped op, all in ONE run.

  PYTHONUNBUFFERED=1 python benchmarks/mxfp8_grouped_gemm_backends.py [--shapes dsv3_up,dsv3_down,llama_up]
      [--routings even,skewed] [--no-op] [--rounds 30]

E = 8 experts, 8192 tokens per expert (M = 65536), (K, N) in {(7168, 2048), (2048, 7168), (4096, 2816)}; routing
"even" and "skewed" (one expert 4x the mean, one empty, the other six uneven; every group a multiple of 128 tokens,
as the MoE pads them under mx128 (token_group_align = 128), which the CUTLASS wgrad needs).

Kernel rows (quantization NOT included; TFLOP/s = 2*M*N*K / time; ratios to bf16 and fp8 rowwise of this run;
our wgrad kernels write dW in --wgrad-out, bf16 by default, as the peers and the experts op for bf16 weights do):
  bf16              torch._grouped_mm
  fp8_rowwise       torch._scaled_grouped_mm (unit scales; speed does not depend on them)
  cublas_blockwise  per-expert torch.nn.functional.scaled_mm, 1x128 x 128x128 (fprop/dgrad), 1x128 x 1x128 (wgrad)
                    -- dense cuBLAS at the same sizes, one launch per expert
  mx128_triton / mx32_triton   kernels.grouped_gemm with backend="triton"
  mx32_gluon        backend="gluon": true 1x32 scales, the next wgmma in flight while a partial is promoted
  mx128_cutlass     backend="cutlass" with its default kernel per pass (cutlass_backend.SCHEDULES)
  mx128_cutlass_coop / _pp     backend="cutlass", schedule cooperative (128x128 tiles) / pingpong (64x128)
                    for every pass
  mx128_cuda        kernels/grouped_gemm/cuda_mx.py launch_nt(block=128), fprop/dgrad only: the CUTLASS kernels'
                    128x192 arithmetic in a CuTe mainloop of our own (not behind the backend switch yet)
  mx128_cutlass_s18  backend="cutlass" with session 18's defaults (128x128 tiles: cooperative for fprop/dgrad,
                    cooperative_lpt for wgrad)
  mx128_cutlass@TAG (--cutlass-variant TAG=DEFINES) the default CUTLASS kernels built again with those -D defines
                    (cutlass_backend.load_variant), e.g. late=-DTITAN_MX_RELEASE_LATE: CUTLASS's own consumer loop
  cutlass[<config>] (--cutlass-configs) backend="cutlass" under that kernel configuration (cluster shape,
                    raster order, swizzle: kernels/grouped_gemm/cutlass_backend.py SCHEDULES)
Op rows ("fwd+bwd"): the whole autograd op forward + backward with every quantization, eager:
  bf16 (torch._grouped_mm), torchao_fp8_rowwise (torchao 0.18 _to_fp8_rowwise_then_scaled_grouped_mm,
  pad_token_groups_for_grouped_mm=False), op_mx128_triton, op_mx128_cutlass (default kernels),
  op_mx128_cutlass_{coop,pp,s18} (token_align=128), op_cutlass[<config>] (each --cutlass-configs configuration),
  op_mx32_triton, op_mx32_gluon, op_mx32_gluon_w8 (its quantizers at 8 warps, as before session 28),
  op_mx32_gluon_s28 (its quantizers launched as in session 28: 128 x 128 programs, 32-token columns at 4 warps)
  op_mx128_cutlass_tq, op_mx32_gluon_tq (TITAN_FP8_ROWCOL_QUANT=triton: the x / dO copies on the Triton kernel,
  as before session 30; the default rows take the CUDA one where it builds)
  op_mx128_cutlass_qp2, op_mx32_gluon_qp2 (the CUDA quantizer on its persistent grid of 2 CTAs per SM, as in
  sessions 30-43; the default rows launch one CTA per tile)
  op_mx128_cutlass_w1, op_mx128_deepgemm_w1 (benchmarks/mx128_op_variants.py: both weight copies from one read;
  the second with fprop / dgrad on DeepGEMM, listed where `import deep_gemm` works; each checked against
  op_mx128_cutlass before timing: a "check" row with the norm-wise rel. difference of out, dx, dw)
  (titan_fp8.float8.experts.mxfp8_grouped_mm). --ops picks a subset (default all). FLOPs: 3 GEMMs.
--timing steady (benchmarks/cuda_timing.steady_ms): each variant back to back, --settle-s untimed then ~--measure-s
timed, --rounds rounds in rotating order, median; with --smi-log each row also gets its variant's mean SM clock and
power (MHz column). Under the board's power cap a variant run alone holds its own clock (H200, session 42: bf16
~1300-1470 MHz, the mx128 op ~1500, mx32 ~1600); round-robin calls share the mix's clock. A training run's ratio lies
between the two (its step mixes these kernels with others): round-robin is the conservative figure.
Timing (default, round-robin): per (shape, routing, pass) every variant round-robin, --rounds rounds, CUDA events per call,
median (benchmarks/cuda_timing.interleaved_ms; kernels alternate two input sets, each far larger than L2): the
variants of a pass share clocks and thermal state, so their ratios hold when the H100's clocks drift (one-variant-
at-a-time timing read the same kernel 1.31 and 1.51 ms in one run). `iqr`: interquartile range / median.
Check: each mx128 output vs the first mx128 variant's output of the same operands (`rel_vs`, `rel_ref`: norm-wise
rel.; every kernel vs float64 is in the GPU tests).
Writes benchmarks/results/mxfp8_grouped_gemm_backends-<device>-<date>.json (or under $OUT when set).
"""

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kernels.grouped_gemm import (  # noqa: E402
    mxfp8_grouped_mm_dgrad,
    mxfp8_grouped_mm_fprop,
    mxfp8_grouped_mm_wgrad,
)
from kernels.grouped_gemm.quant import to_mxfp8_blocked  # noqa: E402
from benchmarks.cuda_timing import add_timing_args, make_timer  # noqa: E402

SHAPES = {"dsv3_up": (7168, 2048), "dsv3_down": (2048, 7168), "llama_up": (4096, 2816)}
E, TPE = 8, 8192
F8 = torch.float8_e4m3fn
# name: (block, weight tile, x^T tile for wgrad, backend, CUTLASS schedule)
OURS = {"mx128_triton": (128, 128, 128, "triton", None), "mx32_triton": (32, 128, 128, "triton", None),
        "mx32_gluon": (32, 128, 128, "gluon", None),
        "mx128_cutlass": (128, 128, 128, "cutlass", None),
        "mx128_cutlass_coop": (128, 128, 128, "cutlass", "cooperative"),
        "mx128_cutlass_pp": (128, 128, 128, "cutlass", "pingpong"),
        "mx128_cutlass_s18": (128, 128, 128, "cutlass", "fprop=cooperative;dgrad=cooperative;wgrad=cooperative_lpt"),
        "mx128_cuda": (128, 128, 128, "cuda", None)}
SCHED_ENV = "TITAN_FP8_CUTLASS_SCHEDULE"


def _held(fn, enter, leave):
    """fn with a setting held for its call: enter() makes it and returns what it replaced, leave(that) puts that
    back (so nesting restores the outer setting). The wrapper's `around` holds the same setting over more than one
    call: fwd_bwd holds it over an op's forward AND backward (the backward's kernels run outside the forward call)."""
    inner = getattr(fn, "around", contextlib.nullcontext)  # fn may be such a wrapper itself

    @contextlib.contextmanager
    def around():
        before = enter()
        try:
            with inner():
                yield
        finally:
            leave(before)

    def run(*a, **k):
        with around():
            return fn(*a, **k)
    run.around = around
    return run


def fwd_bwd(fn, x, w, offs, go):
    """One forward + backward of the op fn, with a with_schedule / with_quant_launch setting held over both."""
    with getattr(fn, "around", contextlib.nullcontext)():
        fn(x, w, offs).backward(go)


def with_env(fn, name, value):
    """fn with the environment variable `name` set to value (settings read per call: the CUTLASS schedule, the
    rowcol quantizer's kernel)."""
    def enter():
        before = os.environ.get(name)
        os.environ[name] = value
        return before

    def leave(before):
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    return _held(fn, enter, leave)


def with_schedule(fn, sched):
    """fn with the CUTLASS schedule override set (read per call by cutlass_backend)."""
    return fn if sched is None else with_env(fn, SCHED_ENV, sched)


def with_attr(fn, module, name, value):
    """fn with module.name set to value over its forward and backward, put back afterwards."""
    def enter():
        before = getattr(module, name)
        setattr(module, name, value)
        return before
    return _held(fn, enter, lambda before: setattr(module, name, before))


def with_quant_launch(fn, rule):
    """fn with every to_mxfp8_blocked_rowcol launch configured by rule(row_tile, col_block, col_tile, do_row,
    do_col) -> (rows, columns per program, warps) in place of quant_triton.rowcol_launch: an earlier rule."""
    from kernels.grouped_gemm import quant_triton
    return with_attr(fn, quant_triton, "rowcol_launch", rule)


def with_rowcol_grid(fn, ctas_per_sm):
    """fn with the CUDA rowcol quantizer on a persistent grid of ctas_per_sm CTAs per SM (quant_cuda.CTAS_PER_SM;
    default 0: one CTA per tile)."""
    from kernels.grouped_gemm import quant_cuda
    return with_attr(fn, quant_cuda, "CTAS_PER_SM", ctas_per_sm)


def launch_rule_s28(row_tile, col_block, col_tile, do_row, do_col):
    """The quantizers' launches as session 28 left them: 128 x 128 programs, 4 warps for 32-token column copies."""
    return 128, 128, 4 if do_col and col_block == 32 else 8


ROUNDS = 50


def routings(M):
    q = 128
    rest = M - 4 * TPE
    six = [(rest // 6) // q * q + (1 if i % 2 else -1) * q * (i + 1) for i in range(6)]
    six[-1] += rest - sum(six)
    return {"even": [TPE] * E, "skewed": [4 * TPE, 0] + six}


PASSES = ("fprop", "dgrad", "wgrad")
TIMES: dict = {}  # variant -> ms of the pass timed last (timed() fills it; ratios read the baselines from it)
CLOCKS: dict = {}  # variant -> {"sm_mhz", "watts", "samples"} of the pass timed last (steady timing + --smi-log)
TIMER = [None]  # cuda_timing.make_timer's function for this run (main sets it)


def timed(fns, rec, shape, rname, pass_):
    """{variant: (median ms, IQR / median)} of fns {variant: [callables]}, all timed together: one warm-up call
    each (a variant that raises is recorded as an error row and left out), then ROUNDS round-robin rounds."""
    ok = {}
    for v, calls in fns.items():
        try:
            for c in calls:
                c()
            torch.cuda.synchronize()
            ok[v] = calls
        except Exception as e:  # record and go on
            rec(shape=shape, routing=rname, pass_=pass_, variant=v, error=repr(e)[:400])
    res, clocks = TIMER[0](ok, ROUNDS) if ok else ({}, {})
    TIMES.clear()
    TIMES.update({v: ms for v, (ms, _) in res.items()})
    CLOCKS.clear()
    CLOCKS.update(clocks)
    return res


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def load_module(name, relpath):
    """A module of this repo loaded from its file (titan_fp8's package __init__ needs torchao)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if "torchao" not in str(e):
            raise
    spec = importlib.util.spec_from_file_location("_bench_" + name.replace(".", "_"), os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cublas_blockwise_calls(a_list, b_list, b_is_tile):
    """Per-expert F.scaled_mm calls on pre-laid-out operands (unit scales); a_list[e] [m, K], b_list[e] [n, K]."""
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType
    calls = []
    for a, b in zip(a_list, b_list):
        if a.numel() == 0:  # an empty expert
            continue
        m, k = a.shape
        n = b.shape[0]
        sa = torch.ones(k // 128, m, device=a.device).t()  # [m, K/128], strides (1, m)
        if b_is_tile:
            k4 = -(-(k // 128) // 4) * 4
            sb = torch.ones(n // 128, k4, device=a.device).t()  # [k4, n/128] strides (1, k4)
            rb = ScalingType.BlockWise128x128
        else:
            sb = torch.ones(k // 128, n, device=a.device).t()
            rb = ScalingType.BlockWise1x128
        bt = b.t()  # [K, n] column-major
        calls.append((a, bt, sa, sb, rb))

    def run():
        for a, bt, sa, sb, rb in calls:
            F.scaled_mm(a, bt, sa, ScalingType.BlockWise1x128, sb, rb, output_dtype=torch.bfloat16)
    return run


def main():
    global ROUNDS
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--routings", default="even,skewed")
    ap.add_argument("--no-op", action="store_true")
    ap.add_argument("--no-cublas", action="store_true")
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help="round-robin rounds per pass (every variant called once per round)")
    ap.add_argument("--ours", default=",".join(OURS),
                    help=f"which of our kernel variants to time (default all: {','.join(OURS)})")
    add_timing_args(ap)
    ap.add_argument("--ops", default="", help="comma list of op rows to time (default all; see the docstring)")
    ap.add_argument("--wgrad-out", default="bf16", choices=["bf16", "fp32"],
                    help="our wgrad kernels' dW dtype: bf16 = what the experts op writes for bf16 weights and what "
                         "the bf16 and fp8 rowwise peers write (the default since session 26); fp32 = sessions <= 25")
    ap.add_argument("--cutlass-configs", default="",
                    help="also time the CUTLASS mx128 kernels under these configurations (comma list of "
                         "cutlass_backend SCHEDULES strings, e.g. cooperative_2x1:along_n:swizzle=4); rows "
                         "'cutlass[<config>]', and with the op rows the whole mx128 op under each, rows "
                         "'op_cutlass[<config>]'")
    ap.add_argument("--cutlass-variant", action="append", default=[], metavar="TAG=DEFINE[,DEFINE]",
                    help="also time the CUTLASS kernels of the same sources built with these -D defines (e.g. "
                         "late=-DTITAN_MX_RELEASE_LATE), rows 'mx128_cutlass@TAG' beside the default build's "
                         "(needs mx128_cutlass in --ours; bits_equal: output identical to its)")
    args = ap.parse_args()
    variants = {}
    for spec in args.cutlass_variant:
        tag, _, defs = spec.partition("=")
        from kernels.grouped_gemm.cutlass_backend import load_variant
        try:  # load_variant checks the tag and the defines
            variants[tag] = load_variant(tag, tuple(filter(None, defs.split(","))) or ("",))
        except ValueError as e:
            raise SystemExit(f"--cutlass-variant {spec!r} (expected TAG=DEFINE[,DEFINE]): {e}")
    ours = {}
    for v in filter(None, args.ours.split(",")):
        if v not in OURS:
            raise SystemExit(f"--ours: {v!r} unknown; allowed: {', '.join(OURS)}")
        ours[v] = OURS[v]
    if args.cutlass_configs:
        from kernels.grouped_gemm.cutlass_backend import config_id
        for cfg in args.cutlass_configs.split(","):
            try:
                config_id(cfg, "--cutlass-configs")
            except ValueError as e:
                raise SystemExit(str(e))
            ours[f"cutlass[{cfg}]"] = (128, 128, 128, "cutlass", cfg)
    ROUNDS = args.rounds
    TIMER[0], timing = make_timer(args)
    dw_dtype = torch.bfloat16 if args.wgrad_out == "bf16" else torch.float32
    dev = "cuda"
    torch.manual_seed(0)
    M = E * TPE
    rows, t0 = [], time.time()
    vers = {"torch": torch.__version__, "triton": __import__("triton").__version__}
    try:
        import torchao
        vers["torchao"] = torchao.__version__
    except ImportError:
        vers["torchao"] = None
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), **vers, "command": "python " + " ".join(sys.argv), "experts": E,
        "tokens_per_expert": TPE, "wgrad_out": args.wgrad_out,
        "timing": f"{timing}; {ROUNDS} rounds per pass"}
    print(json.dumps(meta), flush=True)

    def rec(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)

    experts = load_module("titan_fp8.float8.experts", "titan_fp8/float8/experts.py")
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]
        flops = 2 * M * N * K
        sets = [(torch.randn(M, K, device=dev, dtype=torch.bfloat16),
                 torch.randn(M, N, device=dev, dtype=torch.bfloat16)) for _ in range(2)]
        w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02
        for rname in args.routings.split(","):
            sizes = routings(M)[rname]
            offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
            kern = {p: {} for p in PASSES}  # pass -> variant -> [callable per input set]
            extras = {}  # (pass, variant) -> extra fields of its row

            # ---- bf16 grouped
            kern["fprop"]["bf16"] = [lambda s=s: torch._grouped_mm(s[0], w.transpose(-2, -1), offs=offs)
                                     for s in sets]
            kern["dgrad"]["bf16"] = [lambda s=s: torch._grouped_mm(s[1], w, offs=offs) for s in sets]
            kern["wgrad"]["bf16"] = [lambda s=s: torch._grouped_mm(s[1].t(), s[0], offs=offs) for s in sets]
            # ---- fp8 rowwise (torch._scaled_grouped_mm)
            f8 = [(s[0].to(F8), s[1].to(F8), s[0].t().contiguous().to(F8), s[1].t().contiguous().to(F8))
                  for s in sets]
            w8 = w.to(F8)
            wt8 = w.transpose(1, 2).contiguous().to(F8)
            one = lambda n: torch.ones(n, device=dev, dtype=torch.float32)  # noqa: E731
            kern["fprop"]["fp8_rowwise"] = [lambda q=q: torch._scaled_grouped_mm(
                q[0], w8.transpose(-2, -1), one(M), one(E * N).view(E, N), offs=offs, out_dtype=torch.bfloat16)
                for q in f8]
            kern["dgrad"]["fp8_rowwise"] = [lambda q=q: torch._scaled_grouped_mm(
                q[1], wt8.transpose(-2, -1), one(M), one(E * K).view(E, K), offs=offs, out_dtype=torch.bfloat16)
                for q in f8]
            kern["wgrad"]["fp8_rowwise"] = [lambda q=q: torch._scaled_grouped_mm(
                q[3], q[2].t(), one(N * E), one(K * E), offs=offs, out_dtype=torch.bfloat16) for q in f8]
            # ---- cuBLAS dense blockwise, one call per expert
            if not args.no_cublas:
                bounds = [(int(a), int(b)) for a, b in zip([0] + offs.tolist()[:-1], offs.tolist())]
                for q in f8:
                    kern["fprop"].setdefault("cublas_blockwise", []).append(cublas_blockwise_calls(
                        [q[0][s:t] for s, t in bounds], [w8[e] for e in range(E)], True))
                    kern["dgrad"].setdefault("cublas_blockwise", []).append(cublas_blockwise_calls(
                        [q[1][s:t] for s, t in bounds], [wt8[e] for e in range(E)], True))
                    kern["wgrad"].setdefault("cublas_blockwise", []).append(cublas_blockwise_calls(
                        [q[3][:, s:t].contiguous() for s, t in bounds],
                        [q[2][:, s:t].contiguous() for s, t in bounds], False))
            # ---- ours (operands quantized once per block layout; all kept, as every variant is timed together)
            outs, operands = {}, {}
            for vname, (block, wtile, xtile, backend, sched) in ours.items():
                try:
                    if (block, wtile, xtile) not in operands:
                        wq = to_mxfp8_blocked(w, -1, block, wtile)
                        wqt = to_mxfp8_blocked(w.transpose(1, 2).contiguous(), -1, block, wtile)
                        qs = [(to_mxfp8_blocked(x, -1, block, 1), to_mxfp8_blocked(dO, -1, block, 1),
                               to_mxfp8_blocked(dO.t(), -1, block, 1), to_mxfp8_blocked(x.t(), -1, block, xtile))
                              for x, dO in sets]
                        operands[(block, wtile, xtile)] = (wq, wqt, qs)
                    wq, wqt, qs = operands[(block, wtile, xtile)]
                    wn_data, wn_scale = wqt[0].transpose(1, 2), wqt[1].transpose(1, 2)
                except Exception as e:
                    rec(shape=shape, routing=rname, pass_="prep", variant=vname, error=repr(e)[:400])
                    continue
                kw = dict(validate=False, backend=backend)

                def mk0(p, q, wq=wq, wqt=wqt, wn_data=wn_data, wn_scale=wn_scale, block=block, wtile=wtile,
                        xtile=xtile, kw=kw):
                    if backend == "cuda":  # the kernel itself (fprop, and dgrad on the K-major W^T copy)
                        from kernels.grouped_gemm.cuda_mx import launch_nt
                        a, b = (q[0], wq) if p == "fprop" else (q[1], wqt)
                        return lambda: launch_nt(*a, *b, offs, torch.bfloat16, block=block)
                    if p == "fprop":
                        return lambda: mxfp8_grouped_mm_fprop(*q[0], *wq, offs, block=block, w_tile=wtile, **kw)
                    if p == "dgrad":
                        return lambda: mxfp8_grouped_mm_dgrad(*q[1], wn_data, wn_scale, offs, block=block,
                                                              w_tile=wtile, **kw)
                    return lambda: mxfp8_grouped_mm_wgrad(*q[2], *q[3], offs, dw_dtype, block=block,
                                                          a_tile=xtile, token_align=128, **kw)
                for p in PASSES:
                    if backend == "cuda" and p == "wgrad":
                        continue
                    fns = [with_schedule(mk0(p, q), sched) for q in qs]
                    try:
                        out = fns[0]()
                        torch.cuda.synchronize()
                        if vname.startswith(("mx128", "cutlass[")):  # vs the first mx128 variant
                            if (p, "mx128") in outs:
                                ref_name, ref = outs[(p, "mx128")]
                                extras[(p, vname)] = {"rel_vs": float(f"{rel(out, ref):.3g}"), "rel_ref": ref_name}
                            else:
                                outs[(p, "mx128")] = (vname, out)
                        del out
                    except Exception as e:
                        rec(shape=shape, routing=rname, pass_=p, variant=vname, error=repr(e)[:400])
                        continue
                    kern[p][vname] = fns
            # ---- the CUTLASS kernels of another build (--cutlass-variant), beside the default build's
            for tag, ext in variants.items():
                vname = f"mx128_cutlass@{tag}"
                if (128, 128, 128) not in operands:
                    rec(shape=shape, routing=rname, pass_="prep", variant=vname, error="needs --ours mx128_cutlass")
                    continue
                wq, wqt, qs = operands[(128, 128, 128)]
                for p in PASSES:
                    fns = [cutlass_variant_call(ext, p, q, wq, wqt, offs, dw_dtype) for q in qs]
                    try:
                        out = fns[0]()
                        torch.cuda.synchronize()
                        if (p, "mx128") in outs:
                            ref_name, ref = outs[(p, "mx128")]
                            extras[(p, vname)] = {"rel_vs": float(f"{rel(out, ref):.3g}"), "rel_ref": ref_name,
                                                  "bits_equal": bool(torch.equal(out, ref))}
                        del out
                    except Exception as e:
                        rec(shape=shape, routing=rname, pass_=p, variant=vname, error=repr(e)[:400])
                        continue
                    kern[p][vname] = fns
            del outs
            # ---- time each pass: every variant round-robin (benchmarks/cuda_timing.interleaved_ms)
            for p in PASSES:
                for v, (ms, iqr) in timed(kern[p], rec, shape, rname, p).items():
                    r = dict(shape=shape, routing=rname, pass_=p, variant=v, ms=round(ms, 4),
                             TFLOPs=round(flops / ms / 1e9, 1), iqr=round(iqr, 3))
                    for b in ("bf16", "fp8_rowwise"):
                        if b in kern[p] and v != b and b in TIMES:
                            r["vs_" + b] = round(TIMES[b] / ms, 3)
                    r.update(extras.get((p, v), {}))
                    r.update(CLOCKS.get(v, {}))
                    rec(**r)
            del kern, f8, w8, wt8, operands
            torch.cuda.empty_cache()
            if not args.no_op:
                op_rows(rec, experts, shape, rname, sizes, K, N, args.ops,
                        tuple(filter(None, args.cutlass_configs.split(","))))
            write_json(meta, rows)
        del sets, w
        torch.cuda.empty_cache()
    print_table(meta, rows, time.time() - t0)
    print("wrote", write_json(meta, rows))


def cutlass_variant_call(ext, p, q, wq, wqt, offs, dw_dtype):
    """Pass p of the CUTLASS kernels in the extension `ext` (cutlass_backend.load_variant: another build of the same
    sources): the operands and per-pass configuration cutlass_backend's ops use, launched through the extension's
    grouped_rows / grouped_red (that build registers no ops). q: (x, dO, dO^T, x^T) quantized as in main."""
    from kernels.grouped_gemm import cutlass_backend as cb
    if p == "wgrad":
        (x, sx), (y, sy) = q[2], q[3]
        cfg = cb.schedule_id("wgrad", x.shape[0] / cb.GRAN, y.shape[0] / cb.GRAN)

        def run():
            out = torch.empty(offs.shape[0], x.shape[0], y.shape[0], dtype=dw_dtype, device=x.device)
            ext.grouped_red(x.view(torch.uint8), sx, y.view(torch.uint8), sy, offs, out, cfg)
            return out
        return run
    if p == "fprop":
        (a, sa), (b, sb) = q[0], wq
    else:  # dgrad: dO @ W on W's K-major copy, as mxfp8_grouped_mm_dgrad gets it in main
        a, sa, b, sb = cb._dgrad_operands(*q[1], wqt[0].transpose(1, 2), wqt[1].transpose(1, 2))
    cfg = cb.schedule_id(p, a.shape[0] / max(offs.shape[0], 1) / cb.GRAN, b.shape[1] / cb.GRAN)

    def run():
        out = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
        ext.grouped_rows(a.view(torch.uint8), sa, b.view(torch.uint8), sb, offs, out, cfg, 0)
        return out
    return run


def op_rows(rec, experts, shape, rname, sizes, K, N, only="", cutlass_configs=()):
    M = E * TPE
    flops = 3 * 2 * M * N * K
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    go = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    ops = {"bf16": lambda x, w, o: torch._grouped_mm(x, w.transpose(-2, -1), offs=o)}
    try:
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm as tao
        ops["torchao_fp8_rowwise"] = lambda x, w, o: tao(x, w.transpose(-2, -1), o,
                                                         pad_token_groups_for_grouped_mm=False)
    except Exception as e:
        rec(shape=shape, routing=rname, pass_="fwd+bwd", variant="torchao_fp8_rowwise", error=repr(e)[:300])
    mm = experts.mxfp8_grouped_mm
    ops["op_mx128_triton"] = lambda x, w, o: mm(x, w, o, granularity="mx128", backend="triton")
    ops["op_mx128_cutlass"] = lambda x, w, o: mm(x, w, o, granularity="mx128", backend="cutlass", token_align=128)
    for sched, tag in (("cooperative", "coop"), ("pingpong", "pp"), (OURS["mx128_cutlass_s18"][4], "s18")):
        ops[f"op_mx128_cutlass_{tag}"] = with_schedule(
            lambda x, w, o: mm(x, w, o, granularity="mx128", backend="cutlass", token_align=128), sched)
    for cfg in cutlass_configs:  # (--cutlass-configs: every pass under that configuration)
        ops[f"op_cutlass[{cfg}]"] = with_schedule(
            lambda x, w, o: mm(x, w, o, granularity="mx128", backend="cutlass", token_align=128), cfg)
    ops["op_mx32_triton"] = lambda x, w, o: mm(x, w, o, granularity="mx32", backend="triton")
    ops["op_mx32_gluon"] = lambda x, w, o: mm(x, w, o, granularity="mx32", backend="gluon")
    ops["op_mx32_gluon_w8"] = with_quant_launch(ops["op_mx32_gluon"], lambda *layout: (128, 128, 8))
    ops["op_mx32_gluon_s28"] = with_quant_launch(ops["op_mx32_gluon"], launch_rule_s28)
    for name in ("op_mx128_cutlass", "op_mx32_gluon"):  # the x / dO copies on the Triton kernel, as before s30
        ops[name + "_tq"] = with_env(ops[name], "TITAN_FP8_ROWCOL_QUANT", "triton")
        ops[name + "_qp2"] = with_rowcol_grid(ops[name], 2)  # the CUDA quantizer's grid of sessions 30-43
    from benchmarks.mx128_op_variants import mx128_op_variant  # both weight copies from one read (+ DeepGEMM)
    ops["op_mx128_cutlass_w1"] = lambda x, w, o: mx128_op_variant(x, w, o, gemm="cutlass")
    try:
        import deep_gemm  # noqa: F401  (built by benchmarks/deepgemm_device_run.sh)
        ops["op_mx128_deepgemm_w1"] = lambda x, w, o: mx128_op_variant(x, w, o, gemm="deepgemm")
    except Exception as e:
        if not only or "op_mx128_deepgemm_w1" in only.split(","):
            rec(shape=shape, routing=rname, pass_="fwd+bwd", variant="op_mx128_deepgemm_w1", error=repr(e)[:300])
    if only:
        unknown = set(only.split(",")) - set(ops) - {"op_mx128_deepgemm_w1"}  # (its missing import: a row above)
        if unknown:
            raise SystemExit(f"--ops: {sorted(unknown)} unknown; allowed: {', '.join(ops)}")
        ops = {k: v for k, v in ops.items() if k in only.split(",") or k == "bf16" or k.startswith("op_cutlass[")}
    for name in [n for n in ops if n.endswith("_w1")]:  # same numbers as the op, checked before timing
        got = []
        try:
            for fn in (lambda x, w, o: mm(x, w, o, granularity="mx128", backend="cutlass", token_align=128),
                       ops[name]):
                x.grad = w.grad = None
                out = fn(x, w, offs)
                out.backward(go)
                got.append((out.detach(), x.grad.clone(), w.grad.clone()))
            rec(shape=shape, routing=rname, pass_="check", variant=name,
                rel_vs_op={k: float(f"{rel(a, b):.3g}") for k, a, b in zip(("out", "dx", "dw"), got[1], got[0])})
        except Exception as e:  # recorded; the variant is not timed
            rec(shape=shape, routing=rname, pass_="check", variant=name, error=repr(e)[:400])
            del ops[name]
        del got
    runs = {}
    for name, fn in ops.items():
        def run(fn=fn):
            x.grad = w.grad = None
            fwd_bwd(fn, x, w, offs, go)
        runs[name] = [run]
    for name, (ms, iqr) in timed(runs, rec, shape, rname, "fwd+bwd").items():
        r = dict(shape=shape, routing=rname, pass_="fwd+bwd", variant=name, ms=round(ms, 4),
                 TFLOPs=round(flops / ms / 1e9, 1), iqr=round(iqr, 3))
        for b in ("bf16", "torchao_fp8_rowwise"):
            if b in TIMES and b != name:
                r["vs_" + b] = round(TIMES[b] / ms, 3)
        r.update(CLOCKS.get(name, {}))
        rec(**r)
    del x, w, go
    torch.cuda.empty_cache()


def print_table(meta, rows, secs):
    print(f"\nMXFP8 grouped GEMM backends, {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
          f"torchao {meta['torchao']}, E={E}, {TPE} tokens/expert, {secs:.0f}s\ntiming: {meta['timing']}")
    print(f"{'shape':10s} {'routing':7s} {'pass':7s} {'variant':44s} {'ms':>8s} {'TFLOP/s':>8s} {'vs bf16':>8s} "
          f"{'vs fp8rw':>8s} {'vs torchao':>10s} {'rel':>8s} {'iqr':>6s} {'MHz':>5s}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:7s} {r['variant']:44s} ERROR {r['error'][:90]}")
            continue
        if "rel_vs_op" in r:
            print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:7s} {r['variant']:44s} rel. to op_mx128_cutlass: "
                  + ", ".join(f"{k} {v}" for k, v in r["rel_vs_op"].items()))
            continue
        print(f"{r['shape']:10s} {r['routing']:7s} {r['pass_']:7s} {r['variant']:44s} {r['ms']:8.3f} "
              f"{r['TFLOPs']:8.1f} {r.get('vs_bf16', ''):>8} {r.get('vs_fp8_rowwise', ''):>8} "
              f"{r.get('vs_torchao_fp8_rowwise', ''):>10} {r.get('rel_vs', ''):>8} {r.get('iqr', ''):>6} "
              f"{r.get('sm_mhz', ''):>5}")


def write_json(meta, rows):
    from benchmarks.results_json import write_results
    return write_results("mxfp8_grouped_gemm_backends", meta, rows)


if __name__ == "__main__":
    main()
