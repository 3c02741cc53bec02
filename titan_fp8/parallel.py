"""All parallelism in one place: the device mesh, NCCL knobs, and `parallelize` (AC, compile, FSDP2)."""

from __future__ import annotations

import os
import warnings

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from titan_fp8.config import JobConfig


def apply_comm_env(cfg: JobConfig) -> str:
    """Export [comm] nccl_max_ctas as NCCL_MAX_CTAS (before the process group starts) unless the environment
    already sets it. Returns one log line with the effective value and where it came from."""
    env = os.environ.get("NCCL_MAX_CTAS")
    if env is not None:
        note = ""
        if cfg.comm.nccl_max_ctas is not None and str(cfg.comm.nccl_max_ctas) != env:
            note = f" (overrides [comm] nccl_max_ctas = {cfg.comm.nccl_max_ctas} in {cfg.source})"
        return f"NCCL_MAX_CTAS = {env} from the environment{note}"
    if cfg.comm.nccl_max_ctas is not None:
        os.environ["NCCL_MAX_CTAS"] = str(cfg.comm.nccl_max_ctas)
        return f"NCCL_MAX_CTAS = {cfg.comm.nccl_max_ctas} from [comm] nccl_max_ctas in {cfg.source}"
    return "NCCL_MAX_CTAS unset: NCCL's default"


def apply_matmul_sm_carveout(cfg: JobConfig) -> str | None:
    """[comm] matmul_sm_carveout -> torch's SM carve-out for persistent GEMMs (this process, its current GPU).
    Returns a log line, or None when the key is unset. Call after torch.cuda.set_device."""
    n = cfg.comm.matmul_sm_carveout
    if n is None:
        return None
    if not torch.cuda.is_available():
        return f"[comm] matmul_sm_carveout = {n} from {cfg.source}: not applied (no GPU)"
    setter = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if setter is None:
        raise RuntimeError(f"{cfg.source}: [comm] matmul_sm_carveout = {n} needs torch._C._set_sm_carveout_experimental"
                           f", which torch {torch.__version__} does not have (unset the key)")
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if n >= sms:
        raise RuntimeError(f"{cfg.source}: [comm] matmul_sm_carveout = {n} leaves no SM of this GPU's {sms} to GEMMs")
    with warnings.catch_warnings():  # torch warns once that the knob is experimental; our log line says it
        warnings.simplefilter("ignore")
        setter(n)
    return f"GEMMs leave {n} of {sms} SMs to NCCL ([comm] matmul_sm_carveout in {cfg.source})"


