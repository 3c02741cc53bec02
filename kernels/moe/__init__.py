"""Fused activation kernels of the float8 MoE expert path (issue 9, contract 2 of /work/ISSUE9_INTERFACE.md).

P = rows of the expert buffer (groups padded, see titan_fp8.models.moe.dispatch_plan), N tokens, top-k slots,
E experts, D model dim, H expert hidden dim. recipe in {"fp8_rowwise", "mxfp8"}; block in {32, 128} (mxfp8; the
scale block along both axes; ignored by fp8_rowwise).

  dispatch_quantize(x [N, D], src [P] int64, offs [E] int32, recipe, block) -> (xq [P, D], xs, xtq [D, P], xts)
      rows gathered into expert order (src == N: zero row), row-quantized (fprop operand) AND the token-major copy
      (wgrad operand) from ONE read of x (mxfp8; fp8_rowwise reads x twice, see below). No bf16 copy is kept.
      outputs=ROWS / TOKEN_MAJOR makes one copy only (the other comes back empty: reference.unmade_*): a caller
      that keeps x anyway makes the token-major copy in backward, next to wgrad, instead of holding it.
  combine(y [P, D], pos [N*k] int64, weights [N, k] fp32) -> out [N, D] (y.dtype)
      out[t] = sum_j weights[t, j] * y[pos[t*k + j]]: fixed slot order, fp32, no atomics.
  combine_backward(dout [N, D], y [P, D], pos, weights, src, offs, recipe, block)
      -> (dyq [P, D], dys, dytq [D, P], dyts, dweights [N, k] fp32)
      dy[r] = weights[t, slot] * dout[t] (fp32 product, quantized directly: never rounded to bf16) on real rows,
      0 on padding rows, written quantized for w2's dgrad (rows) and wgrad (token-major);
      dweights[t, j] = <dout[t], y[pos[t*k + j]]> (fp32; deterministic, summation order the kernel's).
  swiglu_quantize(h13 [P, 2H], offs, recipe, block) -> (aq [P, H], as, atq [H, P], ats)      a = silu(h1) * h3
  dispatch_quantize and swiglu_quantize take col_tile=128 (mxfp8): the token-major copy then shares one scale per
      `block` tokens x 128 features (kernels.grouped_gemm.quant.to_mxfp8_blocked(v.t(), -1, block, 128)), what the
      weight-tiled wgrad (a_tile=128) reads for its second operand; default 1 (1 x block along tokens).
  swiglu_quantize_backward(da [P, H], h13 [P, 2H], offs, recipe, block) -> (dq [P, 2H], ds, dtq [2H, P], dts)
      [dh1 | dh3]: dh1 = da * h3 * silu'(h1), dh3 = da * silu(h1), quantized for dgrad (rows) and wgrad.

Scale layouts (kernels/moe/reference.py is the exact definition):
  rows         mxfp8: uint8 E8M0 [P, C/32] (for block 128 each 1x32 block carries its 1x128 run's scale,
               kernels.grouped_gemm.quant.to_mxfp8_blocked); fp8_rowwise: fp32 [P], one per row.
  token-major  mxfp8: uint8 [C, P/32], blocks of `block` tokens from token 0 (an MoE pads every group to
               token_group_align >= block, so no block straddles two experts), returned as a transposed view of
               a row-major [P/32, C] buffer (mxfp8_grouped_mm_wgrad reads scales through strides).
               fp8_rowwise: fp32 [E, C], ONE SCALE PER (EXPERT GROUP, FEATURE) over that group's tokens.
  fp8 scales multiply into float8 range (value = data / scale; kernels.float8_cast's convention and rule, powers
  of two); torch._scaled_grouped_mm wants the reciprocals (exact for powers of two).

fp8_rowwise token-major choice (the wgrad GEMM is torch._scaled_grouped_mm's 2d x 2d case, groups along K):
torch's checks (torch/_meta_registrations.py _meta_grouped_mm_common, mirroring _scaled_grouped_mm_cuda in
ATen: for 2-D mat_a and mat_b with offs, scale_multiplier = offs.shape[0] and each scale must be 1-D, contiguous,
with mat.shape[scaled_dim] * n_groups elements) accept ONLY per-(group, row) scales there: scale_a [G * M] for
mat_a [M, K_total], scale_b [G * N] for mat_b [K_total, N], group-major (index g * M + m), the layout torchao 0.18's
moe_training writes (triton_fp8_per_group_colwise_scales). One scale per feature over all tokens would have to be
repeated G times anyway and loses range per expert. So xts / dyts / ats / dts are fp32 [E, C]; pass
`(1 / scale).reshape(-1)`. Since a group's scale needs that group's amax before any byte is written, the
fp8_rowwise op reads its inputs twice (pass 1: row and per-group column amax; pass 2: both copies), where mxfp8
writes both copies from one read.

backend: "auto" = Triton on CUDA tensors, reference elsewhere; "reference" = plain PyTorch (any device);
"triton" = the kernels (CPU only under TRITON_INTERPRET=1; otherwise an error, never a silent fallback).
The Triton paths are torch.library ops (titan_fp8::moe_dispatch_quantize, ::moe_combine, ::moe_combine_backward,
::moe_swiglu_quantize, ::moe_swiglu_quantize_backward: opaque custom ops with fake implementations; on the GPU
their triton_op twins ::moe_*_traced, whose launches torch.compile writes into its generated code: see
TRACED_LAUNCH), so torch.compile and FSDP2 trace through them. Outputs never require grad.
"""
from __future__ import annotations

