"""Memory accounting of the float8 linear and its FSDP2 hooks, counted on CPU (emulate=True).

- saved for backward: bytes of the distinct storages autograd keeps from forward to backward for one
  Llama-shaped block (wq, wo, w1/w3 sharing their input, w2), parameters excluded (FSDP2 frees and re-gathers
  the unsharded parameter's storage, so saving it costs nothing). Ours vs torchao's Float8Linear vs bf16.
- compiled: what torch.compile's partitioner keeps for backward (it, not our autograd function, decides),
  ours and ours with a float8-gathered weight vs torchao; no float8 copy may be kept.
- precompute: nothing but a 4-byte scale per weight stays on the modules (no cast shards: those were 1 byte
  per local parameter for the whole step), and no op inside it makes a tensor bigger than 8 bytes per weight.
- import without torchao: blockwise / mxfp8 work, tensorwise fails at conversion naming torchao.
"""
import contextlib
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from titan_fp8.float8 import Float8Config, Float8Linear, convert_to_float8_training
from titan_fp8.float8 import precompute_float8_dynamic_scale_for_fsdp
from titan_fp8.models.probe_block import ProbeBlock

D, H, M = 256, 896, 512  # H = 3.5 D as Llama-3-8B


def Block():
    return ProbeBlock(D, H)


def _storage(t):
    return getattr(t, "_data", t).untyped_storage()  # a torchao Float8TrainingTensor holds its bytes in _data


saved_float8_shapes: list = []  # filled by saved_bytes


def saved_bytes(mode: str) -> int:
    saved_float8_shapes.clear()
    torch.manual_seed(0)
    m = Block().to(torch.bfloat16)
    if mode == "torchao":
        pytest.importorskip("torchao")
        from torchao.float8 import Float8LinearConfig
        from torchao.float8 import convert_to_float8_training as ao_convert
        ao_convert(m, config=Float8LinearConfig(emulate=True))
    elif mode in ("ours", "ours_mx128"):
        cfg = dict(recipe_name="mxfp8", linear_granularity="mx128") if mode == "ours_mx128" else {}
        convert_to_float8_training(m, Float8Config(emulate=True, filter_fqns=["none"], **cfg))
        assert all(isinstance(getattr(m, n), Float8Linear) for n in ("wq", "wo", "w1", "w3", "w2"))
    params = {_storage(p).data_ptr() for p in m.parameters()}
    seen = {}

    def pack(t):
        st = _storage(t)
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
            if getattr(t, "_data", t).dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                saved_float8_shapes.append(tuple(t.shape))
        return t

    x = torch.randn(M, D, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = m(x)
    out.float().sum().backward()  # the saved tensors really serve the backward
    assert all(p.grad is not None for p in m.parameters())
    return sum(seen.values())


def test_saved_for_backward_bytes_ours_le_torchao_and_bf16():
    ours, ao, bf16 = saved_bytes("ours"), saved_bytes("torchao"), saved_bytes("bf16")
    # float8 inputs (1 byte) instead of bf16 ones, and NO float8 copy of the weight: a saved w8 would add
    # 1 byte per weight element (D*D*2 + 3*D*H bytes = 6.25 M*D here) and put ours above both
    weight_copy = 2 * D * D + 3 * D * H
    assert ours <= ao and ours <= bf16, (ours, ao, bf16)
    assert ours + weight_copy > bf16  # the bound above is tight enough to catch a saved w8
    # analytic: ours saves x8 of wq, wo, w1, w3 (M*D each) and w2 (M*H), plus what norms / SwiGLU save
    assert bf16 - ours >= 2 * M * D, (ours, bf16)


def test_mx128_linear_keeps_no_float8_weight_for_backward():
    """MXFP8 Linears with linear_granularity = "mx128" keep x^T in float8 (1 byte per input element, the grad-weight
    operand) and the weight itself (FSDP2 frees and re-gathers it), never a float8 copy of the weight: w^T is
    quantized in backward. A saved float8 w^T held 1 byte per parameter of every layer across the step."""
    ours, bf16 = saved_bytes("ours_mx128"), saved_bytes("bf16")
    saved_bytes("ours_mx128")
    weights = {(D, D), (H, D), (D, H)}
    assert not weights & set(saved_float8_shapes), saved_float8_shapes
    assert {(D, M), (H, M)} <= set(saved_float8_shapes), saved_float8_shapes  # x^T of the D- and H-input layers
    assert ours < bf16, (ours, bf16)


def _hardware_path_linears(m, rowwise: bool, gathered: bool):
    """Convert m's Linears to ours (tensorwise or rowwise) and run them on the hardware _scaled_mm path (which CPU
    torch runs too); gathered: every weight arrives as the float8 tensor FSDP2's float8 all-gather hands the linear
    (a parameter of the module, as FSDP2 registers it)."""
    from titan_fp8.float8.linear import _ScaledMM, cast_weight_tensorwise, linear_mm_config
    convert_to_float8_training(m, Float8Config(recipe_name="rowwise" if rowwise else "tensorwise",
                                               emulate=True, filter_fqns=["none"]))
    cfg = linear_mm_config(False)
    for mod in m.modules():
        if isinstance(mod, Float8Linear):
            if gathered:
                mod.weight = nn.Parameter(cast_weight_tensorwise(mod.weight.detach(), cfg))
            mod.forward = lambda x, mod=mod: _ScaledMM.apply(x, mod.weight, rowwise, cfg)


@contextlib.contextmanager
def _scaled_mm_by_matmul():
    """CPU torch's kernel for a float8 e4m3 x e4m3 _scaled_mm with tensor-wide scales takes seconds for one of this
    block's GEMMs (about 1000x an fp32 matmul of the same shape; rowwise scales or an e5m2 operand are fast), and the
    compiled tests below run one block's forward 1-2x per mode only so that autograd sees what the partitioner
    saved. Inside this, aten._scaled_mm on CPU is the same product, (a * scale_a) @ (b * scale_b) (+ bias) in fp32,
    in out_dtype (same shape, dtype and layout). Tracing, partitioning and inductor's lowering never run the CPU
    kernel (they see fake tensors), so the graphs and what is saved for backward are the same as without it."""
    lib = torch.library.Library("aten", "IMPL")

    def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        assert scale_result is None
        out = (a.float() * scale_a.float()) @ (b.float() * scale_b.float())
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype or a.dtype)

    def scaled_mm_out(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False,
                      *, out):  # inductor's extern call
        return out.copy_(scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum))

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Overriding a previously registered kernel")
            lib.impl("_scaled_mm", scaled_mm, "CPU")
            lib.impl("_scaled_mm.out", scaled_mm_out, "CPU")
        yield
    finally:
        lib._destroy()  # the CPU kernels torch registered are the ones dispatched again


