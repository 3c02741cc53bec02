"""Instruction counts of the Gluon mx32 mainloops from the SASS, on CPU (no GPU needed).

Compiles a kernel of kernels/grouped_gemm/gluon_mx.py for sm_90a (compile_sm90: triton's bundled ptxas),
disassembles the cubin with triton's nvdisasm and finds the loops (backward branches before the last EXIT; the
mbarrier retry stubs after it are left out). For every innermost loop that issues wgmmas (QGMMA) it prints the
instructions of one pass through the loop body, per 32-step (= per wgmma: each consumer warp issues one wgmma
per step), split into FFMA (the promotion), uniform-datapath (U*: descriptors, uniform scale decode), decode ALU
(LOP3/IADD3/SHF/LEA/PRMT/FMUL/...), barriers/sync and the rest. The steady-state loop of a consumer is the one
with the most QGMMAs; a WS=2 kernel has one copy per consumer partition (two identical loops), a WS=1 kernel one.

usage:
  python benchmarks/gluon_sass_count.py [--kernel nt|wgrad] [--dump DIR] NAME_OR_CONFIG ...
NAME: a key of benchmarks/mxfp8_grouped_gemm_gluon.py CONFIGS ("default", "m5p", ...; for a name the fprop/dgrad
config is used with --kernel nt and the wgrad one with --kernel wgrad) or a config tuple such as
"(128,128,4,8,5,8,4,4,2,1)". --dump writes the SASS of each config there.
"""
import argparse
import ast
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRA = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
DECODE = {"LOP3", "IADD3", "SHF", "LEA", "PRMT", "FMUL", "IMAD", "SGXT", "BMSK", "ISETP", "SEL", "FSEL", "I2F",
          "MOV", "IABS", "FADD", "BFE", "BFI", "POPC", "FLO", "VIADD", "IMNMX", "LEA.HI"}
SYNC = {"BAR", "SYNCS", "WARPGROUP", "DEPBAR", "WARPSYNC", "BSSY", "BSYNC", "NOP", "R2UR", "ELECT", "VOTE", "VOTEU"}


def opcode(text):
    t = text.strip()
    if t.startswith("@"):
        t = t.split(None, 1)[1]
    return t.split()[0].split(".")[0]


def parse(sass):
    insns, labels = [], {}
    for line in sass.splitlines():
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = INSN.match(line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2)))
    return insns, labels


def loops(insns, labels):
    """Innermost loops (back edges before the last EXIT) that contain a wgmma: (first, last) instruction index."""
    last_exit = max((i for i, (_, t) in enumerate(insns) if opcode(t) == "EXIT"), default=len(insns))
    cand = []
    for i, (_, t) in enumerate(insns):
        m = BRA.search(t)
        if m and i < last_exit and labels.get(m.group(1), i + 1) <= i:
            lo = labels[m.group(1)]
            if any(opcode(insns[k][1]) in ("QGMMA", "HGMMA") for k in range(lo, i + 1)):
                cand.append((lo, i))
    return [c for c in cand if not any(o != c and c[0] <= o[0] and o[1] <= c[1] for o in cand)]


def count(insns, lo, hi):
    ops = collections.Counter(opcode(insns[k][1]) for k in range(lo, hi + 1))
    n = sum(ops.values())
    steps = ops["QGMMA"] + ops["HGMMA"]
    ffma = ops["FFMA"]
    uni = sum(v for k, v in ops.items() if k.startswith("U") or k == "R2UR")
    dec = sum(v for k, v in ops.items() if k in DECODE)
    syn = sum(v for k, v in ops.items() if k in SYNC and k != "R2UR")
    ld = sum(v for k, v in ops.items() if k.startswith("LD"))
    return dict(insns=n, bytes=16 * n, steps=steps, per_step=n / max(steps, 1), ffma=ffma / max(steps, 1),
                uniform=uni / max(steps, 1), decode=dec / max(steps, 1), sync=syn / max(steps, 1),
                ldg=ld / max(steps, 1), other=(n - ffma) / max(steps, 1), ops=ops)


def resolve(spec, kernel):
    if spec.startswith("("):
        return tuple(ast.literal_eval(spec))
    from benchmarks.mxfp8_grouped_gemm_gluon import CONFIGS
    c = CONFIGS[spec]
    if isinstance(c, tuple) and len(c) == 2 and (c[0] is None or isinstance(c[0], tuple)):
        c = c[0] if kernel == "nt" else c[1]
    if c is None:  # the measured defaults (compile_sm90 with None would drop the persistent flag)
        from kernels.grouped_gemm.gluon_mx import DEFAULT_CONFIG, WGRAD_DEFAULT_CONFIG
        c = DEFAULT_CONFIG if kernel == "nt" else WGRAD_DEFAULT_CONFIG
    return c


def analyse(kernel, config, dump=None, name=None):
    import triton

    from kernels.grouped_gemm.gluon_mx import compile_sm90
    _, log, cubin = compile_sm90(kernel, config, "bf16" if kernel == "nt" else "fp32", with_cubin=True)
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, f"{kernel}_{name or 'cfg'}.sass"), "w") as f:
            f.write(sass)
    insns, labels = parse(sass)
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    res = dict(regs=int(regs.group(1)) if regs else None, spill=spill.groups() if spill else None,
               c75=("C75" in log or "Potential Performance Loss" in log), code_bytes=16 * len(insns), loops=[])
    for lo, hi in loops(insns, labels):
        c = count(insns, lo, hi)
        c["addr"] = insns[lo][0]
        res["loops"].append(c)
    return res, log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--kernel", default="nt", choices=("nt", "wgrad"))
    ap.add_argument("--dump", default=None)
    ap.add_argument("--ops", action="store_true", help="print the opcode histogram of the steady-state loop")
    args = ap.parse_args()
    print(f"kernel {args.kernel}: per 32-step (one wgmma) per consumer warp, steady-state loop(s)")
    print(f"{'config':>28} {'regs':>4} {'spill':>7} {'C75':>3} {'code KB':>7} | {'loop@':>6} {'KB':>5} {'steps':>5} "
          f"{'total':>6} {'FFMA':>5} {'other':>6} {'unif':>5} {'decode':>6} {'sync':>5} {'LDG':>4}")
    for spec in args.configs:
        cfg = resolve(spec, args.kernel)
        res, log = analyse(args.kernel, cfg, args.dump, spec if not spec.startswith("(") else None)
        main_steps = max((c["steps"] for c in res["loops"]), default=0)
        head = (f"{spec:>28} {res['regs']:>4} {'/'.join(res['spill'] or ('?',)):>7} {'YES' if res['c75'] else 'no':>3} "
                f"{res['code_bytes'] / 1024:>7.1f}")
        for c in res["loops"]:
            mark = "*" if c["steps"] == main_steps else " "
            print(f"{head} |{mark}{c['addr']:>6x} {c['bytes'] / 1024:>5.1f} {c['steps']:>5} {c['per_step']:>6.1f} "
                  f"{c['ffma']:>5.1f} {c['other']:>6.1f} {c['uniform']:>5.1f} {c['decode']:>6.1f} {c['sync']:>5.1f} "
                  f"{c['ldg']:>4.2f}")
            head = " " * len(head)
            if args.ops and mark == "*":
                print("       ", " ".join(f"{k}:{v}" for k, v in c["ops"].most_common()))
        if not res["loops"]:
            print(head, "| no wgmma loop found")
        if res["c75"]:
            print("\n".join(l for l in log.splitlines() if "C75" in l or "Performance" in l)[:2000])


if __name__ == "__main__":
    main()
