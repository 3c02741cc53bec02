"""MXFP8 quantization bandwidth (issue 4, kernel 1): ours vs device-to-device copy vs torchao, one run.

Claim: every quantizer reaches >= 90% of the measured copy bandwidth (bytes read + bytes written) at
M=131072, K=7168 bf16. Measured beside it: torchao's blockwise fp8 act-quant kernels (1x128) and torchao's
MXFP8 quantizers where they have a path on this GPU (its Triton dim0/dim1 kernels need sm_100; its
torch.compile'd `to_mx` RCEIL runs anywhere). Also checks our outputs equal the reference bit for bit at
the benchmarked size (chunked, on the GPU).

    python benchmarks/mxfp8_quant.py               # GPU, ~2-3 min incl. autotuning and torch.compile
    python benchmarks/mxfp8_quant.py --smoke       # CPU (Triton interpreter), tiny shapes, no timing claims

Prints a table; writes benchmarks/results/mxfp8_quant-<device>-<date>.json and .md (not with --smoke).
"""
import argparse
import datetime
import json
import os
import re
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes; on CPU under the Triton interpreter")
    p.add_argument("--M", type=int, default=131072)
    p.add_argument("--K", type=int, default=7168)
    p.add_argument("--E", type=int, default=8)
    p.add_argument("--N", type=int, default=2048)
    p.add_argument("--no-torchao", action="store_true", help="skip the torchao peers")
    p.add_argument("--no-torchao-compile", action="store_true", help="skip torch.compile(torchao to_mx)")
    p.add_argument("--no-check", action="store_true", help="skip the bit-exact check against the reference")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    a = p.parse_args()
    if a.smoke:
        a.M, a.K, a.E, a.N = 256, 256, 2, 64
    return a


ARGS = parse()
if ARGS.smoke and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are decorated
sys.path.insert(0, ROOT)

import triton  # noqa: E402

import kernels.mxfp8 as mx  # noqa: E402
from kernels.mxfp8 import reference as ref  # noqa: E402
from kernels.mxfp8 import triton as tk  # noqa: E402
from benchmarks.cuda_timing import graph_ms  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROWS = []


def timed(fn):
    """Median ms per call, (eager, graph). eager: triton.testing.do_bench (flushes L2 before each call; the
    host launches every call, so a kernel shorter than its Python launch path is timed partly as host time).
    graph: `fn` captured GRAPH_CALLS times into one CUDA graph, replays timed with events (no host cost, no L2
    flush; the tensors here are far larger than L2). Autotuning and compiling happen in the first eager call,
    before any capture. CPU smoke: one wall-clock run for both (meaningless as speed)."""
    fn()
    if DEV != "cuda":
        t = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t) * 1e3
        return ms, ms
    eager = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    try:
        return eager, graph_ms(fn, max(10, min(200, int(40 / max(eager, 1e-3)))))
    except Exception as e:  # a peer that cannot be captured keeps its eager number
        torch.cuda.synchronize()
        return eager, f"graph capture failed: {type(e).__name__}: {str(e)[:200]}"


def record(name, fn, nbytes, copy_tbps=None, note=""):
    """copy_tbps: (eager, graph) TB/s of the copy measured the same two ways; % of copy pairs like with like."""
    try:
        ms, gms = timed(fn)
        tbps = nbytes / ms / 1e9
        row = dict(name=name, ms=round(ms, 4), TBps=round(tbps, 3), bytes=nbytes, note=note)
        if copy_tbps and copy_tbps[0]:
            row["pct_of_copy"] = round(100 * tbps / copy_tbps[0], 1)
        if isinstance(gms, str):
            row["graph_error"] = gms
        else:
            gtbps = nbytes / gms / 1e9
            row.update(graph_ms=round(gms, 4), graph_TBps=round(gtbps, 3))
            if copy_tbps and copy_tbps[1]:
                row["graph_pct_of_copy"] = round(100 * gtbps / copy_tbps[1], 1)
    except Exception as e:  # a peer that has no path here is data, not a crash
        row = dict(name=name, error=f"{type(e).__name__}: {str(e)[:300]}", note=note)
    ROWS.append(row)
    print_row(row)
    return row