def build_mesh(cfg: JobConfig, device_type: str, world_size: int) -> DeviceMesh:
    """1-D ("dp_shard") mesh for FSDP; with data_parallel_replicate_degree > 1, 2-D (dp_replicate, dp_shard) = HSDP.

    Rank r sits at (r // shard, r % shard): the shard groups are runs of consecutive ranks, i.e. inside a node
    when torchrun numbers a node's processes consecutively, and the replicas span nodes. Under HSDP FSDP2
    all-gathers parameters (float8 included: the pre-all-gather hook gets the shard sub-mesh) and reduce-scatters
    gradients inside the shard group, then all-reduces the gradient shards across the replicate group; the float8
    AMAX all-reduce also stays in the shard group (weights.py `shard_group`)."""
    if world_size != cfg.world_size:
        raise ValueError(f"build_mesh: {world_size} ranks but the config was validated for {cfg.world_size}")
    replicate, shard = cfg.dp_degrees
    ep = cfg.parallelism.expert_parallel_degree
    if ep > 1:
        # Expert parallelism splits the shard dim into (dp_shard_mod_ep, ep): rank = r*S + m*ep + e, so an EP
        # group is ep consecutive ranks (inside a node). "dp_shard" (flattened) is still what FSDP2 shards the
        # non-expert weights over; the experts are sharded by "ep" and FSDP2 over the rest (expert_dp_mesh).
        dims, names = (shard // ep, ep), ("dp_shard_mod_ep", "ep")
        if replicate > 1:
            dims, names = (replicate, *dims), ("dp_replicate", *names)
        mesh = init_device_mesh(device_type, dims, mesh_dim_names=names)
        mesh["dp_shard_mod_ep", "ep"]._flatten("dp_shard")
        return mesh
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard"))


# Ops whose outputs selective activation checkpointing keeps; everything else in a block is recomputed.
def _save_list() -> set:
    names = [("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"), ("aten", "_grouped_mm"), ("aten", "_scaled_mm"),
             ("aten", "_scaled_grouped_mm"), ("aten", "_scaled_dot_product_flash_attention"),
             ("aten", "_scaled_dot_product_efficient_attention"), ("aten", "_scaled_dot_product_cudnn_attention"),
             ("aten", "_flash_attention_forward"), ("aten", "_efficient_attention_forward")]
    ops = set()
    for ns, name in names:
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _save_list()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(block: torch.nn.Module, mode: str) -> torch.nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    if mode == "selective":
        return checkpoint_wrapper(block, context_fn=_selective_context, preserve_rng_state=False)
    raise ValueError(f"activation checkpoint mode {mode!r}")


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards the non-expert weights over: (dp_replicate, dp_shard) or (dp_shard,)."""
    names = mesh.mesh_dim_names
    if "ep" not in names:
        return mesh
    return mesh["dp_replicate", "dp_shard"] if "dp_replicate" in names else mesh["dp_shard"]


def expert_dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards the (EP-local) expert weights over: every data-parallel rank outside the EP group."""
    return mesh["dp_replicate", "dp_shard_mod_ep"] if "dp_replicate" in mesh.mesh_dim_names else \
        mesh["dp_shard_mod_ep"]


def apply_expert_parallel(model: torch.nn.Module, job_config: JobConfig, mesh: DeviceMesh) -> list:
    """Every MoE's routed experts split over the "ep" mesh dim: w13 / w2 become DTensors Shard(0) on it (the
    state dict keeps the global [E, ...] shapes, so DCP checkpoints reshard across EP degrees), and the MoE
    gets its ExpertParallel (process group, dispatch dtype). Returns the expert modules."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from titan_fp8.models.expert_parallel import ExpertParallel
    from titan_fp8.models.moe import MoE

    ep_mesh = mesh["ep"]
    group = ep_mesh.get_group()
    experts = []
    for moe in model.modules():
        if not isinstance(moe, MoE):
            continue
        ex = moe.experts
        for name in ("w13", "w2"):
            p = getattr(ex, name)
            data = _unwrap_float8_all_gather(p.data)
            # src_data_rank=None: split locally, no scatter (every rank built the same full tensor from the same
            # seed on CPU; on GPU it is still on the meta device and is initialised after parallelize)
            setattr(ex, name, torch.nn.Parameter(distribute_tensor(data, ep_mesh, [Shard(0)], src_data_rank=None),
                                                 requires_grad=p.requires_grad))
        moe.ep = ExpertParallel(group, ep_mesh.size(), ep_mesh.get_local_rank(), job_config.float8.dispatch_dtype)
        experts.append(ex)
    return experts


def _unwrap_float8_all_gather(data: torch.Tensor) -> torch.Tensor:
    """Under EP the expert weights are gathered by FSDP2 only over expert_dp_mesh (one rank when ep == shard
    degree: nothing moves), in the parameter dtype: enable_fsdp_float8_all_gather keeps applying to the
    Linear weights, not to the experts (their float8 all-gather subclass is not composed with the EP DTensor).
    Said once on stderr, and in the README."""
    from titan_fp8.float8.weights import Float8TrainingWeight

    if not isinstance(data, Float8TrainingWeight):
        return data
    global _WARNED_EP_F8_AG
    if not _WARNED_EP_F8_AG:
        warnings.warn("expert_parallel_degree > 1: expert weights are all-gathered in their parameter dtype over "
                      "the data-parallel ranks outside the EP group; enable_fsdp_float8_all_gather applies to "
                      "the Linear weights only")
        _WARNED_EP_F8_AG = True
    return data._tensor


_WARNED_EP_F8_AG = False


def reduce_scatter_copy_in(unsharded_grads: list, reduce_scatter_input: torch.Tensor, world_size: int) -> None:
    """FSDP2's reduce-scatter copy-in (what torch.ops.fsdp.chunk_cat does), one copy per gradient and rank.

    Row r of reduce_scatter_input viewed as [world_size, -1] holds, for every gradient in order, its r-th dim-0
    chunk (dim 0 padded to a multiple of world_size, the padding zero), cast to the reduce dtype. torch's
    _chunk_cat builds one metadata entry per 2 KiB of output on the host and copies it to the GPU: ~7 ms of
    host time per llama_moe block (fp32 reduce of 0.38 B parameters; H100 profile, 2026-11-23), during which
    the GPU, whose backward the host keeps only just ahead of, idles. Here: 2 small launches per gradient
    and rank, the same bytes (tests/cpu/test_parallel.py compares the two bit for bit)."""
    out = reduce_scatter_input.view(world_size, -1)
    col = 0
    for g in unsharded_grads:
        rows = g.shape[0] if g.dim() else 1
        inner = g.numel() // rows if rows else 0
        chunk = -(-rows // world_size)  # dim-0 rows per rank, padded
        width = chunk * inner
        g2 = g.reshape(rows, inner)
        for r in range(world_size):
            lo, hi = min(r * chunk, rows), min((r + 1) * chunk, rows)
            dst = out[r, col:col + width]
            if hi > lo:
                dst[:(hi - lo) * inner].view(hi - lo, inner).copy_(g2[lo:hi])
            if hi - lo < chunk:
                dst[(hi - lo) * inner:].zero_()
        col += width
    if col != out.shape[1]:
        raise RuntimeError(f"reduce_scatter_copy_in: the gradients fill {col} of {out.shape[1]} elements per rank "
                           f"(FSDP2's padding rule changed?)")


def install_reduce_scatter_copy_in() -> bool:
    """Route FSDP2's copy-in through reduce_scatter_copy_in (it looks the function up in its module at every
    call). False, with a warning, where this torch has no such function (then torch's chunk_cat runs)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc
    if not callable(getattr(fc, "foreach_reduce_scatter_copy_in", None)):
        warnings.warn("titan_fp8: this torch has no FSDP2 foreach_reduce_scatter_copy_in; its chunk_cat copy-in "
                      "stays (slower on the host: titan_fp8/parallel.py reduce_scatter_copy_in)")
        return False
    fc.foreach_reduce_scatter_copy_in = reduce_scatter_copy_in
    return True


def parallelize(model: torch.nn.Module, job_config: JobConfig, mesh: DeviceMesh) -> torch.nn.Module:
    """Expert parallelism, activation checkpointing, per-block torch.compile, then fully_shard per block and the
    root (under EP first the experts of each block, over expert_dp_mesh).

    Mixed precision is bf16 parameters with fp32 gradient reduction on GPU; on CPU everything stays fp32 so
    that runs with different numbers of ranks can be compared exactly.
    """
    on_gpu = mesh.device_type == "cuda"
    ep_experts = apply_expert_parallel(model, job_config, mesh) if "ep" in mesh.mesh_dim_names else []
    ac_mode = job_config.activation_checkpoint.mode
    for name, block in list(model.layers.items()):
        if ac_mode != "none":
            block = apply_activation_checkpointing(block, ac_mode)
        if job_config.compile.enable:
            for mod in block.modules():  # what the experts' GEMM backend needs, loaded before dynamo traces it
                prepare = getattr(mod, "prepare_backend", None)
                if callable(prepare):
                    prepare(mesh.device_type)
            # A wrapper (as torchtitan does), so FSDP2's hooks, registered on the wrapper below, run outside
            # the compiled region. The "_orig_mod." it adds to names is stripped by DCP's state_dict helpers,
            # like checkpoint_wrapper's prefix. fullgraph stays off: a graph break costs a little speed,
            # an error would cost the run; the trainer logs the graph-break count after step 1.
            block = torch.compile(block)
        model.layers[name] = block

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu else None
    fsdp_kwargs = {"mesh": dp_mesh(mesh)}
    if mp is not None:
        fsdp_kwargs["mp_policy"] = mp
    for ex in ep_experts:
        # FSDP2 over the data-parallel ranks outside the EP group. When there are none (ep == shard degree, no
        # replicas) the group has one rank: FSDP2 then moves nothing and only applies mixed precision; with
        # replicas (HSDP) it all-reduces the expert grads across them. Never across the EP group: each EP rank
        # holds different experts, whose grads already sum every EP rank's tokens (scaled by 1/ep in the MoE).
        fully_shard(ex, reshard_after_forward=job_config.parallelism.fsdp_reshard_after_forward != "never",
                    **{**fsdp_kwargs, "mesh": expert_dp_mesh(mesh)})
    install_reduce_scatter_copy_in()  # torch's chunk_cat copy-in costs ~7 ms of host time per block
    names = list(model.layers.keys())
    if job_config.float8.enable:
        from titan_fp8.float8 import batch_weight_casts  # (bf16 runs do not import the float8 layer)
    policy = job_config.parallelism.fsdp_reshard_after_forward
    for i, name in enumerate(names):
        # "default": the last block's parameters are needed again first thing in backward: keep them gathered
        reshard = {"always": True, "never": False}.get(policy, i < len(names) - 1)
        fully_shard(model.layers[name], reshard_after_forward=reshard, **fsdp_kwargs)
        if job_config.float8.enable:
            batch_weight_casts(model.layers[name])  # one launch per block all-gather and kind, not one per weight
    depth = job_config.parallelism.fsdp_forward_prefetch
    if depth:  # each block issues the next `depth` blocks' all-gathers when its own forward starts
        blocks = [model.layers[name] for name in names]
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + depth])
    fully_shard(model, **fsdp_kwargs)
    return model
