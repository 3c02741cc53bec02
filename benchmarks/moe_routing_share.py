"""How much of an MoE block's fwd+bwd time goes to routing (route / permute / unpermute) vs experts.

Builds `--layers` llama_moe TransformerBlocks in bf16 on one GPU, runs fwd+bwd on `--tokens` tokens
and reports
  (a) step time, eager and torch.compile'd (per block, as the trainer compiles),
  (b) the share of GPU time (torch.profiler, eager) under the MoE scopes moe.route / moe.permute /
      moe.unpermute (= routing), moe.experts, and the rest (attention, norms, shared expert, ...).
      Backward kernels are attributed to the scope of the forward op that created their autograd
      node (matched by sequence number), so each share counts forward + backward.

GPU:   python benchmarks/moe_routing_share.py                   (llama_moe, 2 layers, 8192 tokens)
CPU:   python benchmarks/moe_routing_share.py --smoke           (debug shapes, checks that it runs)

Prints a table; writes benchmarks/results/moe_routing_share-<device>-<date>.json (with --smoke: a
temporary folder unless --out is given).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from titan_fp8.models.llama_moe import FLAVORS, TransformerBlock, rope_tables  # noqa: E402

SCOPES = ("moe.route", "moe.permute", "moe.experts", "moe.unpermute")
ROUTING = ("moe.route", "moe.permute", "moe.unpermute")


class Blocks(torch.nn.Module):
    def __init__(self, args, n_layers: int, align: int | None):
        super().__init__()
        self.layers = torch.nn.ModuleList(TransformerBlock(i, args) for i in range(n_layers))
        for layer in self.layers:
            layer.init_weights()
            if align is not None and layer.is_moe:
                layer.moe.token_group_align = align

    def forward(self, x, cos, sin):
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, device, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def scope_of(ev):
    """Forward scope that encloses a profiler event, or None."""
    while ev is not None:
        if ev.name in SCOPES:
            return ev.name
        ev = ev.cpu_parent
    return None


def autograd_node_of(ev):
    while ev is not None:
        if ev.name.startswith("autograd::engine::evaluate_function"):
            return ev
        ev = ev.cpu_parent
    return None


def attribute(events, on_gpu: bool) -> dict[str, float]:
    """Self time (GPU kernels, or CPU time without a GPU) per category, forward + backward."""
    seq_scope: dict[int, str] = {}
    for ev in events:
        if ev.sequence_nr >= 0 and autograd_node_of(ev) is None:
            scope = scope_of(ev)
            if scope is not None:
                seq_scope.setdefault(ev.sequence_nr, scope)
    totals = {name: 0.0 for name in SCOPES}
    totals["rest"] = 0.0
    for ev in events:
        t = ev.self_device_time_total if on_gpu else ev.self_cpu_time_total
        if not t:
            continue
        node = autograd_node_of(ev)
        if node is None:
            category = scope_of(ev) or "rest"
        else:
            category = seq_scope.get(node.sequence_nr, "rest")
        totals[category] += t
    return totals


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="llama_moe", choices=sorted(FLAVORS))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--align", type=int, default=None, help="MoE.token_group_align (default: the layer's)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--smoke", action="store_true", help="debug shapes, few iterations; runs on CPU")
    p.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results)")
    a = p.parse_args(argv)

    if a.smoke:
        a.flavor, a.tokens, a.seq_len, a.warmup, a.iters = "debug", 256, 128, 1, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not a.smoke:
        sys.exit("moe_routing_share: no CUDA device; run with --smoke to check the script on CPU")
    if a.tokens % a.seq_len:
        sys.exit(f"moe_routing_share: --tokens {a.tokens} must be a multiple of --seq-len {a.seq_len}")

    # every block routed (the flavor's dense blocks would dilute the MoE share)
    args = dataclasses.replace(FLAVORS[a.flavor], n_layers=a.layers, n_dense_layers=0,
                               max_seq_len=max(a.seq_len, FLAVORS[a.flavor].max_seq_len))
    torch.manual_seed(0)
    with torch.device(device):
        model = Blocks(args, a.layers, a.align).to(torch.bfloat16)
    batch = a.tokens // a.seq_len
    cos, sin = rope_tables(args.head_dim, a.seq_len, args.rope_theta, device=device)
    x = torch.randn(batch, a.seq_len, args.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def make_step(fn):
        def step():
            model.zero_grad(set_to_none=True)
            x.grad = None
            fn(x, cos, sin).backward(dy)
        return step

    result = {"eager_ms": None, "compiled_ms": None, "compile_error": None}
    eager = time_steps(make_step(model), device, a.warmup, a.iters)
    result["eager_ms"] = statistics.median(eager)
    if not a.no_compile:
        try:
            compiled_layers = [torch.compile(layer) for layer in model.layers]  # same parameters

            def compiled(h, cos, sin):
                for layer in compiled_layers:
                    h = layer(h, cos, sin)
                return h

            result["compiled_ms"] = statistics.median(time_steps(make_step(compiled), device, a.warmup, a.iters))
        except Exception as e:  # report, don't hide: the eager numbers still stand
            result["compile_error"] = repr(e)[:500]

    # (c) what grouped_mm's padding-row masks cost against bare torch._grouped_mm (experts only, eager)
    experts = model.layers[0].moe.experts
    pairs = a.tokens * args.moe.top_k
    per = pairs // args.moe.num_experts
    offs = torch.arange(1, args.moe.num_experts + 1, device=device, dtype=torch.int32) * per
    offs[-1] = pairs
    xe = torch.randn(pairs, args.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    dye = torch.randn_like(xe)

    def bare_experts():
        h1, h3 = torch._grouped_mm(xe, experts.w13.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        h = torch.nn.functional.silu(h1) * h3
        w2 = experts.w2
        torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs).backward(dye)

    def our_experts():
        experts(xe, offs).backward(dye)

    experts_ms = {}
    for name, fn in (("bare_torch_grouped_mm", bare_experts), ("titan_fp8_grouped_mm", our_experts)):
        try:
            experts_ms[name] = statistics.median(time_steps(fn, device, a.warmup, a.iters))
        except Exception as e:
            experts_ms[name] = repr(e)[:300]
    model.zero_grad(set_to_none=True)
    del xe, dye

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    step = make_step(model)
    step()
    sync(device)
    prof_iters = 3
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(prof_iters):
            step()
        sync(device)
    totals = attribute(prof.events(), on_gpu=device.type == "cuda")
    grand = sum(totals.values()) or 1.0
    shares = {k: v / grand for k, v in totals.items()}
    shares["routing(route+permute+unpermute)"] = sum(shares[k] for k in ROUTING)
    per_step_ms = {k: v / prof_iters / 1e3 for k, v in totals.items()}  # profiler times are in us

    moe0 = model.layers[0].moe
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{platform.machine()}"
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    now = dt.datetime.now(dt.timezone.utc)
    record = {
        "benchmark": "moe_routing_share",
        "device": device_name,
        "date": now.isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "?"] + sys.argv[1:]),
        "shape": {"flavor": a.flavor, "layers": a.layers, "tokens": a.tokens, "seq_len": a.seq_len,
                  "dim": args.dim, "experts": args.moe.num_experts, "top_k": args.moe.top_k,
                  "expert_hidden": args.moe.hidden_dim, "shared_hidden": args.moe.shared_hidden_dim,
                  "token_group_align": moe0.token_group_align, "dtype": "bfloat16"},
        "step_ms": {"eager": result["eager_ms"], "compiled": result["compiled_ms"]},
        "compile_error": result["compile_error"],
        "time_basis": "cuda kernel self time" if device.type == "cuda" else "cpu self time",
        "share_eager": shares,
        "per_step_ms_eager_profiled": per_step_ms,
        "experts_fwd_bwd_ms_eager_balanced": experts_ms,
        "tokens_per_expert_layer0": moe0.tokens_per_expert.tolist(),
        "smoke": a.smoke,
    }

    print(f"moe_routing_share  {device_name}  torch {torch.__version__}  triton {triton_version}")
    print(f"{a.flavor}: {a.layers} MoE blocks, {a.tokens} tokens (seq {a.seq_len}), dim {args.dim}, "
          f"E={args.moe.num_experts} top{args.moe.top_k}, align {moe0.token_group_align}")
    comp = f"{result['compiled_ms']:.3f}" if result["compiled_ms"] is not None else f"n/a {result['compile_error'] or ''}"
    print(f"step fwd+bwd   eager {result['eager_ms']:.3f} ms   compiled {comp} ms")
    print(f"{'category':36s} {'share':>7s} {'ms/step':>9s}")
    for k in (*ROUTING, "moe.experts", "rest"):
        print(f"{k:36s} {shares[k] * 100:6.1f}% {per_step_ms[k]:9.3f}")
    print(f"{'routing(route+permute+unpermute)':36s} {shares['routing(route+permute+unpermute)'] * 100:6.1f}%")
    print("experts fwd+bwd (balanced groups, eager): "
          + ", ".join(f"{k} {v:.3f} ms" if isinstance(v, float) else f"{k} {v}" for k, v in experts_ms.items()))

    out_dir = a.out or (tempfile.mkdtemp(prefix="moe_routing_share_") if a.smoke else
                        os.path.join(ROOT, "benchmarks", "results"))
    os.makedirs(out_dir, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-")
    path = os.path.join(out_dir, f"moe_routing_share-{slug}-{now.strftime('%Y-%m-%d')}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