def print_row(r):
    if "error" in r:
        print(f"{r['name']:<44} {'-':>8} {'-':>7} {'-':>6} {'-':>8} {'-':>7} {'-':>6}  {r['error'][:80]}", flush=True)
    else:
        pct = f"{r['pct_of_copy']:.1f}" if "pct_of_copy" in r else "-"
        gpct = f"{r['graph_pct_of_copy']:.1f}" if "graph_pct_of_copy" in r else "-"
        gms = f"{r['graph_ms']:.4f}" if "graph_ms" in r else "-"
        gtb = f"{r['graph_TBps']:.3f}" if "graph_TBps" in r else "-"
        note = r.get("note", "") + (f" [{r['graph_error'][:60]}]" if "graph_error" in r else "")
        print(f"{r['name']:<44} {r['ms']:>8.4f} {r['TBps']:>7.3f} {pct:>6} {gms:>8} {gtb:>7} {gpct:>6}  {note}",
              flush=True)


def mx_bytes(numel, in_elt, n_copies=1, scale_copies=None):
    """Bytes read + written by a quantizer: input once, 1 byte per element + 1 per 32 per output copy."""
    sc = n_copies if scale_copies is None else scale_copies
    return numel * in_elt + n_copies * numel + sc * (numel // 32)


def u8(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def check(results):
    """Our outputs at the benchmarked size == the reference, byte for byte (chunked over rows on the GPU)."""
    x, w = results["x"], results["w"]
    M = x.shape[0]
    chunk = 8192 if DEV == "cuda" else M
    out = {}
    dr, sr = mx.to_mxfp8(x, -1, backend="triton")
    dc0, sc0 = mx.to_mxfp8(x, 0, backend="triton")
    rr, rs, rdc, rsc = mx.to_mxfp8_rowcol(x, True, backend="triton")
    nr, ns, ndc, nsc = mx.to_mxfp8_rowcol(x, False, backend="triton")
    ok = True
    for i in range(0, M, chunk):
        xs = x[i:i + chunk]
        wd, ws = ref.to_mxfp8_reference(xs, -1)
        cd, cs = ref.to_mxfp8_reference(xs, 0)
        j = i // 32
        pairs = [(dr[i:i + chunk], wd), (sr[i:i + chunk], ws), (rr[i:i + chunk], wd), (rs[i:i + chunk], ws),
                 (nr[i:i + chunk], wd), (ns[i:i + chunk], ws),
                 (dc0[i:i + chunk], cd), (sc0[j:j + chunk // 32], cs),
                 (rdc[:, i:i + chunk].t(), cd), (rsc[:, j:j + chunk // 32].t(), cs),
                 (ndc[i:i + chunk], cd), (nsc[j:j + chunk // 32], cs)]
        ok &= all(torch.equal(u8(a), u8(b)) for a, b in pairs)
        del wd, ws, cd, cs
    out["activations_rows_cols_rowcol"] = bool(ok)
    ok = True
    for dim in (-1, -2):
        d, s = mx.to_mxfp8_expert_weights(w, dim, backend="triton")
        for e in range(w.shape[0]):
            rd, rs_ = ref.to_mxfp8_reference(w[e], dim)
            ok &= torch.equal(u8(d[e]), u8(rd)) and torch.equal(s[e], rs_)
    got = mx.to_mxfp8_tiles32(w, backend="triton")
    for e in range(w.shape[0]):
        want = ref.to_mxfp8_tiles32_reference(w[e])
        ok &= all(torch.equal(u8(a[e]), u8(b)) for a, b in zip(got, want))
    out["expert_weights_and_tiles"] = bool(ok)
    return out


def torchao_peers(x, copy_tbps):
    M, K = x.shape
    try:
        from torchao.prototype.blockwise_fp8_training import kernels as bk
    except Exception as e:
        ROWS.append(dict(name="torchao blockwise (import)", error=repr(e)[:300]))
        bk = None
    if bk is not None:
        b128 = M * K * 2 + M * K + (M * K // 128) * 4
        for fname, note in (("triton_fp8_blockwise_act_quant_lhs", "1x128 along K, fp32 scales"),
                            ("triton_fp8_blockwise_act_quant_rhs", "128x1 along M"),
                            ("triton_fp8_blockwise_act_quant_transposed_lhs", "1x128 along M, transposed out")):
            f = getattr(bk, fname, None)
            if f is None:
                ROWS.append(dict(name=f"torchao {fname}", error="not in this torchao"))
                continue
            record(f"torchao {fname}", lambda f=f: f(x, 128), b128, copy_tbps, note)
    try:
        from torchao.prototype.mx_formats import kernels as mk
        record("torchao triton_to_mxfp8_dim0 (rceil)", lambda: mk.triton_to_mxfp8_dim0(x, 32, "rceil"),
               mx_bytes(M * K, 2), copy_tbps, "needs sm_100 in torchao 0.18")
        record("torchao triton_to_mxfp8_dim1 (rceil)", lambda: mk.triton_to_mxfp8_dim1(x, 32, "rceil"),
               mx_bytes(M * K, 2), copy_tbps, "needs sm_100 in torchao 0.18")
    except Exception as e:
        ROWS.append(dict(name="torchao mx kernels (import)", error=repr(e)[:300]))
    if not ARGS.no_torchao_compile and DEV == "cuda":
        try:
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_mx
            f = torch.compile(lambda t: to_mx(t, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL))
            t0 = time.time()
            f(x)
            note = f"torch.compile'd eager RCEIL, compile {time.time() - t0:.0f}s"
            record("torchao to_mx (torch.compile, rceil)", lambda: f(x), mx_bytes(M * K, 2), copy_tbps, note)
        except Exception as e:
            ROWS.append(dict(name="torchao to_mx (torch.compile, rceil)", error=repr(e)[:300]))


def best_configs():
    """What the launchers cached per (kernel, autotune key, dtype, rounding, options): the autotuner's pick."""
    out = {}
    for (name, key_vals, dtype, hw, extra), (meta, warps, stages) in tk._BEST.items():
        label = f"{name} {'x'.join(map(str, key_vals))} {str(dtype).replace('torch.', '')} hw_cast={hw}"
        out[label] = dict(kwargs=dict(meta), num_warps=warps, num_stages=stages)
    return out


def env():
    e = dict(device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (Triton interpreter)",
             date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             torch=torch.__version__, triton=triton.__version__, command=" ".join([sys.executable] + sys.argv))
    try:
        import torchao
        e["torchao"] = torchao.__version__
    except Exception:
        e["torchao"] = None
    if DEV == "cuda":
        e["capability"] = list(torch.cuda.get_device_capability())
        e["default_rounding"] = "hardware cvt" if tk.default_hw_cast(torch.device("cuda")) else "integer RNE"
    return e


def main():
    M, K, E, N = ARGS.M, ARGS.K, ARGS.E, ARGS.N
    meta = env()
    print(json.dumps(meta))
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16, generator=g) * 0.02)
    y = torch.empty_like(x)
    print(f"\nx [{M}, {K}] bf16, w [{E}, {N}, {K}] bf16; bytes = read + written\n")
    print(f"{'':<44} {'eager (do_bench)':^23} {'CUDA graph':^23}")
    print(f"{'kernel':<44} {'ms':>8} {'TB/s':>7} {'%copy':>6} {'ms':>8} {'TB/s':>7} {'%copy':>6}  note")
    copy = record("copy (y.copy_(x), bf16)", lambda: y.copy_(x), 2 * x.nbytes)
    del y
    ctb = (copy["TBps"], copy.get("graph_TBps")) if "TBps" in copy else None
    wcopy = torch.empty_like(w)
    record("copy (expert weights)", lambda: wcopy.copy_(w), 2 * w.nbytes, ctb)
    del wcopy
    n, nw = M * K, E * N * K
    t_setup = time.time()
    record("ours rows (along K)", lambda: mx.to_mxfp8(x, -1, backend="triton"), mx_bytes(n, 2), ctb,
           "to_mxfp8(x, -1)")
    record("ours cols (along M)", lambda: mx.to_mxfp8(x, 0, backend="triton"), mx_bytes(n, 2), ctb,
           "to_mxfp8(x, 0)")
    record("ours rowcol, col copy [K, M]", lambda: mx.to_mxfp8_rowcol(x, True, backend="triton"),
           mx_bytes(n, 2, 2), ctb, "one read, two outputs")
    record("ours rowcol, col copy [M, K]", lambda: mx.to_mxfp8_rowcol(x, False, backend="triton"),
           mx_bytes(n, 2, 2), ctb, "one read, two outputs")
    record("ours experts along K", lambda: mx.to_mxfp8_expert_weights(w, -1, backend="triton"),
           mx_bytes(nw, 2), ctb, "w [E, N, K]")
    record("ours experts along N", lambda: mx.to_mxfp8_expert_weights(w, -2, backend="triton"),
           mx_bytes(nw, 2), ctb, "w [E, N, K]")
    record("ours experts 32x32 tiles", lambda: mx.to_mxfp8_tiles32(w, backend="triton"),
           mx_bytes(nw, 2, 1, 2), ctb, "scales stored along K and N")
    if DEV == "cuda":  # the exact integer-rounding path (what non-sm_90 GPUs and the interpreter use)
        record("ours rows, integer rounding", lambda: tk.to_mxfp8_triton(x, -1, hw_cast=False), mx_bytes(n, 2),
               ctb, "hw_cast=False")
        record("ours rowcol [K, M], integer rounding", lambda: tk.to_mxfp8_rowcol(x, True, hw_cast=False),
               mx_bytes(n, 2, 2), ctb, "hw_cast=False")
    meta["ours_seconds_incl_autotune"] = round(time.time() - t_setup, 1)
    if not ARGS.no_torchao:
        torchao_peers(x, ctb)
    meta["best_configs"] = best_configs()
    if not ARGS.no_check:
        t0 = time.time()
        meta["bit_exact_vs_reference"] = check(dict(x=x, w=w))
        print(f"\nbit-exact vs reference at this size: {meta['bit_exact_vs_reference']} "
              f"({time.time() - t0:.0f}s)")
    print("autotuned:", json.dumps(meta["best_configs"]))
    # the claim is about the default path on this GPU; the integer-rounding rows (the path of the interpreter
    # and of GPUs below sm_90) are shown for information
    ours = [r for r in ROWS if r["name"].startswith("ours") and "pct_of_copy" in r and "integer" not in r["name"]]
    if ours:
        # the claim is judged on the graph column (kernel time without host launch cost), both copy and ours
        # measured that way; the eager column stays in the table for honesty
        worst = min(ours, key=lambda r: r.get("graph_pct_of_copy", 0.0))
        meta["worst_ours_graph_pct_of_copy"] = worst.get("graph_pct_of_copy")
        meta["worst_ours_eager_pct_of_copy"] = min(r["pct_of_copy"] for r in ours)
        print(f"worst of ours (CUDA graph): {worst['name']} at {worst.get('graph_pct_of_copy')}% of copy "
              f"(target >= 90%);"
              f" eager do_bench worst {meta['worst_ours_eager_pct_of_copy']}%")
    failed = [r for r in ROWS if r["name"].startswith("ours") and "error" in r]
    res = dict(meta=meta, shapes=dict(M=M, K=K, E=E, N=N, dtype="bfloat16"), rows=ROWS)
    if ARGS.smoke:
        print("smoke: not writing results")
    else:
        os.makedirs(ARGS.out, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
        day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        path = os.path.join(ARGS.out, f"mxfp8_quant-{slug}-{day}")
        with open(path + ".json", "w") as f:
            json.dump(res, f, indent=1)
        with open(path + ".md", "w") as f:
            f.write(f"# MXFP8 quantization bandwidth, {meta['device']}, {meta['date']}\n\n")
            f.write(f"x [{M}, {K}] bf16, w [{E}, {N}, {K}] bf16. torch {meta['torch']}, triton {meta['triton']}, "
                    f"torchao {meta['torchao']}. `{meta['command']}`\n\n"
                    "eager: triton.testing.do_bench (L2 flush + a host launch per call); graph: the calls captured "
                    "in one CUDA graph (kernel time alone). % copy compares with the copy measured the same way; "
                    "the >= 90% claim is read on the graph column.\n\n"
                    "| kernel | eager ms | eager TB/s | eager % copy | graph ms | graph TB/s | graph % copy | note |\n"
                    "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
            for r in ROWS:
                if "error" in r:
                    f.write(f"| {r['name']} | - | - | - | - | - | - | {r['error'][:120]} |\n")
                else:
                    f.write(f"| {r['name']} | {r['ms']} | {r['TBps']} | {r.get('pct_of_copy', '-')} | "
                            f"{r.get('graph_ms', '-')} | {r.get('graph_TBps', '-')} | "
                            f"{r.get('graph_pct_of_copy', '-')} | {r.get('note', '')} {r.get('graph_error', '')} |\n")
            f.write(f"\nbit-exact vs reference: {meta.get('bit_exact_vs_reference')}\n")
        print(f"wrote {path}.json and .md")
    bad_check = meta.get("bit_exact_vs_reference") and not all(meta["bit_exact_vs_reference"].values())
    if failed or bad_check:
        print("FAILED:", [r["name"] for r in failed], meta.get("bit_exact_vs_reference"))
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
