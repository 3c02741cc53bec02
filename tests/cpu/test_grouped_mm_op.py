"""titan_fp8::grouped_mm (models/grouped_mm_op.py): torch._grouped_mm as a custom op, the route of bf16 experts
compiled with inductor's C++ wrapper ([compile] cpp_wrapper) on a torch whose C shim lacks _grouped_mm (< 2.12).
Same kernel, so the same bits as torch._grouped_mm; both against a float64 reference."""

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._inductor.utils import run_and_get_code

from titan_fp8.models import grouped_mm_op, moe
from titan_fp8.models.grouped_mm_op import opaque_grouped_mm
from titan_fp8.parallel import use_inductor_cpp_wrapper

needs_cpu_bf16 = pytest.mark.skipif(torch.bfloat16 not in moe._CPU_GROUPED_MM_DTYPES,
                                    reason="this torch has no CPU torch._grouped_mm for bf16 (2.13 has)")


def operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    # uneven groups: 7, 0 (empty), 33, 8 rows; 48 rows in all, the last 0 past offs[-1] (MoE fills exactly)
    offs = torch.tensor([7, 7, 40, 48], dtype=torch.int32)
    x = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    w = (torch.randn(4, 32, 64, generator=g) * 0.1).to(torch.bfloat16)
    x[3, 5], x[20] = 0.0, 1e-40  # a zero and a row of subnormals (bf16 keeps fp32's exponent range)
    return x, w, offs


def reference(x, w, offs):
    """float64 per-group x @ w[e]^T."""
    out, start = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64), 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end].double() @ w[e].double().t()
        start = end
    return out


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@needs_cpu_bf16
def test_the_custom_op_gives_torch_grouped_mm_bits_forward_and_backward():
    x, w, offs = operands()
    g = torch.randn(48, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    res = {}
    for name, fn in (("op", lambda a, b: opaque_grouped_mm(a, b.transpose(-2, -1), offs)),
                     ("aten", lambda a, b: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs))):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(a, b)
        out.backward(g)
        res[name] = (out, a.grad, b.grad)
    for mine, theirs in zip(res["op"], res["aten"]):
        assert torch.equal(mine, theirs)
    assert rel(res["op"][0], reference(x, w, offs)) < 1e-2  # bf16 output
    # gradients against float64: dx = g @ w[e], dw[e] = g_e^T x_e (the empty group's dw is zero)
    dx, dw, start = torch.zeros(48, 64, dtype=torch.float64), torch.zeros(4, 32, 64, dtype=torch.float64), 0
    for e, end in enumerate(offs.tolist()):
        dx[start:end] = g[start:end].double() @ w[e].double()
        dw[e] = g[start:end].double().t() @ x[start:end].double()
        start = end
    assert rel(res["op"][1], dx) < 1e-2 and rel(res["op"][2], dw) < 1e-2
    assert torch.count_nonzero(res["op"][2][1]) == 0


@needs_cpu_bf16
def test_the_custom_op_passes_opcheck():
    x, w, offs = operands()
    torch.library.opcheck(opaque_grouped_mm, (x, w.transpose(-2, -1), offs))
    torch.library.opcheck(opaque_grouped_mm, (x.t(), torch.randn(48, 16).to(torch.bfloat16), offs))


def test_only_a_cpp_wrapper_trace_on_a_torch_without_the_shim_takes_the_custom_op(monkeypatch):
    monkeypatch.setattr(grouped_mm_op, "C_SHIM_HAS_GROUPED_MM", False)
    assert not grouped_mm_op.needs_opaque_grouped_mm()  # eager: never
    seen = []

    def probe(x):
        seen.append(grouped_mm_op.needs_opaque_grouped_mm())
        return x + 1

    for wrapper in (False, True):
        torch._dynamo.reset()
        with inductor_config.patch(cpp_wrapper=wrapper):
            torch.compile(probe, backend="eager")(torch.ones(2))
    assert seen == [False, True]


@needs_cpu_bf16
def test_bf16_experts_compile_with_the_cpp_wrapper_through_the_custom_op(monkeypatch):
    # on torch 2.11 (the GPU image) this is the path that works; here (CPU, a torch with the shim) it is forced
    monkeypatch.setattr(grouped_mm_op, "C_SHIM_HAS_GROUPED_MM", False)
    x, w, offs = operands()

    def loss(x, w):
        return moe.grouped_mm(x, w, offs).float().square().sum()

    grads = {}
    for name, fn in (("eager", loss), ("compiled", None)):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        if fn is None:
            torch._dynamo.reset()
            with inductor_config.patch(cpp_wrapper=True, **{"triton.autotune_at_compile_time": False}):
                out, codes = run_and_get_code(torch.compile(loss), a, b)
                out.backward()
            code = "\n".join(codes)
            # the C++ wrapper reaches the custom op through the dispatcher; without it: aoti_torch_cpu__grouped_mm
            assert 'aoti_torch_call_dispatcher("titan_fp8::grouped_mm"' in code
            assert "__grouped_mm" not in code
        else:
            out = fn(a, b)
            out.backward()
        grads[name] = (out, a.grad, b.grad)
    for mine, theirs in zip(grads["compiled"], grads["eager"]):
        assert rel(mine, theirs) < 1e-2


def test_use_inductor_cpp_wrapper_sets_it_process_wide(monkeypatch):
    monkeypatch.setattr(inductor_config, "cpp_wrapper", False)
    monkeypatch.setattr(inductor_config.triton, "autotune_at_compile_time", None)
    use_inductor_cpp_wrapper()
    assert inductor_config.cpp_wrapper is True and inductor_config.triton.autotune_at_compile_time is False


def test_use_inductor_cpp_wrapper_leaves_values_the_environment_gave_alone(monkeypatch):
    # a value set on inductor's config is an override held per context (a ContextVar): threads that do not inherit
    # it see the environment's default. On torch 2.11 the float8 graphs failed that way ("not enough values to
    # unpack", session 41), so nothing is written where the environment already gave the value.
    class Spy:
        def __init__(self, **values):
            self.__dict__.update(values, written=[])

        def __setattr__(self, name, value):
            self.written.append(name)
            object.__setattr__(self, name, value)

    for wrapper, autotune, want in ((True, False, []), (False, None, ["cpp_wrapper", "autotune_at_compile_time"])):
        triton = Spy(autotune_at_compile_time=autotune)
        fake = Spy(cpp_wrapper=wrapper, triton=triton)
        monkeypatch.setattr(torch._inductor, "config", fake)
        use_inductor_cpp_wrapper()
        assert fake.written + triton.written == want
        assert fake.cpp_wrapper is True and triton.autotune_at_compile_time is False
