"""Rowwise float8 casts (kernels/float8_cast): our Triton kernels vs the same casts compiled by torch.compile
(what torchao's rowwise recipe runs) vs a device copy, in one run; and a bit-exact check against the reference.

Per shape [M, N] (bf16):
  rowwise       to_float8_rowwise: row cast + column amax from one read   (bytes: 2 read + 1 written)
  ref rowwise   the reference compiled: row cast, and the column amax as inductor fuses it
  colwise_t     to_float8_colwise_transposed: column cast stored [N, M]    (2 + 1)
  ref colwise_t the reference compiled, amax pass included as torchao has it (x.abs().amax(0) -> scale -> cast
                -> transpose)
  transposed    to_float8_transposed: tensorwise cast with a given scale stored [N, M] (2 + 1)
  ref transposed  the same compiled (to_float8(x, scale).t().contiguous())
% of copy = (bytes read + written) / time, over a device-to-device copy's (read + write) / time, all timed by
triton.testing.do_bench_cudagraph. Read the columns as ratios between kernels: on the H100 run (2026-11-22)
the copy itself came out at 1.2-2.3 TB/s this way, below the ~3.0 TB/s benchmarks/mxfp8_quant.py measures
with its own CUDA-graph timing, so "% of copy" above 100 is an artefact of that reference, not a claim.

    python benchmarks/float8_cast.py            # GPU, ~1 min
    python benchmarks/float8_cast.py --smoke    # CPU, Triton interpreter, tiny shapes, no timing claims
Writes benchmarks/results/float8_cast-<device>-<date>.json.
"""
import argparse
import datetime
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(8192, 4096), (8192, 1024), (8192, 2816), (4096, 4096), (4096, 16384), (1024, 2048), (16384, 8192)]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    return p.parse_args()


ARGS = parse()
if ARGS.smoke or not torch.cuda.is_available():
    ARGS.smoke = True
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, ROOT)

from kernels import float8_cast as fc  # noqa: E402


def bench(fn):
    """median ms with CUDA graphs (no host overhead; these kernels run tens of microseconds)."""
    import triton
    return triton.testing.do_bench_cudagraph(fn, rep=50)


def same_bits(a, b):
    if a.dtype.itemsize == 1:
        return bool((a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)).all())
    return bool(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)))


def main():
    dev = "cpu" if ARGS.smoke else "cuda"
    shapes = [(96, 64), (64, 160)] if ARGS.smoke else SHAPES
    ref_row = fc.to_float8_rowwise_reference
    ref_col = fc.to_float8_colwise_transposed_reference

    def torchao_style_col(x):  # amax pass + cast + transpose, as the compiled recipe runs it
        return ref_col(x, fc.abs_amax(x, 0))

    def ref_t(x, scale):  # tensorwise transposing cast (grad-weight's x), as inductor runs it
        return fc.to_float8(x, scale, fc.E4M3).t().contiguous()

    if not ARGS.smoke:
        ref_row, torchao_style_col, ref_t = map(torch.compile, (ref_row, torchao_style_col, ref_t))
    rows = []
    for M, N in shapes:
        torch.manual_seed(0)
        x = torch.randn(M, N, device=dev, dtype=torch.bfloat16) * torch.logspace(-3, 3, N, device=dev)
        ours_r = fc.to_float8_rowwise(x, backend="triton")
        want_r = fc.to_float8_rowwise_reference(x)
        ours_c = fc.to_float8_colwise_transposed(x, ours_r[2], backend="triton")
        want_c = fc.to_float8_colwise_transposed_reference(x, want_r[2])
        sc = fc.amax_to_scale(fc.abs_amax(x, 0).max(), fc.E4M3)
        ours_t = fc.to_float8_transposed(x, sc, backend="triton")
        want_t = fc.to_float8_transposed(x, sc, backend="reference")
        exact = all(same_bits(a, b) for a, b in zip(ours_r + ours_c + (ours_t,), want_r + want_c + (want_t,)))
        row = dict(M=M, N=N, bit_exact=exact)
        if not ARGS.smoke:
            nbytes = M * N * 3
            dst = torch.empty_like(x)
            copy_ms = bench(lambda: dst.copy_(x))  # read 2 + write 2 bytes per element
            copy_bw = M * N * 4 / copy_ms / 1e9
            for name, fn in [("rowwise", lambda: fc.to_float8_rowwise(x, backend="triton")),
                             ("ref_rowwise", lambda: ref_row(x)),
                             ("colwise_t", lambda: fc.to_float8_colwise_transposed(x, ours_r[2], backend="triton")),
                             ("ref_colwise_t", lambda: torchao_style_col(x)),
                             ("transposed", lambda: fc.to_float8_transposed(x, sc, backend="triton")),
                             ("ref_transposed", lambda: ref_t(x, sc))]:
                ms = bench(fn)
                row[f"{name}_us"] = round(ms * 1e3, 1)
                row[f"{name}_pct_copy"] = round(100 * nbytes / ms / 1e9 / copy_bw, 1)
            row["copy_TBps"] = round(copy_bw, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if ARGS.smoke:
        assert all(r["bit_exact"] for r in rows), rows
        print("smoke: bit-exact")
        return
    print(f"\n{'M x N':>13s} {'rowwise us (%copy)':>20s} {'ref':>16s} {'colwise_t':>16s} {'ref (+amax)':>16s} "
          f"{'transposed':>16s} {'ref':>16s} exact")
    for r in rows:
        print(f"{r['M']:>6d}x{r['N']:<6d} " + " ".join(
            f"{r[k + '_us']:>8.1f} ({r[k + '_pct_copy']:5.1f}%)".rjust(16 if i else 20)
            for i, k in enumerate(["rowwise", "ref_rowwise", "colwise_t", "ref_colwise_t", "transposed",
                                   "ref_transposed"])) + f" {r['bit_exact']}")
    import triton
    res = dict(benchmark="float8_cast", device=torch.cuda.get_device_name(),
               date=datetime.datetime.utcnow().isoformat() + "Z",
               versions=dict(torch=torch.__version__, triton=triton.__version__),
               command=" ".join([os.path.basename(sys.executable)] + sys.argv), results=rows)
    os.makedirs(ARGS.out, exist_ok=True)
    path = os.path.join(ARGS.out, f"float8_cast-{res['device'].replace(' ', '_')}-{datetime.date.today()}.json")
    json.dump(res, open(path, "w"), indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