def compiled_saved(mode: str, inductor: bool = False, device: str = "cpu"):
    """(bytes, saved float8 tensor shapes) that torch.compile's partitioner keeps for backward of one block,
    parameters excluded. Graphs as on the GPU (hardware _scaled_mm path, which CPU torch runs too); no
    inductor, so only the partitioner's choices count. "ours_ag": every weight arrives as the float8 tensor
    FSDP2's float8 all-gather hands the linear (a parameter of the module, as FSDP2 registers it)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Block().to(device=device, dtype=torch.bfloat16)
    if mode.startswith("torchao"):
        pytest.importorskip("torchao")
        from torchao.float8 import Float8LinearConfig
        from torchao.float8 import convert_to_float8_training as ao_convert
        ao_convert(m, config=Float8LinearConfig.from_recipe_name("rowwise") if mode == "torchao_rowwise"
                   else Float8LinearConfig(emulate=False))
    else:
        _hardware_path_linears(m, rowwise=mode == "ours_rowwise", gathered=mode == "ours_ag")
    params = {_storage(p).data_ptr() for p in m.parameters()}
    seen, f8_shapes = {}, []

    def pack(t):
        st = _storage(t)
        if st.data_ptr() not in params and st.data_ptr() not in seen:
            seen[st.data_ptr()] = st.nbytes()
            if getattr(t, "_data", t).dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                f8_shapes.append(tuple(t.shape))
        return t

    nop = lambda gm, example_inputs: gm  # noqa: E731
    f = torch.compile(m) if inductor else torch.compile(
        m, backend=aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=min_cut_rematerialization_partition))
    x = torch.randn(M, D, dtype=torch.bfloat16, device=device, requires_grad=True)
    with _scaled_mm_by_matmul():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = f(x)
        out.float().sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    return sum(seen.values()), f8_shapes


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_saved_for_backward_ours_le_torchao():
    """Under torch.compile the partitioner, not our autograd function, picks what is saved. It never recomputes
    a cast that shrinks its fp32 input 4x, so a forward float8 copy of x handed to backward was kept beside the
    bf16 x (+1 byte per input element), and it hoisted the float8 all-gathered weight's transposed copy into
    forward (+1 byte per parameter). Neither may come back: ours saves no more than torchao, and no float8
    tensor at all."""
    ao, _ = compiled_saved("torchao")
    for mode in ("ours", "ours_ag"):
        ours, f8 = compiled_saved(mode)
        # beyond torchao at most a few 4-byte scale scalars per linear (ours keeps fp32 scales, it a bf16 amax)
        assert ours <= ao + 16 * 5, (mode, ours, ao)
        assert f8 == [], (mode, f8)
    # rowwise: the column casts of x and w for backward read the saved bf16 x and w (beyond torchao at most the
    # fp32 column amax of each, 4 bytes a column); an fp32 copy of x merged between forward and backward
    # widening once made it save 4 bytes per input element
    ao, _ = compiled_saved("torchao_rowwise")
    ours, f8 = compiled_saved("ours_rowwise")
    assert ours <= ao + 5 * 4 * (2 * H + 2 * D) and f8 == [], (ours, ao, f8)
    # and inductor lowers the backward-only weight transpose (a dtype view of a buffer whose layout inductor had
    # left open once failed to lower on the GPU)
    ours, f8 = compiled_saved("ours_ag", inductor=True)
    assert ours <= ao + 16 * 5 and f8 == [], (ours, ao, f8)


_VIEWS = {"view", "_unsafe_view", "t", "transpose", "permute", "reshape", "expand", "alias", "squeeze",
          "unsqueeze", "as_strided", "slice", "select"}


def _backward_graph(mode: str):
    """The backward FX graph torch.compile's partitioner makes for one block (compiled_saved's setup)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Block().to(torch.bfloat16)
    _hardware_path_linears(m, rowwise=False, gathered=mode == "ours_ag")
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    f = torch.compile(m, backend=aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=keep,
                                              partition_fn=min_cut_rematerialization_partition))
    x = torch.randn(M, D, dtype=torch.bfloat16, requires_grad=True)
    with _scaled_mm_by_matmul():
        f(x).float().sum().backward()
    assert len(graphs) == 1
    return graphs[0].graph


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("mode", ["ours", "ours_ag"])
def test_compiled_backward_makes_float8_operands_after_the_gradient(mode):
    """Every float8 operand of a backward GEMM is made by a node that depends on the gradient. A recast of a saved
    tensor (x's for grad-weight, the weight's for grad-input) depends on nothing backward computes, so inductor
    scheduled it at backward's start and kept it alive until its GEMM: the shared expert's two recasts of x
    (64 MB) put the llama_moe layer's peak over bf16's. Views are followed back to the node that writes the bytes;
    that node must have a tangent among its ancestors."""
    graph = _backward_graph(mode)
    tangents = {n for n in graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")}
    assert tangents

    ancestors: dict = {}

    def tied(n) -> bool:
        if n not in ancestors:
            ancestors[n] = n in tangents or any(tied(a) for a in n.all_input_nodes)
        return ancestors[n]

    def writer(n):
        while n.op == "call_function" and getattr(n.target, "__name__", "").split(".")[0] in _VIEWS | {"view"}:
            n = n.args[0]
        return n

    checked = []
    for n in graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten._scaled_mm.default:
            for operand in n.args[:2]:
                w = writer(operand)
                checked.append(w.name)
                assert tied(w), (mode, n.name, w.name, "made from saved tensors only: scheduled at backward's start")
    assert len(checked) == 2 * 2 * 5, checked  # grad-input and grad-weight of 5 linears, two operands each


def _ag_model():
    torch.manual_seed(0)
    m = nn.Sequential(Block(), Block())
    convert_to_float8_training(m, Float8Config(emulate=True, filter_fqns=["none"], enable_fsdp_float8_all_gather=True,
                                               precompute_float8_dynamic_scale_for_fsdp=True))
    return m


class _LargestOutput(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_precompute_keeps_only_scales_and_allocates_no_shard_sized_tensor():
    m = _ag_model()
    lins = [mod for mod in m.modules() if isinstance(mod, Float8Linear)]
    assert len(lins) == 10
    mode = _LargestOutput()
    with mode:
        precompute_float8_dynamic_scale_for_fsdp(m)
    # the biggest tensor precompute makes is the stacked amax / scale vector (float64 inside amax_to_scale)
    assert mode.largest <= 8 * len(lins), mode.largest
    for mod in lins:
        held = [v for v in vars(mod).values() if isinstance(v, torch.Tensor)]
        held += [v for v in vars(getattr(mod, "_float8_scale_cache")).values() if isinstance(v, torch.Tensor)]
        assert sum(t.numel() * t.element_size() for t in held) <= 4, [t.shape for t in held]
        w = mod.weight._tensor
        expected = 448.0 / w.abs().max().double()
        assert torch.allclose(mod._float8_scale_cache.scale.double(), expected, rtol=1e-6)
    # one ScaleGroup for the whole model: the no-precompute path computes all scales with one all-reduce
    assert len({id(mod._float8_scale_group) for mod in lins}) == 1


_NO_TORCHAO = r'''
import sys, importlib.abc
class NoTorchao(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torchao" or name.startswith("torchao."):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, NoTorchao())
sys.path.insert(0, ROOT)
import torch, torch.nn as nn
import titan_fp8.float8 as f8
for recipe in ("mxfp8", "blockwise"):
    m = nn.Sequential(nn.Linear(128, 128))
    f8.convert_to_float8_training(m, f8.Float8Config(recipe_name=recipe, emulate=True, filter_fqns=["x"]))
    assert type(m[0]).__name__ == "Float8Linear"
    y = m(torch.randn(128, 128)); y.sum().backward()
    assert torch.isfinite(y).all()
for recipe in ("tensorwise", "rowwise"):
    try:
        f8.convert_to_float8_training(nn.Sequential(nn.Linear(64, 64)), f8.Float8Config(recipe_name=recipe, emulate=True))
    except ImportError as e:
        assert "torchao" in str(e) and recipe in str(e), e
    else:
        raise AssertionError(recipe + " converted without torchao")
print("OK")
'''


def test_import_and_mx_blockwise_work_without_torchao():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", f"ROOT = {root!r}\n" + _NO_TORCHAO], capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
