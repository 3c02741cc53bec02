"""Float8 linear: one autograd function per recipe family, and the Float8Linear module.

GEMM operands per recipe (x [M, K] tokens, w [N, K], g = dL/dy [M, N]):
  tensorwise  x e4m3, w e4m3, g e5m2; one scale per tensor. GEMMs: torch._scaled_mm through torchao's
              Float8TrainingTensor (its emulate path dequantizes and matmuls in fp32).
  rowwise     e4m3 everywhere; one power-of-two scale per row/column along the GEMM's non-contracted dim.
              Casts: kernels.float8_cast (on CUDA one Triton read per cast; the forward's row casts also measure
              the column amax the backward's transposed column casts use).
  blockwise   e4m3; x and g 1x128 along the contracted dim, w 128x128 tiles (one quantization serves forward
              and grad-input). GPU: torch.nn.functional.scaled_mm BlockWise1x128 / BlockWise128x128.
  mxfp8       linear_granularity "mx32_tile32" (default): e4m3 + E8M0 per 32 along the contracted dim
              (kernels.mxfp8); w one scale per 32x32 tile. No kernel reads such tiles: the operands are dequantized
              to bf16 for cuBLAS (_MXFP8Tile32MM).
              "mx32": the same 1x32 blocks, w in 128x128 tiles (MX32_TILE); the GEMMs run on kernels.grouped_gemm's
              true-1x32 kernels with one group (Gluon on sm_90; _MXFP8MM).
              "mx128": the same numbers (e4m3, power-of-two scales) shared over blockwise's blocks and tiles
              (grad-weight's x^T: 128x128 tiles, MX128_WGRAD_X_TILES); GEMMs on cuBLAS blockwise like blockwise's
              (one autograd function, _BlockwiseMM(pow2=True)), operands from one-read Triton quantizers that
              write the scales in cuBLAS's layouts (kernels.grouped_gemm.quant_triton.to_mx128_blockwise).
              With float8 all-gather the weight arrives quantized: a gathered.Float8GatheredWeight (e4m3 bytes
              [N, K] + one E8M0 byte per 32x32 / 128x128 tile, made by FSDP2's pre-all-gather hook on each
              shard). The GEMM functions then take w from those bytes and never quantize it: mx32 / mx32_tile32
              expand the tile bytes to their per-32 scales; mx128 turns them into cuBLAS's padded tile-factor
              buffer for forward; for grad-input mx32 and mx128 transpose the bytes (1 byte per element, in
              backward) and the tile scales. Same tiles, same rule: bit for bit the operands a quantization of
              the full weight gives.
With emulate=True every recipe quantizes exactly as on the GPU and multiplies dequantized operands in fp32.
"""
from __future__ import annotations

import torch
import torch.nn as nn
try:  # tensorwise / rowwise GEMMs go through torchao's Float8TrainingTensor (torch._scaled_mm dispatch)
    from torchao.float8.float8_training_tensor import (
        Float8TrainingTensor,
        GemmInputRole,
        LinearMMConfig,
        ScaledMMConfig,
        hp_tensor_and_scale_to_float8,
    )
    TORCHAO_IMPORT_ERROR = None
except ImportError as _e:  # blockwise / mxfp8 and the config still work without torchao
    TORCHAO_IMPORT_ERROR = _e

    class Float8TrainingTensor:  # never instantiated: keeps isinstance() checks valid
        pass

    LinearMMConfig = ScaledMMConfig = GemmInputRole = hp_tensor_and_scale_to_float8 = None


def require_torchao(recipe: str):
    if TORCHAO_IMPORT_ERROR is not None and recipe in ("tensorwise", "rowwise"):
        raise ImportError(f"float8 recipe {recipe!r} needs torchao>=0.18 (its Float8TrainingTensor and scaled-mm "
                          f"dispatch): {TORCHAO_IMPORT_ERROR}") from TORCHAO_IMPORT_ERROR

from kernels.float8_cast import (
    to_float8_colwise_transposed,
    to_float8_rowwise,
    to_float8_transposed,
    to_float8_with_transpose,
)
from kernels.grouped_gemm import cublas_blockwise
from kernels.mxfp8 import e8m0_to_fp32

from .backward_order import zero_from
from .config import E4M3, E5M2, Float8Config
from .scaling import (
    BLOCK_K,
    dequantize_1x128,
    dequantize_128x128,
    mx_dequantize,
    mx_quantize,
    mx_quantize_weight,
    quantize_1x128,
    quantize_128x128,
    tensorwise_scale,
)
from .gathered import Float8GatheredWeight, tile_scales_along_k
from .weights import Float8TrainingWeight, linear_mm_config, unwrap_weight  # noqa: F401 (linear_mm_config: API)

if GemmInputRole is not None:
    INPUT, WEIGHT, GRAD = GemmInputRole.INPUT, GemmInputRole.WEIGHT, GemmInputRole.GRAD_OUTPUT


def _cast(t, scale, dtype, cfg, role, axiswise_dim=None):
    return hp_tensor_and_scale_to_float8(t, scale, dtype, cfg, role, axiswise_dim)


