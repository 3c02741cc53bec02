"""AdamW, the warmup + decay learning-rate schedule, and grad-norm clipping over FSDP2 DTensors."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from titan_fp8.config import LRScheduler, Optimizer


def build_optimizer(model: torch.nn.Module, cfg: Optimizer, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # fused on CPU too: it is what lets the trainer's deferred check skip a step on the device (found_inf)
    fused = bool(cfg.fused)
    # one param group per device mesh: foreach / fused kernels take one list per group, and DTensors of
    # different meshes (expert parallelism: experts on (dp, ep), the rest on dp) cannot share a list
    groups = _by_mesh(params)
    params = groups[0] if len(groups) == 1 else [{"params": g} for g in groups]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, fused=fused, foreach=None if fused else True)


def lr_factor(step: int, warmup_steps: int, total_steps: int, decay_type: str, min_lr_factor: float) -> float:
    """Multiplier of the base lr for optimizer step `step` (1-based): linear warmup, then decay to min."""
    if warmup_steps > 0 and step <= warmup_steps:
        return step / warmup_steps
    if decay_type == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if decay_type == "linear":
        shape = 1.0 - progress
    else:  # cosine
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_factor + (1.0 - min_lr_factor) * shape


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: LRScheduler, total_steps: int):
    # LambdaLR calls the lambda with the number of scheduler.step() calls so far; the first optimizer step
    # (step 1) runs with lr_factor(1).
    def fn(count: int) -> float:
        return lr_factor(count + 1, cfg.warmup_steps, total_steps, cfg.decay_type, cfg.min_lr_factor)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def grad_norm_and_clip(params: list[torch.nn.Parameter], max_norm: float,
                       optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
    """Total L2 norm of all gradients over all ranks (a plain tensor, no host sync); clips when max_norm > 0.

    With FSDP2 the gradients are DTensors sharded over the mesh: the per-shard norms combine into a Partial
    DTensor, and full_tensor() all-reduces it (sum of squares, then the root), so every rank gets the norm of
    the whole model. With HSDP the same call reduces over both mesh dimensions.

    optimizer: a fused AdamW here takes the clipping as its `grad_scale` (what torch's GradScaler hands it: the
    kernel divides each gradient by it as it reads it) instead of a pass that multiplies every gradient in place
    (~3 ms a step at llama_moe on 2 H200s). The caller's optimizer.step() must follow, then take_grad_scale().
    """
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return torch.zeros(())
    # per device mesh (expert parallelism has two), each norm over all of its ranks, then combined: every
    # parameter element counts once (EP-sharded experts are Shard on the ep dim, so no double counting)
    norms = []
    for group in _by_mesh(with_grad):
        n = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type=2.0, error_if_nonfinite=False)
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        if optimizer is not None and optimizer.defaults.get("fused"):
            # torch's clip_grads_with_norm_ multiplies by min(max_norm / (norm + 1e-6), 1): divide by its inverse
            optimizer.grad_scale = torch.clamp((total + 1e-6) / max_norm, min=1.0).float()  # the kernel reads fp32
        else:
            for group in _by_mesh(with_grad):
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def take_grad_scale(optimizer: torch.optim.Optimizer) -> None:
    """After optimizer.step(): the clipping of one step must not reach the next."""
    if hasattr(optimizer, "grad_scale"):
        del optimizer.grad_scale


def _by_mesh(params: list) -> list[list]:
    """params split by DTensor device mesh (plain tensors together), in first-seen order."""
    groups: dict = {}
    for p in params:
        groups.setdefault(getattr(p, "device_mesh", None), []).append(p)
    return list(groups.values())
