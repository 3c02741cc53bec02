"""FSDP2 float8 all-gather on 2 GPUs: does it pay? bf16 vs torchao float8 vs titan_fp8 float8, in one run.

Setup of anchors/fsdp_fp8_probe.py (8 Llama-3-8B-shaped blocks: wq, wo 4096x4096, w1/w3 4096->14336,
w2 14336->4096, RMSNorms; 8192 tokens per GPU; bf16 params, fp32 reduce; per-block torch.compile; AdamW fused)
plus the llama_moe model (titan_fp8.models.llama_moe, fewer layers with --moe-layers):

  bf16               no float8
  ao_fp8             torchao float8 tensorwise, bf16 all-gather
  ao_fp8_ag          torchao + float8 all-gather
  ao_fp8_ag_pre      torchao + float8 all-gather + precompute (per torchao docs: after optimizer.step)
  ours_fp8           titan_fp8 tensorwise, bf16 all-gather
  ours_fp8_ag        titan_fp8 + float8 all-gather (ONE AMAX all-reduce per step, made by the first gather)
  ours_fp8_ag_pre    titan_fp8 + float8 all-gather + precompute (ONE all-reduce per step after optimizer.step,
                     incl. step 1; each gather casts its shard in one fused kernel, no cached casts)
  moe_bf16 / moe_ours_fp8 / moe_ours_fp8_ag_pre    the llama_moe model

NCCL_MAX_CTAS must be set before the process group starts, so the launcher re-runs torchrun per value.
A torch.profiler pass (rank 0) splits GPU time into NCCL all-gather / reduce-scatter / all-reduce, GEMMs,
compiled (Triton) kernels, eager elementwise kernels (the casts FSDP hooks run), copies, and measures
EXPOSED communication (NCCL kernel time with no compute kernel running beside it).

GPU (the lead):  python benchmarks/fsdp_float8.py                 # ~7-8 min on 2 H200s (torch 2.11, torchao 0.18)
                 python benchmarks/fsdp_float8.py --ctas unset --modes bf16,ours_fp8_ag_pre --steps 15
CPU smoke:       python benchmarks/fsdp_float8.py --smoke          # 2 processes, gloo, tiny shapes, emulate
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROBE_MODES = ["bf16", "ao_fp8", "ao_fp8_ag", "ao_fp8_ag_pre", "ours_fp8", "ours_fp8_ag", "ours_fp8_ag_pre"]
MOE_MODES = ["moe_bf16", "moe_ours_fp8_ag_pre"]  # + moe_ours_fp8 on request
SWEEP_MODES = ["bf16", "ours_fp8", "ours_fp8_ag_pre"]
PROFILE_MODES = ["bf16", "ao_fp8", "ao_fp8_ag_pre", "ours_fp8", "ours_fp8_ag_pre"]


# ------------------------------------------------------------------------------------------------ worker
def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from titan_fp8.models.probe_block import ProbeBlock

    smoke = args.smoke
    backend = "gloo" if smoke else "nccl"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        D, HID, LAYERS, TOKENS = 64, 128, 2, 64
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda")
        D, HID, LAYERS, TOKENS = 4096, 14336, args.layers, args.tokens
    mesh = init_device_mesh(device.type, (world,))
    pdt = torch.float32 if smoke else torch.bfloat16
    mp = MixedPrecisionPolicy(param_dtype=pdt, reduce_dtype=torch.float32)

    def Block():
        return ProbeBlock(D, HID)

    def convert(m, mode):
        ag, pre = "_ag" in mode, mode.endswith("_pre")
        if "ao_fp8" in mode:
            from torchao.float8 import Float8LinearConfig
            from torchao.float8 import convert_to_float8_training as ao_convert
            ao_convert(m, config=Float8LinearConfig(enable_fsdp_float8_all_gather=ag, emulate=smoke))
            if pre:
                from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp as ao_pre
                return ao_pre, False
        elif "ours_fp8" in mode:
            from titan_fp8.float8 import Float8Config, convert_to_float8_training
            from titan_fp8.float8 import precompute_float8_dynamic_scale_for_fsdp as our_pre
            convert_to_float8_training(m, Float8Config(
                enable_fsdp_float8_all_gather=ag, precompute_float8_dynamic_scale_for_fsdp=pre, emulate=smoke))
            if pre:
                return our_pre, True  # ours: also once at start-up
        return None, False

    def build(mode):
        torch.manual_seed(0)
        if mode.startswith("moe_"):
            from titan_fp8.models.llama_moe import Transformer, flavor
            margs = flavor("debug") if smoke else flavor("llama_moe", n_layers=args.moe_layers)
            with device:
                m = Transformer(margs)
            blocks = list(m.layers.values())
        else:
            with device:
                m = nn.Sequential(*[Block() for _ in range(LAYERS)])
            blocks = list(m)
        pre, at_start = convert(m, mode)
        for b in blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp)
            if not args.no_compile and (not smoke or args.compile_backend != "inductor"):
                b.compile(backend=args.compile_backend)
        fully_shard(m, mesh=mesh, mp_policy=mp)
        if pre is not None and at_start:
            pre(m)
        return m, pre

    def make_batch(mode):
        g = torch.Generator(device=device).manual_seed(rank)
        if mode.startswith("moe_"):
            seq = 64 if smoke else 4096
            return torch.randint(0, 256, (max(1, TOKENS // seq), seq), device=device, generator=g)
        return torch.randn(TOKENS, D, device=device, dtype=pdt, generator=g)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(m, opt, pre, x):
        out = m(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if pre is not None:
            pre(m)
        return loss

    import torch._dynamo
    # every mode compiles the same Block.forward with other module types: reset between modes (the on-disk
    # inductor cache keeps recompiles cheap) and allow enough variants per code object
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    results = []
    for mode in args.modes.split(","):
        rec = dict(mode=mode, nccl_max_ctas=os.environ.get("NCCL_MAX_CTAS", "unset"))
        t_mode = time.time()
        torch._dynamo.reset()
        try:
            # the previous mode's model sits in reference cycles (FSDP hooks, float8 scale groups): collect it
            # so that this mode's peak is its own (without this, later modes inherited GiBs from earlier ones)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                rec["start_gib"] = round(torch.cuda.memory_allocated() / 2**30, 3)
            m, pre = build(mode)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=device.type == "cuda")
            x = make_batch(mode)
            times, losses = [], []
            warm = min(args.warmup, args.steps - 1)
            for i in range(args.steps):
                sync()
                t0 = time.perf_counter()
                loss = step(m, opt, pre, x)
                sync()
                if i >= warm:
                    times.append(time.perf_counter() - t0)
                losses.append(round(loss.item(), 6))
            med = statistics.median(times)
            rec.update(step_ms=round(med * 1e3, 2), tokens_per_s_per_gpu=round(TOKENS / med),
                       first_loss=losses[0], last_loss=losses[-1])
            if device.type == "cuda":
                rec["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            if args.profile and mode in args.profile_modes.split(","):
                rec["profile"] = profile_steps(m, opt, pre, x, step, device, rank, args.profile_steps)
            del m, opt
        except Exception as e:  # record and go on: every mode gets its row
            import traceback
            rec["error"] = repr(e)[:400]
            if rank == 0:
                traceback.print_exc()
        rec["wall_s"] = round(time.time() - t_mode, 1)
        results.append(rec)
        if rank == 0:
            print(json.dumps({k: v for k, v in rec.items() if k != "profile"}), flush=True)
        dist.barrier()
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


def _union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _minus(a, b):
    """total length of union(a) not covered by union(b)"""
    a, b = _union(a), _union(b)
    total, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def categorize(name: str) -> str:
    n = name.lower()
    if "nccl" in n or "allgather" in n or "reducescatter" in n or "allreduce" in n:
        if "allgather" in n:
            return "nccl_all_gather"
        if "reducescatter" in n or "reduce_scatter" in n:
            return "nccl_reduce_scatter"
        if "allreduce" in n:
            return "nccl_all_reduce"
        return "nccl_other"
    if any(k in n for k in ("gemm", "sm90", "cutlass", "nvjet", "xmma", "scaled_mm", "cublas")):
        return "gemm"
    if n.startswith("triton"):
        return "compiled_triton"
    if "multi_tensor_apply" in n or "foreach" in n:
        return "foreach (optimizer, foreach_norm)"
    if any(k in n for k in ("elementwise", "reduce_kernel", "vectorized", "unrolled")):
        return "eager_elementwise (hook casts, amax)"
    if "copy" in n or "cat" in n or "memcpy" in n or "memset" in n:
        return "copies"
    return "other"


def profile_steps(m, opt, pre, x, step, device, rank, n_steps):
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(n_steps):
            step(m, opt, pre, x)
        if device.type == "cuda":
            torch.cuda.synchronize()
    if rank != 0:
        return None
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    cat_ms, cat_n, comm, compute, fsdp_cpu = {}, {}, [], [], {}
    for ev in events:
        if ev.get("ph") != "X":
            continue
        name, dur, ts = ev.get("name", ""), float(ev.get("dur", 0)), float(ev.get("ts", 0))
        if ev.get("cat") == "kernel":
            c = categorize(name)
            cat_ms[c] = cat_ms.get(c, 0.0) + dur / 1e3
            cat_n[c] = cat_n.get(c, 0) + 1
            (comm if c.startswith("nccl") else compute).append((ts, ts + dur))
        elif name.startswith("FSDP::") or name.startswith("Float8") or "precompute" in name:
            fsdp_cpu[name] = fsdp_cpu.get(name, 0.0) + dur / 1e3
    per = 1.0 / n_steps
    return dict(
        gpu_ms_per_step={k: round(v * per, 3) for k, v in sorted(cat_ms.items(), key=lambda kv: -kv[1])},
        kernels_per_step={k: round(v * per, 1) for k, v in sorted(cat_n.items(), key=lambda kv: -kv[1])},
        exposed_comm_ms_per_step=round(_minus(comm, compute) / 1e3 * per, 3),
        comm_ms_per_step=round(sum(e - s for s, e in _union(comm)) / 1e3 * per, 3),
        fsdp_cpu_ms_per_step={k: round(v * per, 3) for k, v in sorted(fsdp_cpu.items(), key=lambda kv: -kv[1])[:12]},
    )


# ------------------------------------------------------------------------------------------------ launcher
def launch(args, passthrough):
    import torch

    ctas_values = args.ctas.split(",")
    nproc = args.nproc
    all_rows = []
    t_start = time.time()
    for i, ctas in enumerate(ctas_values):
        env = dict(os.environ)
        env.pop("NCCL_MAX_CTAS", None)
        if ctas != "unset":
            env["NCCL_MAX_CTAS"] = ctas
        if args.smoke:
            env.setdefault("OMP_NUM_THREADS", "1")
            env.setdefault("TRITON_INTERPRET", "1")
        modes = args.modes if i == 0 else args.sweep_modes
        fd, out = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               os.path.abspath(__file__), "--worker", "--modes", modes, "--json-out", out] + passthrough
        if i == 0 and args.profile:
            cmd.append("--profile")
        print(f"== NCCL_MAX_CTAS={ctas}: {' '.join(cmd)}", flush=True)
        rc = subprocess.call(cmd, env=env)
        try:
            rows = json.load(open(out))
        except Exception:
            rows = [dict(mode=m, nccl_max_ctas=ctas, error=f"launcher: torchrun exited {rc}, no results")
                    for m in modes.split(",")]
        os.unlink(out)
        all_rows += rows
    base = {}
    for r in all_rows:
        if r["mode"] in ("bf16", "moe_bf16") and "step_ms" in r:
            base[(r["mode"].startswith("moe_"), r["nccl_max_ctas"])] = r["step_ms"]
    for r in all_rows:
        b = base.get((r["mode"].startswith("moe_"), r["nccl_max_ctas"]))
        if b and "step_ms" in r:
            r["speedup_vs_bf16"] = round(b / r["step_ms"], 3)
    # the claims, stated from the numbers
    by = {(r["mode"], r["nccl_max_ctas"]): r for r in all_rows if "step_ms" in r}
    claims = {}
    for ctas in ctas_values:
        ours, ours_bf16ag = by.get(("ours_fp8_ag_pre", ctas)), by.get(("ours_fp8", ctas))
        aos = [by[(m, ctas)] for m in ("ao_fp8", "ao_fp8_ag", "ao_fp8_ag_pre") if (m, ctas) in by]
        if ours and ours_bf16ag:
            c = dict(ours_ag_pre_vs_ours_bf16_ag=round(ours_bf16ag["step_ms"] / ours["step_ms"], 3))
            if aos:
                best = min(aos, key=lambda r: r["step_ms"])
                c.update(torchao_best=best["mode"],
                         ours_ag_pre_vs_torchao_best=round(best["step_ms"] / ours["step_ms"], 3),
                         peak_gib_ours=ours.get("peak_gib"), peak_gib_torchao_best=best.get("peak_gib"))
            claims[ctas] = c
    print(f"\n{'mode':22s} {'NCCL_MAX_CTAS':>13s} {'step ms':>9s} {'x bf16':>7s} {'peak GiB':>9s}  note")
    for r in all_rows:
        print(f"{r['mode']:22s} {r['nccl_max_ctas']:>13s} {r.get('step_ms', float('nan')):>9} "
              f"{r.get('speedup_vs_bf16', ''):>7} {r.get('peak_gib', ''):>9}  {r.get('error', '')[:80]}")
    for r in all_rows:
        if r.get("profile"):
            p = r["profile"]
            print(f"\nprofile {r['mode']}: exposed comm {p['exposed_comm_ms_per_step']} ms/step of "
                  f"{p['comm_ms_per_step']} ms comm; GPU ms/step {p['gpu_ms_per_step']}; "
                  f"kernels/step {p['kernels_per_step']}")
    print("\nclaims:", json.dumps(claims))
    versions = {"torch": torch.__version__}
    for mod in ("triton", "torchao"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result = dict(benchmark="fsdp_float8", device=f"{nproc}x {dev}", date=datetime.datetime.utcnow().isoformat() + "Z",
                  versions=versions, command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                  smoke=args.smoke, wall_s=round(time.time() - t_start, 1), claims=claims, results=all_rows)
    os.makedirs(args.out, exist_ok=True)
    tag = "smoke" if args.smoke else dev.replace(" ", "_")
    path = os.path.join(args.out, f"fsdp_float8-{tag}-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path} ({result['wall_s']} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny shapes, emulate, no compile")
    ap.add_argument("--modes", default=None, help=f"comma list; default {PROBE_MODES + MOE_MODES}")
    ap.add_argument("--sweep-modes", default=",".join(SWEEP_MODES), help="modes for NCCL_MAX_CTAS values after the first")
    ap.add_argument("--ctas", default="unset,16,8", help="NCCL_MAX_CTAS values, one torchrun each ('unset' = default)")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--moe-layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend per block (smoke: compiled only if not inductor, e.g. aot_eager)")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--profile", dest="profile", action="store_true")
    ap.add_argument("--profile-modes", default=",".join(PROFILE_MODES))
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.set_defaults(profile=None)
    args = ap.parse_args()
    if args.modes is None:
        args.modes = ",".join(PROBE_MODES + MOE_MODES)
        if args.smoke:  # gloo cannot all-gather float8 (FACTS.md): torchao's float8 all-gather fails there
            args.modes = ",".join(m for m in PROBE_MODES + MOE_MODES if not m.startswith("ao_fp8_ag"))
    if args.worker:
        args.profile = bool(args.profile)
        worker(args)
        return
    if args.profile is None:
        args.profile = True
    passthrough = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--layers={args.layers}",
                   f"--moe-layers={args.moe_layers}", f"--tokens={args.tokens}",
                   f"--profile-modes={args.profile_modes}", f"--profile-steps={args.profile_steps}"]
    if args.smoke:
        passthrough.append("--smoke")
        args.sweep_modes = ",".join(m for m in args.sweep_modes.split(",") if m in args.modes.split(","))
    if args.no_compile:
        passthrough.append("--no-compile")
    passthrough.append(f"--compile-backend={args.compile_backend}")
    launch(args, passthrough)


if __name__ == "__main__":
    main()