def cast_weight_tensorwise(w: torch.Tensor, cfg: LinearMMConfig) -> Float8TrainingTensor:
    return _cast(w, tensorwise_scale(w, E4M3), E4M3, cfg, WEIGHT)


def _weight_for_grad_input(w8: Float8TrainingTensor, g: torch.Tensor) -> Float8TrainingTensor:
    """The float8 weight gathered by FSDP2 as the column-major second operand of grad_input = g @ w (float8
    GEMMs on Hopper take only K-major operands, so this is a transposed copy of the weight).

    The copy must happen in backward. The gathered weight is a graph input, and torch.compile's partitioner
    otherwise moves its transposed copy into forward and keeps it alive until backward: 1 byte per parameter
    of every layer held across the step (tests/cpu/test_float8_memory.py counts it). Adding an integer zero
    computed from g ties the copy to backward; it stays ONE fused transposing kernel in inductor (an opaque
    custom op here ran as a slow eager byte transpose: 11 ms/step on 8 Llama-3-8B blocks, H200)."""
    return Float8TrainingTensor(_transpose_in_backward(w8._data, g).t(), w8._scale, w8._orig_dtype,
                                w8._linear_mm_config, w8._gemm_input_role)


def _transpose_in_backward(data: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """float8 data [R, C] -> its transpose [C, R] contiguous, copied after g exists (see _weight_for_grad_input
    for why a gathered weight's transpose must be tied to backward)."""
    u8 = data.view(torch.uint8)
    # [C, R] with R contiguous: the transposed copy, written by the add itself (one pass, eager or compiled)
    return torch.add(u8.t(), zero_from(g), out=u8.new_empty(u8.shape[1], u8.shape[0])).view(data.dtype)


def _tied_to(data: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """float8 data, the same bytes, made by a kernel that runs after g exists. A cast of a SAVED tensor depends on
    nothing backward computes, so inductor schedules it at backward's start and keeps it alive until its GEMM:
    the shared expert's two recasts of x (32 MB each at llama_moe) sat at the layer's peak
    (benchmarks/results/issue9_s17/). Compiled, the add fuses into the cast's kernel; eager runs in program order
    already, so there it is skipped (it would be a pass of its own)."""
    if not torch.compiler.is_compiling():
        return data
    return (data.view(torch.uint8) + zero_from(g)).view(data.dtype)


def _rowwise(t: torch.Tensor, cfg: LinearMMConfig, role):
    """t [R, C] -> (float8 t with one power-of-two scale per row, max |t| per column); one read of t (Triton
    on CUDA, kernels/float8_cast)."""
    data, scale, col_amax = to_float8_rowwise(t)
    return Float8TrainingTensor(data, scale, t.dtype, cfg, role, -1), col_amax


# Backward casts of tensors SAVED from forward (x, w) run as plain torch ops (compiled: inductor), not as
# Triton ops: the partitioner recomputes a fusible producer of x inside an inductor kernel, but it must
# materialize and save any input of an op it cannot fuse, so a Triton cast of x in backward made it save the
# bf16 input of every linear (+43% saved bytes on a Llama-shaped block; tests/gpu/test_float8_cast_gpu.py
# checks the Triton casts add nothing). With the scale known these casts are one transposing pass either way
# (inductor within 4% of our kernel, benchmarks/float8_cast.py). Casts of g, which exists only in backward,
# use Triton.
SAVED = "reference"


def _colwise(t: torch.Tensor, col_amax: torch.Tensor, cfg: LinearMMConfig, role, backend: str = "auto"):
    """t [R, C] -> float8 t with one power-of-two scale per column, stored column-major (its transpose
    row-major): the layout the GEMMs that contract over R read."""
    data_t, scale = to_float8_colwise_transposed(t, col_amax, backend=backend)
    return Float8TrainingTensor(data_t.t(), scale, t.dtype, cfg, role, 0)


class _ScaledMM(torch.autograd.Function):
    """Tensorwise and rowwise: operands are torchao Float8TrainingTensors; torch.mm dispatches to
    torch._scaled_mm (or the fp32 emulation)."""

    @staticmethod
    def forward(ctx, x, w, rowwise: bool, cfg: LinearMMConfig):
        x2 = x.reshape(-1, x.shape[-1])
        if not rowwise:
            x_scale = tensorwise_scale(x2, E4M3)
            x8 = _cast(x2, x_scale, E4M3, cfg, INPUT)
            # What backward gets of x: eager, the float8 copy (1 byte per element, where x itself would be 2).
            # Compiled, x and its scale: the partitioner then recasts x in backward (fused into the transposing
            # cast wgrad needs anyway) and keeps x only where a neighbour saves it already. Handing it x8 makes
            # it keep x8 as well (it never recomputes a cast that shrinks its fp32 input 4x): +1 byte per
            # element of every linear input, the ~0.5 GiB that float8 all-gather cost over torchao on 8
            # Llama-3-8B blocks.
            x_saved = (x2, x_scale) if torch.compiler.is_compiling() else (x8,)
            ctx.n_x = len(x_saved)
            if isinstance(w, Float8TrainingTensor):
                # float8 all-gather: FSDP2's post-all-gather built the float8 weight; saving it costs nothing
                # (it IS the unsharded parameter, whose storage FSDP2 frees after forward and re-gathers)
                w8 = w
                ctx.save_for_backward(*x_saved, w8)
            else:
                # bf16 all-gather: save the high-precision weight (the unsharded parameter: FSDP2 frees its
                # storage after forward and re-gathers it for backward, so saving it is free) and its scale,
                # not w8: a saved w8 would be a NEW 1-byte-per-parameter copy of every layer's full weight held
                # from forward to backward (eager). Backward recasts with the saved scale (no 2nd amax).
                w_scale = tensorwise_scale(w, E4M3)
                w8 = _cast(w, w_scale, E4M3, cfg, WEIGHT)
                ctx.save_for_backward(*x_saved, w, w_scale)
        else:
            # one read each: the row cast for this GEMM and the column amax the backward's column casts need
            x8, x_col_amax = _rowwise(x2, cfg, INPUT)
            w8, w_col_amax = _rowwise(w, cfg, WEIGHT)
            ctx.save_for_backward(x2, w, x_col_amax, w_col_amax)
        ctx.rowwise, ctx.cfg, ctx.w_dtype = rowwise, cfg, w.dtype
        out = torch.mm(x8, w8.t())
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, g):
        cfg = ctx.cfg
        g2 = g.reshape(-1, g.shape[-1])
        if not ctx.rowwise:
            saved = ctx.saved_tensors
            x_saved, (w8, *w_scale) = saved[:ctx.n_x], saved[ctx.n_x:]
            if ctx.n_x == 1:
                x8 = x_saved[0]
            else:
                # recast x already transposed (the column-major operand wgrad's _scaled_mm wants; plain ops,
                # see SAVED). Being a different graph node from forward's cast, it is not merged with it, so
                # the partitioner does not keep forward's x8 alive for it. Same scale, same cast: same bits.
                # Tied to g: made next to its GEMM, not at backward's start (_tied_to).
                x_hp, x_scale = x_saved
                x_t = _tied_to(to_float8_transposed(x_hp, x_scale, backend=SAVED), g2)
                x8 = Float8TrainingTensor(x_t.t(), x_scale, x_hp.dtype, cfg, INPUT)
            if w_scale:
                # bf16 all-gather: recast the saved weight straight into the column-major operand grad-input
                # reads (one transposing pass, plain ops as x's), tied to g like x's recast. (A row-major recast
                # is forward's cast node: merged with it, the tie made the partitioner save forward's float8 w.)
                w_t = _tied_to(to_float8_transposed(w8, w_scale[0], backend=SAVED), g2)
                w8 = Float8TrainingTensor(w_t.t(), w_scale[0], w8.dtype, cfg, WEIGHT)
            # g in both layouts from one read (Triton on CUDA): row-major for grad-input, transposed for
            # grad-weight's K-major first operand. Trade-off measured: +0.5..5% on single linears against
            # inductor's fused cast, but g must exist in bf16 where inductor fused its producer (SwiGLU
            # backward) into the cast: FSDP 8 blocks 117.5 ms / 19.61 GiB vs 115.3 / 19.54, two runs apart.
            g_scale = tensorwise_scale(g2, E5M2)
            g_data, g_data_t = to_float8_with_transpose(g2, g_scale, E5M2)
            g8 = Float8TrainingTensor(g_data, g_scale, g2.dtype, cfg, GRAD)
            g8_t = Float8TrainingTensor(g_data_t, g_scale, g2.dtype, cfg, GRAD)
            if not w_scale:  # float8 all-gather: transpose the gathered weight here, not in forward
                w8 = _weight_for_grad_input(w8, g2)
            grad_x = torch.mm(g8, w8)
            grad_w = torch.mm(g8_t, x8)
        else:
            x2, w, x_col_amax, w_col_amax = ctx.saved_tensors
            g8_rows, g_col_amax = _rowwise(g2, cfg, GRAD)
            grad_x = torch.mm(g8_rows, _colwise(w, w_col_amax, cfg, WEIGHT, SAVED))
            grad_w = torch.mm(_colwise(g2, g_col_amax, cfg, GRAD).t(), _colwise(x2, x_col_amax, cfg, INPUT, SAVED))
        grad_x = grad_x.reshape(*g.shape[:-1], grad_x.shape[-1])
        return grad_x, grad_w.to(ctx.w_dtype), None, None


def _mm_dtype(t: torch.Tensor, emulate: bool) -> torch.dtype:
    return torch.float32 if emulate or not t.is_cuda else torch.bfloat16


def _check_rows(M: int, multiple: int, recipe: str):
    if M % multiple:
        raise ValueError(f"float8 {recipe}: the number of tokens (rows of the flattened input) is {M}; it must be "
                         f"a multiple of {multiple} (the weight-gradient GEMM scales blocks along tokens)")


def _blockwise_uses_scaled_mm(t: torch.Tensor, emulate: bool) -> bool:
    """Where the blockwise GEMMs run on cuBLAS (F.scaled_mm) rather than dequantized in fp32. One function so
    tests/cpu/test_float8_blockwise_layout.py can force the cuBLAS path on CPU and check its arguments."""
    return not emulate and t.is_cuda


def _blockwise_gemm(a_q, a_s, b_q, b_s, b_is_tile: bool, emulate: bool, out_dtype, inverse: bool = False):
    """a [M, K] 1x128-scaled along K; b [N, K] (128x128 tiles if b_is_tile, else 1x128 along K).
    Returns a @ b.T. inverse: the scales are dequantization factors (x = data * factor) in cuBLAS's layouts
    (mx128; a 128x128 one as its padded [N/128, round_up(K/128, 4)] buffer), else our scales (x = data / scale)."""
    if not _blockwise_uses_scaled_mm(a_q, emulate):
        if inverse:  # power-of-two factors: data * f == data / (1 / f) exactly
            a_s = a_s.reciprocal()
            b_s = (b_s[:, : b_q.shape[1] // BLOCK_K] if b_is_tile else b_s).reciprocal()
        a = dequantize_1x128(a_q, a_s)
        b = dequantize_128x128(b_q, b_s) if b_is_tile else dequantize_1x128(b_q, b_s)
        return (a @ b.t()).to(out_dtype)
    if a_q.is_cuda and not torch.compiler.is_compiling():  # traced: picked before, by prepare_backend
        cublas_blockwise.load_backend()
    return cublas_blockwise.blockwise_scaled_mm(a_q, a_s, b_q, b_s, b_is_tile, inverse).to(out_dtype)


def _uses_triton_quantizers(t: torch.Tensor, emulate: bool) -> bool:
    """mx128 and mx32 quantization: the one-read Triton quantizers (kernels.grouped_gemm.quant_triton) on CUDA, their
    bit-identical plain PyTorch twins (kernels.grouped_gemm.quant) elsewhere and when emulating (so the GPU
    tests' emulated twins also check the Triton quantizers). A function so CPU tests can force the Triton path
    under TRITON_INTERPRET=1."""
    return t.is_cuda and not emulate


def _quantize_mx128(t: torch.Tensor, tile: bool, rows: bool, cols: bool, emulate: bool, col_tile=None, after=None):
    """t [R, C] -> (row copy, col copy), each (data e4m3, fp32 factor 2^e) or None where not asked for: MXFP8
    numbers with power-of-two scales shared over 1x128 blocks (row: along C; col, t^T [C, R]: along R) or
    128x128 tiles (tile; col_tile, default tile, for the col copy alone), the factors already in the layout
    cuBLAS reads (kernels.grouped_gemm.quant blockwise_scale_buffers). One read of t on CUDA; no aten
    transposing copy of t. `after`: see kernels.grouped_gemm.quant_triton.to_mx128_blockwise."""
    col_tile = tile if col_tile is None else col_tile
    if _uses_triton_quantizers(t, emulate):
        from kernels.grouped_gemm.quant_triton import to_mx128_blockwise
        row, col = to_mx128_blockwise(t, tile, col_tile=col_tile, do_row=rows, do_col=cols, after=after)
    else:
        from kernels.grouped_gemm.quant import to_mx128_blockwise_reference
        row, col = to_mx128_blockwise_reference(t, tile, rows, cols, col_tile)
    return (row if rows else None), (col if cols else None)


def _quantize_blockwise(t: torch.Tensor, tile: bool, rows: bool, cols: bool, emulate: bool, col_tile=None):
    """The blockwise recipe's operands, as _quantize_mx128's copies but with our scales 448 / amax (data = x *
    scale) in plain logical layouts (blockwise_scaled_mm_args lays them out for cuBLAS); aten ops."""
    if tile:
        q, s = quantize_128x128(t)
        return (q, s) if rows else None, (q.t(), s.t()) if cols else None
    return quantize_1x128(t) if rows else None, quantize_1x128(t.t()) if cols else None


def _check_gathered(w: Float8GatheredWeight, tile: int, recipe: str) -> None:
    """A float8-all-gathered weight must carry one E8M0 byte per tile x tile square of a 2-D [N, K] weight."""
    want = (w.shape[0] // tile, w.shape[-1] // tile)
    if w._data.dim() != 2 or w._scale.dtype != torch.uint8 or tuple(w._scale.shape) != want:
        raise ValueError(f"float8 {recipe}: the all-gathered weight {tuple(w.shape)} carries {w._scale.dtype} scales "
                         f"of shape {tuple(w._scale.shape)}; this GEMM needs one E8M0 byte per {tile}x{tile} "
                         f"tile of a 2-D weight, {want}")


def _mx128_weight_from_gathered(w: Float8GatheredWeight, g=None):
    """mx128's weight operand from the all-gathered bytes, exactly what _quantize_mx128 writes for the full
    weight: (e4m3 data, fp32 tile factors 2^e as the padded [rows/128, round_up(cols/128, 4)] buffer).
    g None (forward): w [N, K]. g given (grad-input): w^T [K, N], the same tiles transposed: a 1-byte
    transposing copy of the data, made in backward (tied to g), and the factor grid transposed."""
    _check_gathered(w, BLOCK_K, "mxfp8 mx128")
    f = e8m0_to_fp32(w._scale)
    if g is None:
        return w._data, cublas_blockwise.pad_tile_factors(f)
    return _transpose_in_backward(w._data, g), cublas_blockwise.pad_tile_factors(f.t())


# mx128: grad-weight's x^T operand as 128x128 tiles (128 tokens x 128 features share a scale) rather than 1x128
# blocks along tokens (g^T keeps 1x128 blocks along tokens). cuBLAS runs that GEMM with its 1x128 x 128x128 kernel,
# ~1.27x faster than its 1x128 x 1x128 one: on an H100 at 8192x4096->4096 grad-weight takes 215 us instead of 269,
# and the whole op fwd+bwd 1.314x bf16 instead of 1.230x (benchmarks/results/float8_linear_mx128-*.md). The price
# is a coarser scale for x in grad-weight only: a feature channel far above its 127 neighbours in a tile costs
# them precision there. False restores 1x128 blocks (the numerics DeepSeek-V3 uses for that operand).
MX128_WGRAD_X_TILES = True


class _BlockwiseMM(torch.autograd.Function):
    """y = x @ w.T with 1x128 blocks of x / grad_out along the contracted dim, 128x128 tiles of w (one
    quantization serves the forward and grad-input GEMMs), 1x128 blocks along tokens for grad-weight; GPU GEMMs
    on cuBLAS blockwise (blockwise_scaled_mm), emulated ones in fp32. `pow2` picks the numbers:
      False  recipe "blockwise": fp32 scales 448 / amax (DeepSeek V3), quantized with aten ops
      True   recipe "mxfp8", linear_granularity "mx128": MXFP8's E8M0 rule (power-of-two scales, NaN/inf blocks
             NaN), quantized with kernels.grouped_gemm's one-read quantizers; forward keeps x^T (the grad-weight
             operand, written from the same read as x's forward copy, 1 byte per element) instead of x, and the
             weight itself: backward quantizes w^T (grad-input's operand) next to its use. A float8 w^T kept from
             forward would hold 1 byte per parameter of every layer across the step, where FSDP2 frees the
             gathered weight after forward and gathers it again for backward.
             A float8-all-gathered w (Float8GatheredWeight) is never quantized: forward reads its bytes and tile
             scales, backward transposes them (_mx128_weight_from_gathered)."""

    @staticmethod
    def forward(ctx, x, w, emulate: bool, pow2: bool = False, grad: bool = True, xt_tile: bool = False):
        # grad: the caller's grad mode (forward itself always runs under no_grad, and needs_input_grad ignores
        # it): evaluation writes no backward copies and takes any number of tokens.
        # xt_tile (mx128 only): grad-weight's x^T operand in 128x128 tiles (tokens x features) instead of 1x128
        # blocks along tokens (MX128_WGRAD_X_TILES says why one would)
        x2 = x.reshape(-1, x.shape[-1])
        need_gx, need_gw = grad and ctx.needs_input_grad[0], grad and ctx.needs_input_grad[1]
        quant = _quantize_mx128 if pow2 else _quantize_blockwise
        if pow2 and need_gw:
            _check_rows(x2.shape[0], BLOCK_K, "mxfp8 mx128")
        # blockwise keeps x and recasts it in backward (its aten transposing cast); mx128 writes x^T now
        (xq, xs), xt = quant(x2, False, True, pow2 and need_gw, emulate, col_tile=pow2 and xt_tile)
        if isinstance(w, Float8GatheredWeight):
            if not pow2:
                raise ValueError(f"float8 blockwise: weight {tuple(w.shape)} arrived float8-all-gathered (mxfp8 "
                                 f"tiles); the blockwise recipe has no float8 all-gather")
            wq, ws = _mx128_weight_from_gathered(w)
        else:
            (wq, ws), _ = quant(w, True, True, False, emulate)
        if pow2:
            ctx.save_for_backward(*(xt or (None, None)), w if need_gx else None)
        else:
            ctx.save_for_backward(x2, wq, ws)
        ctx.emulate, ctx.w_dtype, ctx.pow2, ctx.xt_tile = emulate, w.dtype, pow2, pow2 and xt_tile
        out = _blockwise_gemm(xq, xs, wq, ws, True, emulate, x.dtype, pow2)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, g):
        g2 = g.reshape(-1, g.shape[-1])
        recipe = "mxfp8 mx128" if ctx.pow2 else "blockwise"
        _check_rows(g2.shape[0], BLOCK_K, recipe)
        need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.pow2:
            xtq, xts, w = ctx.saved_tensors
            # g in both layouts from one read: rows (1x128 along N) for grad-input, g^T (1x128 along tokens)
            g_row, g_col = _quantize_mx128(g2, False, need_gx, need_gw, ctx.emulate)
            if need_gx and isinstance(w, Float8GatheredWeight):  # the gathered tiles, transposed
                wtq, wts = _mx128_weight_from_gathered(w, g2)
            elif need_gx:  # w^T in the same 128x128 tiles as forward's w (same numbers, transposed); after=g2 keeps
                # it in backward under torch.compile
                wtq, wts = _quantize_mx128(w, True, False, True, ctx.emulate, after=g2)[1]
        else:
            x2, wq, ws = ctx.saved_tensors
            wtq, wts = wq.t(), ws.t()
            g_row, g_col = _quantize_blockwise(g2, False, need_gx, need_gw, ctx.emulate)
            if need_gw:
                xtq, xts = quantize_1x128(x2.t())
        grad_x = grad_w = None
        if need_gx:
            # grad_input = g @ w: contraction over N; w's 128x128 tiles serve both orientations
            grad_x = _blockwise_gemm(*g_row, wtq, wts, True, ctx.emulate, g.dtype, ctx.pow2)
            grad_x = grad_x.reshape(*g.shape[:-1], grad_x.shape[-1])
        if need_gw:
            # grad_weight = g.T @ x: contraction over tokens, 1x128 blocks along tokens for both
            grad_w = _blockwise_gemm(*g_col, xtq, xts, ctx.xt_tile, ctx.emulate, ctx.w_dtype, ctx.pow2)
        return grad_x, grad_w, None, None, None, None


def _mx32_tile32_weight(w: torch.Tensor):
    """(e4m3 data [N, K], E8M0 scale_k [N, K/32]) of the 32x32-tile weight: a float8-all-gathered weight's
    bytes with its tile bytes expanded along K, or a plain weight quantized now (scaling.mx_quantize_weight)."""
    if isinstance(w, Float8GatheredWeight):
        _check_gathered(w, 32, "mxfp8 mx32_tile32")
        return w._data, tile_scales_along_k(w._scale, 32, w.shape[0], w.shape[1])
    return mx_quantize_weight(w)


class _MXFP8Tile32MM(torch.autograd.Function):
    """mxfp8 "mx32_tile32": x and g 1x32 along the contracted dim, w 32x32 tiles (one quantization, or the
    all-gathered bytes, serves forward and grad-input); the operands are decoded and multiplied in fp32
    (emulate / CPU) or bf16 (no kernel reads 32x32 weight tiles)."""

    @staticmethod
    def forward(ctx, x, w, emulate: bool):
        x2 = x.reshape(-1, x.shape[-1])
        dt = _mm_dtype(x2, emulate)
        xq, xs = mx_quantize(x2, -1)
        wq, wsk = _mx32_tile32_weight(w)
        w_deq = mx_dequantize(wq, wsk, -1, dt)
        out = (mx_dequantize(xq, xs, -1, dt) @ w_deq.t()).to(x.dtype)
        # a gathered weight is saved as itself (its bytes are the unsharded parameter, which FSDP2 gathers again
        # for backward), not its expanded scales: nothing new is held from forward to backward
        ctx.save_for_backward(x2, *((w, None) if isinstance(w, Float8GatheredWeight) else (wq, wsk)))
        ctx.emulate, ctx.w_dtype = emulate, w.dtype
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, g):
        x2, wq, wsk = ctx.saved_tensors
        if wsk is None:  # wq is the gathered weight
            wq, wsk = _mx32_tile32_weight(wq)
        g2 = g.reshape(-1, g.shape[-1])
        _check_rows(g2.shape[0], 32, "mxfp8 mx32_tile32")
        dt = _mm_dtype(g2, ctx.emulate)
        # the 32x32-tile weight dequantizes identically along N: no second quantization for grad-input
        w_deq = mx_dequantize(wq, wsk, -1, dt)
        gq, gs = mx_quantize(g2, -1)
        grad_x = (mx_dequantize(gq, gs, -1, dt) @ w_deq).to(g.dtype)
        gcq, gcs = mx_quantize(g2, 0)
        xcq, xcs = mx_quantize(x2, 0)
        grad_w = (mx_dequantize(gcq, gcs, 0, dt).t() @ mx_dequantize(xcq, xcs, 0, dt)).to(ctx.w_dtype)
        return grad_x.reshape(*g.shape[:-1], grad_x.shape[-1]), grad_w, None


# mxfp8 "mx32": every activation and gradient in plain OCP MX 1x32 blocks, the weight in 128x128 tiles; grad-weight
# reads g^T in 1x32 blocks along tokens and x^T with one scale per 32 tokens x 128 features. These are the routed
# experts' "mx32" numbers (titan_fp8.float8.experts) with one group, and the operands the true-1x32 grouped GEMMs
# of kernels.grouped_gemm read (Gluon on sm_90): their promotion multiplies a per-row 1x32 factor of x by ONE
# factor of a 128-row weight tile, so a weight scale that varied inside those 128 rows (32x32 tiles) would cost a
# second multiply per element per step. The tile bytes are mx128's: a float8-all-gathered mx32 weight is the same
# Float8GatheredWeight (e4m3 bytes, one E8M0 byte per 128x128 tile).
MX32_TILE = 128


def _quantize_mx32(t: torch.Tensor, rows: bool, cols: bool, col_tile: int, emulate: bool):
    """t [R, C] -> (row copy, token-major copy), each (e4m3 data, E8M0 scale) or None where not asked for: the row
    copy in 1x32 blocks along C ([R, C/32] scales); the token-major copy t^T [C, R'] (R' = R rounded up to 32, zero
    rows appended) with one scale per 32 of R x col_tile (1 or 128) of C ([C, R'/32] scales). One read of t on CUDA
    (kernels.grouped_gemm.quant_triton), its bit-identical plain PyTorch twin elsewhere and when emulating."""
    if _uses_triton_quantizers(t, emulate):
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
    else:
        from kernels.grouped_gemm.quant import to_mxfp8_blocked_rowcol_reference as to_mxfp8_blocked_rowcol
    rd, rs, cd, cs = to_mxfp8_blocked_rowcol(t, row_block=32, col_block=32, col_tile=col_tile, do_row=rows,
                                             do_col=cols)
    return ((rd, rs) if rows else None), ((cd, cs) if cols else None)


def _mx32_weight(w: torch.Tensor, emulate: bool, g=None):
    """mx32's weight operand, 128x128 tiles, (e4m3 data, E8M0 scale in kernels.mxfp8's layout along the
    contracted dim). g None (forward): w [N, K] with scale [N, K/32]. g given (grad-input): w^T [K, N] with scale
    [K, N/32], made in backward after g: a gathered weight's bytes transposed (1 byte per element), a plain one
    quantized along N from one read (no bf16 or float8 copy of it is kept from forward)."""
    if isinstance(w, Float8GatheredWeight):
        _check_gathered(w, MX32_TILE, "mxfp8 mx32")
        if g is None:
            return w._data, w.scale_along_k()
        return (_transpose_in_backward(w._data, g),
                tile_scales_along_k(w._scale.t(), MX32_TILE, w.shape[1], w.shape[0]))
    if _uses_triton_quantizers(w, emulate):
        from kernels.grouped_gemm.quant_triton import to_mxfp8_blocked_rowcol
        if g is None:
            return to_mxfp8_blocked_rowcol(w, row_block=MX32_TILE, row_tile=MX32_TILE, do_col=False)[:2]
        return to_mxfp8_blocked_rowcol(w, col_block=MX32_TILE, col_tile=MX32_TILE, do_row=False, after=g)[2:]
    from kernels.grouped_gemm.quant import to_mxfp8_blocked
    return to_mxfp8_blocked(w if g is None else w.t(), -1, MX32_TILE, MX32_TILE)


def _mx32_gemms_on_kernels(t: torch.Tensor, emulate: bool) -> bool:
    """Where mx32's GEMMs run on kernels.grouped_gemm (CUDA; its backend "auto": Gluon on sm_90, Triton
    elsewhere) rather than on the decoded operands in fp32. A function so CPU tests can force the kernels'
    path (their Triton kernels under TRITON_INTERPRET=1)."""
    return t.is_cuda and not emulate


class _MXFP8MM(torch.autograd.Function):
    """mxfp8 "mx32" (MX32_TILE says what shares a scale): GPU GEMMs on kernels.grouped_gemm with one group,
    fprop / dgrad / wgrad, never a dequantized bf16 operand; emulated ones decode the same operands and multiply
    in fp32. Forward keeps x's token-major float8 copy (grad-weight's operand, from the same read as x's row
    copy) and the weight itself, as mx128 does (_BlockwiseMM says why not w^T)."""

    @staticmethod
    def forward(ctx, x, w, emulate: bool, grad: bool = True):
        x2 = x.reshape(-1, x.shape[-1])
        need_gx, need_gw = grad and ctx.needs_input_grad[0], grad and ctx.needs_input_grad[1]
        (xq, xs), xt = _quantize_mx32(x2, True, need_gw, MX32_TILE, emulate)
        wq, ws = _mx32_weight(w, emulate)
        ctx.save_for_backward(*(xt or (None, None)), w if need_gx else None)
        ctx.emulate, ctx.w_dtype = emulate, w.dtype
        if _mx32_gemms_on_kernels(xq, emulate):
            from kernels.grouped_gemm import mxfp8_grouped_mm_fprop
            out = mxfp8_grouped_mm_fprop(xq, xs, wq.unsqueeze(0), ws.unsqueeze(0), _one_group(x2),
                                         _kernel_out_dtype(x.dtype), block=32, w_tile=MX32_TILE,
                                         validate=False).to(x.dtype)
        else:
            out = (mx_dequantize(xq, xs, -1, torch.float32) @ mx_dequantize(wq, ws, -1, torch.float32).t()).to(x.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, g):
        xtq, xts, w = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # g in both layouts from one read: rows (1x32 along N) for grad-input, g^T (1x32 along tokens) for
        # grad-weight
        g_row, g_col = _quantize_mx32(g2, need_gx, need_gw, 1, ctx.emulate)
        kernels = _mx32_gemms_on_kernels(g2, ctx.emulate)
        offs = _one_group(g2) if kernels else None  # one [M] for both GEMMs
        grad_x = grad_w = None
        if need_gx:
            wtq, wts = _mx32_weight(w, ctx.emulate, g2)  # w^T [K, N], scale [K, N/32]
            if kernels:
                from kernels.grouped_gemm import mxfp8_grouped_mm_dgrad
                # the contract's W [E, N, K] scaled along N: a transposed view of the contiguous w^T (no copy)
                grad_x = mxfp8_grouped_mm_dgrad(*g_row, wtq.t().unsqueeze(0), wts.t().unsqueeze(0),
                                                offs, _kernel_out_dtype(g.dtype), block=32,
                                                w_tile=MX32_TILE, validate=False).to(g.dtype)
            else:
                grad_x = (mx_dequantize(*g_row, -1, torch.float32)
                          @ mx_dequantize(wtq, wts, -1, torch.float32).t()).to(g.dtype)
            grad_x = grad_x.reshape(*g.shape[:-1], grad_x.shape[-1])
        if need_gw:
            if kernels:
                from kernels.grouped_gemm import mxfp8_grouped_mm_wgrad
                # bf16 weights: the kernel rounds its fp32 sum to bf16 itself
                grad_w = mxfp8_grouped_mm_wgrad(*g_col, xtq, xts, offs, _kernel_out_dtype(ctx.w_dtype),
                                                block=32, a_tile=MX32_TILE, validate=False)[0]
            else:  # token-major copies: the appended zero tokens add nothing
                grad_w = (mx_dequantize(*g_col, -1, torch.float32)
                          @ mx_dequantize(xtq, xts, -1, torch.float32).t())
            grad_w = grad_w.to(ctx.w_dtype)
        return grad_x, grad_w, None, None


def _kernel_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the grouped GEMMs write for a result wanted in `dtype`: bf16 or fp32 as asked (the outputs the kernels
    are tested with), fp32 for anything else (fp16 model: one rounding in the cast after)."""
    return dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32


def _one_group(t: torch.Tensor) -> torch.Tensor:
    """offs of the grouped GEMMs for a dense one: a single group of all t's rows (int32 [1], no host sync)."""
    return torch.full((1,), t.shape[0], dtype=torch.int32, device=t.device)


def float8_linear(x: torch.Tensor, w: torch.Tensor, config: Float8Config, cfg=None):
    """y = x @ w.T with the recipe's float8 numerics (no bias)."""
    name = config.recipe_name
    if not config.emulate and not x.is_cuda:
        raise RuntimeError(f"float8 {name}: input is on {x.device}; float8 GEMMs need a CUDA GPU (sm_89+). "
                           f"Set [float8] emulate = true to run the float8 numerics on CPU.")
    if name in ("tensorwise", "rowwise"):
        return _ScaledMM.apply(x, w, name == "rowwise", cfg or linear_mm_config(config.emulate))
    if name == "blockwise" or config.mx128_linear:
        return _BlockwiseMM.apply(x, w, config.emulate, name == "mxfp8", torch.is_grad_enabled(),
                                  MX128_WGRAD_X_TILES)
    if config.linear_granularity == "mx32_tile32":
        return _MXFP8Tile32MM.apply(x, w, config.emulate)
    return _MXFP8MM.apply(x, w, config.emulate, torch.is_grad_enabled())


def _plain_weight_in_state_dict(module, state_dict, prefix, local_metadata):
    """Checkpoints hold the plain high-precision weight (sharing storage, so DCP loads in place): no
    subclass ever reaches a checkpoint file, and a float8 checkpoint loads into a bf16 model and back."""
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = unwrap_weight(state_dict[key])
    return state_dict


def _drop_scale_cache(module, incompatible_keys):
    module._float8_scale_cache = None  # the loaded weight needs a new scale


class Float8Linear(nn.Linear):
    """nn.Linear whose matmuls run in float8 (recipe from `float8_config`). Weight and bias stay in high
    precision (checkpoints hold them); with float8 all-gather the weight is a Float8TrainingWeight whose
    FSDP2 hooks gather it already quantized (forward then sees a torchao Float8TrainingTensor for tensorwise,
    a Float8GatheredWeight for mxfp8)."""

    float8_config: Float8Config

    @classmethod
    def from_linear(cls, mod: nn.Linear, config: Float8Config) -> "Float8Linear":
        with torch.device("meta"):
            new = cls(mod.in_features, mod.out_features, bias=False)
        new.weight = mod.weight
        new.bias = mod.bias
        require_torchao(config.recipe_name)
        new.float8_config = config
        new._mm_config = linear_mm_config(config.emulate)
        if config.enable_fsdp_float8_all_gather:
            new.weight = nn.Parameter(Float8TrainingWeight(mod.weight.data, config),
                                      requires_grad=mod.weight.requires_grad)
            new._register_state_dict_hook(_plain_weight_in_state_dict)
            new.register_load_state_dict_post_hook(_drop_scale_cache)
        return new

    def prepare_backend(self, device) -> None:
        """Pick, eagerly, the kernel of the cuBLAS blockwise op (titan_fp8::blockwise_scaled_mm: the C++ one, built
        at first use, unless TITAN_FP8_BLOCKWISE_MM says otherwise) for the recipes that call it on CUDA. parallelize
        calls it before torch.compile, which must not trace the build."""
        c = self.float8_config
        if torch.device(device).type == "cuda" and not c.emulate and (c.recipe_name == "blockwise" or c.mx128_linear):
            cublas_blockwise.load_backend()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = float8_linear(x, self.weight, self.float8_config, self._mm_config)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        c = self.float8_config
        gran = f"/{c.linear_granularity}" if c.linear_granularity else ""
        return (f"{super().extra_repr()}, recipe={c.recipe_name}{gran}, float8_all_gather="
                f"{c.enable_fsdp_float8_all_gather}, emulate={c.emulate}")