import os

import torch

from .reference import (  # noqa: F401
    BOTH,
    MX_BLOCKS,
    RECIPES,
    ROWS,
    TOKEN_MAJOR,
    combine_backward_reference,
    combine_reference,
    dispatch_quantize_reference,
    quantize_both,
    swiglu_quantize_backward_reference,
    swiglu_quantize_reference,
    unmade_rows,
    unmade_token_major,
)

__all__ = ["dispatch_quantize", "ROWS", "TOKEN_MAJOR", "BOTH", "combine", "combine_backward", "swiglu_quantize",
           "swiglu_quantize_backward", "dispatch_quantize_reference", "combine_reference", "combine_backward_reference",
           "swiglu_quantize_reference", "swiglu_quantize_backward_reference", "RECIPES", "MX_BLOCKS"]

_BACKENDS = ("auto", "reference", "triton")
Tensor = torch.Tensor


def _triton():
    from . import triton as _t  # lazily: TRITON_INTERPRET must be set first; the reference needs no triton
    return _t


def _use_triton(t: Tensor, backend: str) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"kernels.moe: backend={backend!r}; allowed: {', '.join(map(repr, _BACKENDS))}")
    if backend == "auto":
        return t.is_cuda
    return backend == "triton"


# ------------------------------------------------------------------------------------------ validation
def _fail(who, msg):
    raise ValueError(f"{who}: {msg}")


