"""Project llama_moe's step time from the measured 2-GPU run to 8, 64 and 512 GPUs: FSDP/HSDP vs expert
parallelism, and what float8 all-gather and float8 dispatch save there. A model, not a measurement.

    python benchmarks/scale_model.py [--config train_configs/llama_moe.toml]
        [--measured benchmarks/results/llama_moe_e2e_x2/summary.json] [--compute-ms-per-layer X]
        [--measured-run bf16] [--measured-ep RUN | --ep-host-ms-per-layer X]
        [--nvlink-gbs 450] [--internode-gbits 400] [--overlap 0.5] [--gpus 8,64,512] [--out DIR]

Inputs
  measured   the bf16 run of llama_moe on 2 H200s (FSDP, median tokens/s/GPU): step time = local tokens / that.
             Compute per step = measured step - its exposed communication under the same model (below), unless
             --compute-ms-per-layer gives it (x n_layers). Weak scaling: every GPU keeps its local batch, so its
             compute stays constant (EP moves tokens, not FLOPs; routing assumed balanced).
  bytes      from the model config itself (parameters instantiated on the meta device): per parameter group
             (float8-able Linear weights, routed experts, the rest: embeddings, norms, router, output head),
             per MoE layer the routed rows (local tokens x top_k x dim).
Communication per GPU and step (S = GPUs per node = the FSDP shard group, R = GPUs / S replicas, HSDP)
  FSDP       all-gather of the weights twice (forward; backward re-gathers: reshard_after_forward), bf16 or
             float8 (1 byte; scales neglected: < 1% for tensorwise / rowwise / mx128), (S-1)/S of the bytes over
             NVLink; reduce-scatter of fp32 grads, (S-1)/S over NVLink; all-reduce of the grad shard across the
             R replicas, 2 (R-1)/R of (params x 4 / S) between nodes (ring).
  EP         ep = min(num_experts, S) inside a node: experts are not gathered (ep == S: each GPU holds its own),
             their fp32 grad shard all-reduced across replicas; per MoE layer: dispatch (bf16 2 bytes, or float8:
             dim + dim/32 bytes per row, mxfp8 layout), combine bf16, backward the two reverse all-to-alls in bf16,
             each (ep-1)/ep of the rows over NVLink (activation checkpointing would repeat the forward pair; the
             config's mode is read).
  EP host    what EP costs beyond its bytes, per MoE layer and step: the host sync of the split sizes, the eagerly
             run dispatch / combine (a graph break per layer), the regrouping. Bytes alone projected EP at
             0.96-1.00x FSDP; two H200s measured 0.72x (session 39, benchmarks/results/issue11_12_s39/). --measured-ep
             RUN calibrates it from an EP=2 run of the same summary: (its step - the model's EP step at 2 GPUs) /
             MoE layers, i.e. everything the bytes do not explain; it then adds to every EP step. Default 0 (bytes
             only). It was measured on a host-paced machine, so it is that host's figure.
Overlap
  FSDP traffic overlaps with compute: exposed = max(0, fsdp_time - overlap x compute). The all-to-alls sit on
  the critical path (routing -> dispatch -> experts -> combine; no overlap, as in torchtitan's default).
  step = compute + exposed FSDP + all-to-all (+ EP host).
Sensitivity: each assumption x2 and /2 at the largest GPU count; the table names the one that moves the answers
(the two float8 savings and the EP-vs-FSDP ratio) most.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

GB = 1e9
DEFAULTS = {"nvlink_gbs": 450.0, "internode_gbits": 400.0, "overlap": 0.5, "gpus_per_node": 8,
            "ep_host_s_per_layer": 0.0}
SCENARIOS = ("fsdp_bf16", "fsdp_f8ag", "ep_bf16", "ep_f8dispatch")


def model_sizes(config: str) -> dict:
    """Parameter counts by group and the per-layer activation sizes, from the config (meta device)."""
    import torch

    from titan_fp8.config import load_config
    from titan_fp8.models.llama_moe import Transformer

    cfg = load_config(config, [], world_size=2)
    args = cfg.model_args()
    with torch.device("meta"):
        model = Transformer(args)
    groups = {"float8_linear": 0, "experts": 0, "other": 0}
    for name, p in model.named_parameters():
        if ".experts." in name:
            groups["experts"] += p.numel()
        elif p.dim() == 2 and not any(s in name for s in ("tok_embeddings", "output", "router")):
            groups["float8_linear"] += p.numel()
        else:
            groups["other"] += p.numel()
    return {"params": groups, "dim": args.dim, "n_layers": args.n_layers,
            "n_moe_layers": args.n_layers - args.n_dense_layers, "num_experts": args.moe.num_experts,
            "top_k": args.moe.top_k, "local_tokens": cfg.training.local_batch_size * cfg.training.seq_len,
            "ac_mode": cfg.activation_checkpoint.mode}


def comm_seconds(sizes: dict, gpus: int, scenario: str, a: dict) -> dict:
    """Per-GPU communication time of one step, by kind (seconds)."""
    S = min(gpus, a["gpus_per_node"])
    R = gpus // S
    nvl, ib = a["nvlink_gbs"] * GB, a["internode_gbits"] / 8 * GB
    p = sizes["params"]
    ep = min(sizes["num_experts"], S) if scenario.startswith("ep") else 1
    f8_ag = scenario in ("fsdp_f8ag", "ep_f8dispatch")  # the EP float8 run gathers its Linears in float8 too
    gathered = p["float8_linear"] * (1 if f8_ag else 2) + p["other"] * 2
    shard_params = p["float8_linear"] + p["other"]
    if ep == 1:
        gathered += p["experts"] * (1 if f8_ag else 2)
        shard_params += p["experts"]
    out = {"all_gather": 2 * gathered * (S - 1) / S / nvl,
           "reduce_scatter": shard_params * 4 * (S - 1) / S / nvl}
    if 1 < ep < S:  # experts FSDP over the S/ep ranks outside the EP group (gathered in bf16 under EP)
        m = S // ep
        out["all_gather"] += 2 * p["experts"] / ep * 2 * (m - 1) / m / nvl
        out["reduce_scatter"] += p["experts"] / ep * 4 * (m - 1) / m / nvl
    # replicas: all-reduce of every GPU's fp32 grad shard (experts: their 1/ep share)
    grad_shard = shard_params * 4 / S + (p["experts"] * 4 / S if ep > 1 else 0)
    out["all_reduce_replicas"] = 2 * (R - 1) / R * grad_shard / ib if R > 1 else 0.0
    out["all_to_all"] = 0.0
    out["ep_host"] = a.get("ep_host_s_per_layer", 0.0) * sizes["n_moe_layers"] if ep > 1 else 0.0
    if ep > 1:
        rows = sizes["local_tokens"] * sizes["top_k"]
        d = sizes["dim"]
        dispatch = rows * (d + d / 32 if scenario == "ep_f8dispatch" else 2 * d)
        bf16_rows = rows * 2 * d
        fwd = dispatch + bf16_rows
        if sizes["ac_mode"] != "none":
            fwd *= 2
        per_layer = (fwd + 2 * bf16_rows) * (ep - 1) / ep
        out["all_to_all"] = per_layer * sizes["n_moe_layers"] / nvl  # ep <= S: inside the node
    return out


def step_seconds(compute: float, comm: dict, a: dict) -> float:
    fsdp = comm["all_gather"] + comm["reduce_scatter"] + comm["all_reduce_replicas"]
    return compute + max(0.0, fsdp - a["overlap"] * compute) + comm["all_to_all"] + comm.get("ep_host", 0.0)


def calibrate_ep_host(sizes: dict, compute: float, measured_ep_step: float, a: dict) -> float:
    """EP's cost beyond its bytes, seconds per MoE layer: (the measured EP=2 step - the model's EP step at 2 GPUs
    without it) / MoE layers; 0 when the bytes explain the whole step."""
    bytes_only = dict(a, ep_host_s_per_layer=0.0)
    modeled = step_seconds(compute, comm_seconds(sizes, 2, "ep_bf16", bytes_only), bytes_only)
    return max(0.0, measured_ep_step - modeled) / sizes["n_moe_layers"]


def calibrate_compute(sizes: dict, measured_step: float, a: dict) -> float:
    """compute such that step_seconds(compute, comm at 2 GPUs, fsdp_bf16) == measured_step."""
    comm = comm_seconds(sizes, 2, "fsdp_bf16", a)
    fsdp = comm["all_gather"] + comm["reduce_scatter"] + comm["all_reduce_replicas"]
    # step = c + max(0, fsdp - o c): if fsdp <= o * step, all hidden: c = step; else c = (step - fsdp) / (1 - o)
    if fsdp <= a["overlap"] * measured_step:
        return measured_step
    return (measured_step - fsdp) / (1 - a["overlap"])


def project(sizes: dict, measured_step: float, a: dict, gpus_list, compute: float | None = None) -> dict:
    compute = calibrate_compute(sizes, measured_step, a) if compute is None else compute
    rows = []
    for g in gpus_list:
        row = {"gpus": g, "compute_s": compute}
        for sc in SCENARIOS:
            comm = comm_seconds(sizes, g, sc, a)
            row[sc] = {"step_s": step_seconds(compute, comm, a), "comm_s": comm,
                       "tokens_per_s_per_gpu": sizes["local_tokens"] / step_seconds(compute, comm, a)}
        row["saving_f8_all_gather"] = 1 - row["fsdp_f8ag"]["step_s"] / row["fsdp_bf16"]["step_s"]
        row["saving_f8_dispatch"] = 1 - row["ep_f8dispatch"]["step_s"] / row["ep_bf16"]["step_s"]
        row["ep_vs_fsdp"] = row["fsdp_bf16"]["step_s"] / row["ep_bf16"]["step_s"]
        rows.append(row)
    return {"compute_s": compute, "rows": rows}


ANSWERS = ("saving_f8_all_gather", "saving_f8_dispatch", "ep_vs_fsdp")


def sensitivity(sizes, measured_step, a, gpus, compute_override) -> dict:
    """Each assumption x2 and /2 at `gpus`: how far the answers move (float8 all-gather saving, float8 dispatch
    saving: percentage points; EP vs FSDP speed ratio: relative). "compute" is the calibrated step compute (a
    bigger or smaller local batch, or a faster GEMM)."""
    base = project(sizes, measured_step, a, [gpus], compute_override)["rows"][0]
    base_compute = compute_override or calibrate_compute(sizes, measured_step, a)
    out = {}
    keys = ("nvlink_gbs", "internode_gbits", "overlap", "compute") + (("ep_host_s_per_layer",)
                                                                      if a.get("ep_host_s_per_layer") else ())
    for key in keys:
        for factor in (0.5, 2.0):
            b = dict(a)
            comp = base_compute * factor if key == "compute" else compute_override
            if key == "overlap":
                b[key] = min(1.0, a[key] * factor)
            elif key != "compute":
                b[key] = a[key] * factor
            r = project(sizes, measured_step, b, [gpus], comp)["rows"][0]
            out[f"{key} x{factor:g}"] = {"saving_f8_all_gather": r["saving_f8_all_gather"] - base["saving_f8_all_gather"],
                                         "saving_f8_dispatch": r["saving_f8_dispatch"] - base["saving_f8_dispatch"],
                                         "ep_vs_fsdp": r["ep_vs_fsdp"] / base["ep_vs_fsdp"] - 1}
    swing = {k.split(" x")[0]: 0.0 for k in out}
    for k, d in out.items():
        name = k.split(" x")[0]
        swing[name] = max(swing[name], max(abs(v) for v in d.values()))
    worst = max(swing, key=swing.get)
    return {"gpus": gpus, "answer_change": out, "swing": swing, "moves_most": worst, "max_change": swing[worst]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "train_configs", "llama_moe.toml"))
    ap.add_argument("--measured", default=os.path.join(ROOT, "benchmarks", "results", "llama_moe_e2e_x2",
                                                       "summary.json"))
    ap.add_argument("--measured-run", default="bf16")
    ap.add_argument("--compute-ms-per-layer", type=float, default=None)
    ap.add_argument("--measured-ep", default=None,
                    help="a run of --measured with expert_parallel_degree = 2: calibrates the EP host term")
    ap.add_argument("--ep-host-ms-per-layer", type=float, default=None,
                    help="the EP host term directly (ms per MoE layer and step; default 0 unless --measured-ep)")
    ap.add_argument("--nvlink-gbs", type=float, default=DEFAULTS["nvlink_gbs"])
    ap.add_argument("--internode-gbits", type=float, default=DEFAULTS["internode_gbits"])
    ap.add_argument("--overlap", type=float, default=DEFAULTS["overlap"])
    ap.add_argument("--gpus", default="8,64,512")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args(argv)
    a = {"nvlink_gbs": args.nvlink_gbs, "internode_gbits": args.internode_gbits, "overlap": args.overlap,
         "gpus_per_node": DEFAULTS["gpus_per_node"], "ep_host_s_per_layer": 0.0}
    sizes = model_sizes(args.config)
    with open(args.measured) as f:
        measured = json.load(f)

    def run_tps(name, flag):
        run = measured.get("runs", {}).get(name)
        if not run or not run.get("tps_per_gpu_median"):
            raise SystemExit(f"scale_model: {flag} {name!r}: no finished run of that name in {args.measured} "
                             f"(runs: {', '.join(measured.get('runs', {})) or 'none'})")
        return run["tps_per_gpu_median"]

    if args.measured_ep and args.ep_host_ms_per_layer is not None:
        raise SystemExit("scale_model: give --measured-ep or --ep-host-ms-per-layer, not both")
    tps = run_tps(args.measured_run, "--measured-run")
    measured_step = sizes["local_tokens"] / tps
    compute = args.compute_ms_per_layer * 1e-3 * sizes["n_layers"] if args.compute_ms_per_layer else None
    ep_measured = None
    if args.measured_ep:
        ep_tps = run_tps(args.measured_ep, "--measured-ep")
        ep_measured = {"run": args.measured_ep, "tps_per_gpu": ep_tps, "step_s": sizes["local_tokens"] / ep_tps}
        base_compute = compute if compute is not None else calibrate_compute(sizes, measured_step, a)
        a["ep_host_s_per_layer"] = calibrate_ep_host(sizes, base_compute, ep_measured["step_s"], a)
    elif args.ep_host_ms_per_layer is not None:
        a["ep_host_s_per_layer"] = args.ep_host_ms_per_layer * 1e-3
    gpus = [int(g) for g in args.gpus.split(",")]
    proj = project(sizes, measured_step, a, gpus, compute)
    sens = sensitivity(sizes, measured_step, a, gpus[-1], compute)
    # GPUs per measured run (a summary redrawn off the GPU host has "gpus": 0 visible; its runs had nproc_per_run)
    gpus_per_run = measured.get("nproc_per_run") or measured.get("gpus")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python benchmarks/scale_model.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "kind": "projection (a model, not a measurement)", "assumptions": a,
              "measured": {"file": os.path.relpath(args.measured, ROOT), "run": args.measured_run,
                           "device": measured.get("device"), "gpus": gpus_per_run, "tps_per_gpu": tps,
                           "step_s": measured_step, "ep": ep_measured},
              "model": sizes, "compute_s": proj["compute_s"], "rows": proj["rows"], "sensitivity": sens}
    lines = [f"measured: {tps:.0f} tok/s/GPU on {gpus_per_run}x {measured.get('device')} -> step "
             f"{measured_step * 1e3:.1f} ms, compute {proj['compute_s'] * 1e3:.1f} ms (weak scaling)",
             f"assumptions: NVLink {a['nvlink_gbs']:g} GB/s/GPU, between nodes {a['internode_gbits']:g} Gb/s/GPU, "
             f"{a['gpus_per_node']} GPUs/node, FSDP overlap {a['overlap']:g} of compute, all-to-all exposed, EP "
             f"host {a['ep_host_s_per_layer'] * 1e3:.2f} ms per MoE layer"
             + (f" (from {ep_measured['run']}: {ep_measured['tps_per_gpu']:.0f} tok/s/GPU, step "
                f"{ep_measured['step_s'] * 1e3:.1f} ms)" if ep_measured else ""),
             "| GPUs | FSDP bf16 ms | FSDP f8 AG ms | f8 AG saves | EP bf16 ms | EP f8 dispatch ms | f8 dispatch saves "
             "| EP vs FSDP |", "|---|---|---|---|---|---|---|---|"]
    for r in proj["rows"]:
        lines.append(f"| {r['gpus']} | {r['fsdp_bf16']['step_s'] * 1e3:.1f} | {r['fsdp_f8ag']['step_s'] * 1e3:.1f} | "
                     f"{r['saving_f8_all_gather']:.1%} | {r['ep_bf16']['step_s'] * 1e3:.1f} | "
                     f"{r['ep_f8dispatch']['step_s'] * 1e3:.1f} | {r['saving_f8_dispatch']:.1%} | "
                     f"{r['ep_vs_fsdp']:.2f}x |")
    lines.append(f"sensitivity at {sens['gpus']} GPUs (each assumption x2 and /2; change of the f8 AG saving, f8 "
                 f"dispatch saving [points] and EP-vs-FSDP ratio [relative]): '{sens['moves_most']}' moves the answer "
                 f"most ({sens['max_change']:.1%} at worst)")
    for k, d in sens["answer_change"].items():
        lines.append(f"  {k:20s} " + "  ".join(f"{name} {v:+.1%}" for name, v in d.items()))
    text = "\n".join(lines)
    print(text)
    result["table"] = text
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"scale_model-{result['date'][:10]}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}")
    return result


if __name__ == "__main__":
    main()