def _check_float(who, name, t, ndim=2):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.bfloat16, torch.float32):
        _fail(who, f"{name}.dtype is {t.dtype}; expected torch.bfloat16 (or torch.float32)")
    if t.ndim != ndim:
        _fail(who, f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def _check_index(who, name, t, dtype, length=None):
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.ndim != 1:
        _fail(who, f"{name} must be a 1-D {dtype} tensor, got "
                   f"{getattr(t, 'dtype', type(t).__name__)} shape {tuple(getattr(t, 'shape', ()))}")
    if length is not None and t.shape[0] != length:
        _fail(who, f"{name} has {t.shape[0]} elements; expected {length}")


def _check_recipe(who, recipe, block, P, C, C_name):
    if recipe not in RECIPES:
        _fail(who, f"recipe={recipe!r}; allowed: {', '.join(map(repr, RECIPES))}")
    if recipe == "mxfp8":
        if block not in MX_BLOCKS:
            _fail(who, f"block={block!r}; mxfp8 allows {MX_BLOCKS}")
        if C % block:
            _fail(who, f"{C_name} = {C} is not a multiple of block={block} (mxfp8 scales 1 x {block} runs)")
        if P % block:
            _fail(who, f"P = {P} buffer rows is not a multiple of block={block} (the token-major copy scales "
                       f"blocks of {block} tokens; pad the groups to token_group_align >= {block})")


def _check_col_tile(who, col_tile, recipe, C, C_name):
    if col_tile not in (1, 128):
        _fail(who, f"col_tile={col_tile!r}; allowed: 1, 128")
    if col_tile > 1 and recipe != "mxfp8":
        _fail(who, f"col_tile={col_tile} applies to mxfp8 only (recipe={recipe!r})")
    if col_tile > 1 and C % col_tile:
        _fail(who, f"{C_name} = {C} is not a multiple of col_tile={col_tile}")


def _same_device(who, *ts):
    devs = {t.device for t in ts}
    if len(devs) > 1:
        _fail(who, f"tensors are on different devices: {sorted(map(str, devs))}")


def _check_offs(who, offs):
    _check_index(who, "offs", offs, torch.int32)
    if offs.shape[0] < 1:
        _fail(who, "offs is empty; it needs one cumulative group end per expert")


# ------------------------------------------------------------------------------------------ triton ops
# Each op exists twice with one body (_*_impl):
#   titan_fp8::moe_*          an opaque custom op (fake implementation below): torch.compile calls it through the
#                             dispatcher, and its Triton kernels launch through Triton's Python launcher: ~0.2-0.3 ms
#                             of host time per call on the H100 machine, which left the fused expert path host-bound
#                             at llama_moe (benchmarks/results/moe_layer-H100-2026-11-23.md, runs 6-7). The
#                             interpreter (CPU tests) can only use this one: tracing a triton op reads data pointers.
#   titan_fp8::moe_*_traced   a torch.library.triton_op: torch.compile traces the body and emits the kernel launches
#                             into its generated code (inductor's launcher, no dispatcher or Python launcher per call).
# TRACED_LAUNCH: the recipes whose ops launch through the traced twins ("combine" stands for the recipe-free
# combine; titan_fp8 passes its recipe). Measured on one H100 (benchmarks/results/moe_layer-H100-2026-11-23.md,
# run 9, same run as the opaque ops): mxfp8 mx128 traced 9.81 vs 10.11 ms at llama_moe, 13.93 vs 14.09 ms at
# dsv3_layer, host time 7.3 vs 9.0 ms, same peak memory: on by default. fp8_rowwise traced: +0.12 GiB peak at
# llama_moe (0.959 -> 1.081) and an inductor assertion at dsv3_layer: off until that is understood.
# A first try (run 7b) cloned every input (inductor's write analysis named them all); the kernels have since been
# restructured so that the analysis names only their outputs (tests/cpu/test_moe_kernels_write_analysis.py).
# TITAN_FP8_MOE_TRACED_LAUNCH: "mxfp8" (default) or "none". fp8_rowwise traced ("all", "1", "fp8_rowwise") is
# refused: on an H100 (session 13) its compiled swiglu_quantize wrote a token-major copy that differs from the eager
# op's in every byte (tests/gpu/test_moe_kernels_gpu.py::test_compiled_equals_eager, run with every recipe traced;
# benchmarks/results/moe_layer_s13/call1_gpu_tests.log). Not understood yet: until it is, the env cannot select it.
_TRACED_CHOICES = {"mxfp8": ("mxfp8",), "none": (), "0": ()}
_TRACED_REFUSED = ("all", "1", "fp8_rowwise")


def _traced_recipes(value: str) -> frozenset:
    if value in _TRACED_CHOICES:
        return frozenset(_TRACED_CHOICES[value])
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    if value in _TRACED_REFUSED or "fp8_rowwise" in names:
        raise ValueError(f"TITAN_FP8_MOE_TRACED_LAUNCH={value!r}: traced launches for fp8_rowwise are disabled (their "
                         f"compiled output differed from the eager op on an H100); allowed: 'mxfp8', 'none'")
    bad = names - {"mxfp8"}
    if bad:
        raise ValueError(f"TITAN_FP8_MOE_TRACED_LAUNCH={value!r}: unknown recipe(s) {sorted(bad)}; allowed: "
                         f"{', '.join(map(repr, _TRACED_CHOICES))}")
    return names


TRACED_LAUNCH = (frozenset() if os.environ.get("TRITON_INTERPRET", "0") == "1"
                 else _traced_recipes(os.environ.get("TITAN_FP8_MOE_TRACED_LAUNCH", "mxfp8")))


def _dispatch_impl(x, src, offs, recipe, block, col_tile, outputs, traced):
    (N, D), P = x.shape, src.shape[0]
    q, s, qt, st, _ = _triton().quantize_values(0, x, src, N=N, P=P, C=D, H=0, K=1, offs=offs, recipe=recipe,
                                                block=block, who="dispatch_quantize", col_tile=col_tile, traced=traced,
                                                outputs=outputs)
    return q, s, qt, st


def _combine_backward_impl(dout, y, pos, weights, src, offs, recipe, block, traced):
    (N, D), P, k = dout.shape, src.shape[0], weights.shape[1]
    q, s, qt, st, dots = _triton().quantize_values(1, dout, src, pos, weights, y, N=N, P=P, C=D, H=0, K=k,
                                                   offs=offs, recipe=recipe, block=block, who="combine_backward",
                                                   traced=traced)
    dweights = dots.sum(0).index_select(0, pos).view(N, k)  # fixed order over the column tiles
    return q, s, qt, st, dweights


def _swiglu_impl(h13, offs, recipe, block, col_tile, traced):
    P, H = h13.shape[0], h13.shape[1] // 2
    q, s, qt, st, _ = _triton().quantize_values(2, h13, N=0, P=P, C=H, H=H, K=1, offs=offs, recipe=recipe,
                                                block=block, who="swiglu_quantize", col_tile=col_tile, traced=traced)
    return q, s, qt, st


def _swiglu_backward_impl(da, h13, offs, recipe, block, traced):
    P, H = h13.shape[0], h13.shape[1] // 2
    q, s, qt, st, _ = _triton().quantize_values(3, da, h13, N=0, P=P, C=2 * H, H=H, K=1, offs=offs, recipe=recipe,
                                                block=block, who="swiglu_quantize_backward", traced=traced)
    return q, s, qt, st


_Q4 = tuple[Tensor, Tensor, Tensor, Tensor]
_Q5 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


@torch.library.custom_op("titan_fp8::moe_dispatch_quantize", mutates_args=())
def _dispatch_op(x: Tensor, src: Tensor, offs: Tensor, recipe: str, block: int, col_tile: int, outputs: int) -> _Q4:
    return _dispatch_impl(x, src, offs, recipe, block, col_tile, outputs, False)


@torch.library.triton_op("titan_fp8::moe_dispatch_quantize_traced", mutates_args=())
def _dispatch_traced(x: Tensor, src: Tensor, offs: Tensor, recipe: str, block: int, col_tile: int,
                     outputs: int) -> _Q4:
    return _dispatch_impl(x, src, offs, recipe, block, col_tile, outputs, True)


@torch.library.custom_op("titan_fp8::moe_combine", mutates_args=())
def _combine_op(y: Tensor, pos: Tensor, weights: Tensor) -> Tensor:
    return _triton().combine_triton(y, pos, weights)


@torch.library.triton_op("titan_fp8::moe_combine_traced", mutates_args=())
def _combine_traced(y: Tensor, pos: Tensor, weights: Tensor) -> Tensor:
    return _triton().combine_triton(y, pos, weights, traced=True)


@torch.library.custom_op("titan_fp8::moe_combine_backward", mutates_args=())
def _combine_backward_op(dout: Tensor, y: Tensor, pos: Tensor, weights: Tensor, src: Tensor, offs: Tensor,
                         recipe: str, block: int) -> _Q5:
    return _combine_backward_impl(dout, y, pos, weights, src, offs, recipe, block, False)


@torch.library.triton_op("titan_fp8::moe_combine_backward_traced", mutates_args=())
def _combine_backward_traced(dout: Tensor, y: Tensor, pos: Tensor, weights: Tensor, src: Tensor, offs: Tensor,
                             recipe: str, block: int) -> _Q5:
    return _combine_backward_impl(dout, y, pos, weights, src, offs, recipe, block, True)


@torch.library.custom_op("titan_fp8::moe_swiglu_quantize", mutates_args=())
def _swiglu_op(h13: Tensor, offs: Tensor, recipe: str, block: int, col_tile: int) -> _Q4:
    return _swiglu_impl(h13, offs, recipe, block, col_tile, False)


@torch.library.triton_op("titan_fp8::moe_swiglu_quantize_traced", mutates_args=())
def _swiglu_traced(h13: Tensor, offs: Tensor, recipe: str, block: int, col_tile: int) -> _Q4:
    return _swiglu_impl(h13, offs, recipe, block, col_tile, True)


@torch.library.custom_op("titan_fp8::moe_swiglu_quantize_backward", mutates_args=())
def _swiglu_backward_op(da: Tensor, h13: Tensor, offs: Tensor, recipe: str, block: int) -> _Q4:
    return _swiglu_backward_impl(da, h13, offs, recipe, block, False)


@torch.library.triton_op("titan_fp8::moe_swiglu_quantize_backward_traced", mutates_args=())
def _swiglu_backward_traced(da: Tensor, h13: Tensor, offs: Tensor, recipe: str, block: int) -> _Q4:
    return _swiglu_backward_impl(da, h13, offs, recipe, block, True)


def _op(opaque, traced, recipe):
    """The traced twin where TRACED_LAUNCH names this recipe (True / False also accepted: tests, benchmarks);
    recipe None (combine called without one): traced only when every recipe is."""
    on = TRACED_LAUNCH
    if not isinstance(on, bool):
        on = recipe in on if recipe is not None else on >= {"mxfp8", "fp8_rowwise"}
    return traced if on else opaque


# fake implementations: shapes, dtypes and strides of what the kernels return (torch.compile / FSDP tracing)
def _fake_quantized(ref_t: Tensor, P: int, C: int, E: int, recipe: str, outputs: int = BOTH):
    f8, u8, f32 = torch.float8_e4m3fn, torch.uint8, torch.float32
    if recipe == "mxfp8":
        rows = (ref_t.new_empty((P, C), dtype=f8), ref_t.new_empty((P, C // 32), dtype=u8))
        cols = (ref_t.new_empty((C, P), dtype=f8),
                torch.empty_strided((C, P // 32), (1, C), dtype=u8, device=ref_t.device))
    else:
        rows = (ref_t.new_empty((P, C), dtype=f8), ref_t.new_empty((P,), dtype=f32))
        cols = (ref_t.new_empty((C, P), dtype=f8), ref_t.new_empty((E, C), dtype=f32))
    return (*(rows if outputs & ROWS else unmade_rows(ref_t, C, recipe)),
            *(cols if outputs & TOKEN_MAJOR else unmade_token_major(ref_t, C, recipe)))


@_dispatch_op.register_fake
def _(x, src, offs, recipe, block, col_tile, outputs):
    return _fake_quantized(x, src.shape[0], x.shape[1], offs.shape[0], recipe, outputs)


@_combine_op.register_fake
def _(y, pos, weights):
    return y.new_empty((weights.shape[0], y.shape[1]))


@_combine_backward_op.register_fake
def _(dout, y, pos, weights, src, offs, recipe, block):
    return (*_fake_quantized(dout, src.shape[0], dout.shape[1], offs.shape[0], recipe),
            weights.new_empty(weights.shape))


@_swiglu_op.register_fake
def _(h13, offs, recipe, block, col_tile):
    return _fake_quantized(h13, h13.shape[0], h13.shape[1] // 2, offs.shape[0], recipe)


@_swiglu_backward_op.register_fake
def _(da, h13, offs, recipe, block):
    return _fake_quantized(h13, h13.shape[0], h13.shape[1], offs.shape[0], recipe)


# ------------------------------------------------------------------------------------------ public API
def dispatch_quantize(x: Tensor, src: Tensor, offs: Tensor, recipe: str, block: int = 32, backend: str = "auto",
                      col_tile: int = 1, outputs: int = BOTH, opaque: bool = False):
    """x [N, D] -> (xq [P, D], xs, xtq [D, P], xts); see the module docstring. outputs: ROWS, TOKEN_MAJOR or BOTH
    (the copies made; one left out comes back as reference.unmade_rows / unmade_token_major, never written).
    opaque: the opaque custom op even where TRACED_LAUNCH would trace it. Under torch.compile a traced op's
    output buffers are inductor's, allocated by empty calls without inputs, which its scheduler may place long
    before the kernel (at the start of backward); the opaque op allocates when it runs."""
    who = "dispatch_quantize"
    if outputs not in (ROWS, TOKEN_MAJOR, BOTH):
        _fail(who, f"outputs={outputs!r}; expected ROWS ({ROWS}), TOKEN_MAJOR ({TOKEN_MAJOR}) or BOTH ({BOTH})")
    _check_float(who, "x", x)
    _check_index(who, "src", src, torch.int64)
    _check_offs(who, offs)
    _same_device(who, x, src, offs)
    _check_recipe(who, recipe, block, src.shape[0], x.shape[1], "x.shape[1] (D)")
    _check_col_tile(who, col_tile, recipe, x.shape[1], "x.shape[1] (D)")
    with torch.no_grad():
        if _use_triton(x, backend):
            op = _dispatch_op if opaque else _op(_dispatch_op, _dispatch_traced, recipe)
            return op(x.contiguous(), src.contiguous(), offs.contiguous(), recipe, int(block), int(col_tile),
                      int(outputs))
        return dispatch_quantize_reference(x, src, offs, recipe, block, col_tile, outputs)


def _check_combine(who, y, pos, weights, D=None):
    _check_float(who, "y", y)
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32 or weights.ndim != 2:
        _fail(who, f"weights must be a 2-D torch.float32 tensor [N, k], got "
                   f"{getattr(weights, 'dtype', type(weights).__name__)} {tuple(getattr(weights, 'shape', ()))}")
    _check_index(who, "pos", pos, torch.int64, weights.shape[0] * weights.shape[1])
    if D is not None and y.shape[1] != D:
        _fail(who, f"y is {tuple(y.shape)} but dout has {D} features")


def combine(y: Tensor, pos: Tensor, weights: Tensor, backend: str = "auto", recipe: str | None = None) -> Tensor:
    """out [N, D] = sum_j weights[t, j] * y[pos[t*k + j]] (slot order, fp32 sum), in y.dtype. recipe: the expert
    recipe this combine serves (only picks the launch, see TRACED_LAUNCH)."""
    who = "combine"
    _check_combine(who, y, pos, weights)
    _same_device(who, y, pos, weights)
    with torch.no_grad():
        if _use_triton(y, backend):
            return _op(_combine_op, _combine_traced, recipe)(y.contiguous(), pos.contiguous(), weights.contiguous())
        return combine_reference(y, pos, weights)


def combine_backward(dout: Tensor, y: Tensor, pos: Tensor, weights: Tensor, src: Tensor, offs: Tensor, recipe: str,
                     block: int = 32, backend: str = "auto"):
    """-> (dyq [P, D], dys, dytq [D, P], dyts, dweights [N, k] fp32); see the module docstring."""
    who = "combine_backward"
    _check_float(who, "dout", dout)
    _check_combine(who, y, pos, weights, dout.shape[1])
    if y.dtype != dout.dtype:
        _fail(who, f"y.dtype {y.dtype} != dout.dtype {dout.dtype}")
    if weights.shape[0] != dout.shape[0]:
        _fail(who, f"weights is {tuple(weights.shape)} but dout has {dout.shape[0]} tokens")
    _check_index(who, "src", src, torch.int64, y.shape[0])
    _check_offs(who, offs)
    _same_device(who, dout, y, pos, weights, src, offs)
    _check_recipe(who, recipe, block, src.shape[0], dout.shape[1], "dout.shape[1] (D)")
    with torch.no_grad():
        if _use_triton(dout, backend):
            op = _op(_combine_backward_op, _combine_backward_traced, recipe)
            return op(dout.contiguous(), y.contiguous(), pos.contiguous(), weights.contiguous(), src.contiguous(),
                      offs.contiguous(), recipe, int(block))
        return combine_backward_reference(dout, y, pos, weights, src, offs, recipe, block)


def _check_h13(who, h13):
    _check_float(who, "h13", h13)
    if h13.shape[1] % 2:
        _fail(who, f"h13 is {tuple(h13.shape)}: its last dim (2H, gate | up) must be even")


def swiglu_quantize(h13: Tensor, offs: Tensor, recipe: str, block: int = 32, backend: str = "auto",
                    col_tile: int = 1):
    """h13 [P, 2H] -> (aq [P, H], as, atq [H, P], ats) for a = silu(h1) * h3; see the module docstring."""
    who = "swiglu_quantize"
    _check_h13(who, h13)
    _check_offs(who, offs)
    _same_device(who, h13, offs)
    _check_recipe(who, recipe, block, h13.shape[0], h13.shape[1] // 2, "H = h13.shape[1] / 2")
    _check_col_tile(who, col_tile, recipe, h13.shape[1] // 2, "H = h13.shape[1] / 2")
    with torch.no_grad():
        if _use_triton(h13, backend):
            op = _op(_swiglu_op, _swiglu_traced, recipe)
            return op(h13.contiguous(), offs.contiguous(), recipe, int(block), int(col_tile))
        return swiglu_quantize_reference(h13, offs, recipe, block, col_tile)


def swiglu_quantize_backward(da: Tensor, h13: Tensor, offs: Tensor, recipe: str, block: int = 32,
                             backend: str = "auto"):
    """da [P, H], h13 [P, 2H] -> (dq [P, 2H], ds, dtq [2H, P], dts) for [dh1 | dh3]; see the module docstring."""
    who = "swiglu_quantize_backward"
    _check_h13(who, h13)
    _check_float(who, "da", da)
    if tuple(da.shape) != (h13.shape[0], h13.shape[1] // 2) or da.dtype != h13.dtype:
        _fail(who, f"da is {da.dtype} {tuple(da.shape)}; expected {h13.dtype} {(h13.shape[0], h13.shape[1] // 2)} "
                   f"(h13 is {tuple(h13.shape)})")
    _check_offs(who, offs)
    _same_device(who, da, h13, offs)
    _check_recipe(who, recipe, block, h13.shape[0], h13.shape[1] // 2, "H = h13.shape[1] / 2")
    with torch.no_grad():
        if _use_triton(da, backend):
            op = _op(_swiglu_backward_op, _swiglu_backward_traced, recipe)
            return op(da.contiguous(), h13.contiguous(), offs.contiguous(), recipe, int(block))
        return swiglu_quantize_backward_reference(da, h13, offs, recipe, block)
