"""Float8 linears on a Hopper GPU: every hardware path against its CPU-identical emulation, torch.compile
(inductor) against eager, and (with 2 GPUs) the FSDP2 float8 all-gather scenarios over NCCL."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with float8 (sm_89+)")

from titan_fp8.float8 import Float8Config, convert_to_float8_training  # noqa: E402
from titan_fp8.float8.linear import float8_linear  # noqa: E402
from titan_fp8.float8.scaling import to_float8, to_float8_fused  # noqa: E402

RECIPES = ["tensorwise", "rowwise", "blockwise", "mxfp8"]


def sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return (20 * torch.log10(ref.norm() / (ref - got).norm())).item()


def fwd_bwd(recipe, emulate, x, w, g):
    xq, wq = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = float8_linear(xq, wq, Float8Config(recipe_name=recipe, emulate=emulate))
    y.backward(g)
    return y, xq.grad, wq.grad


@pytest.mark.parametrize("recipe", RECIPES)
def test_hardware_path_matches_emulation(recipe):
    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    w = (torch.randn(768, 1024, device=dev) * 0.02).to(torch.bfloat16)
    g = (torch.randn(1024, 768, device=dev) * 1e-3).to(torch.bfloat16)
    hw = fwd_bwd(recipe, False, x, w, g)
    em = fwd_bwd(recipe, True, x, w, g)
    for name, a, b in zip(("output", "grad_input", "grad_weight"), hw, em):
        # same quantized operands; only accumulation order and the bf16 output rounding differ
        assert sqnr(b, a) >= 38.0, f"{recipe} {name}: hardware vs emulation {sqnr(b, a):.1f} dB"
    ref = x.double() @ w.double().t()
    assert sqnr(ref, hw[0]) >= 25.0


@pytest.mark.parametrize("recipe", RECIPES)
def test_inductor_compile_matches_eager(recipe):
    torch.manual_seed(0)
    m = convert_to_float8_training(nn.Sequential(nn.Linear(1024, 2048, bias=False)).cuda().bfloat16(),
                                   Float8Config(recipe_name=recipe))
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    y_e = m(x)
    y_e.float().pow(2).mean().backward()
    g_e = m[0].weight.grad.clone()
    m[0].weight.grad = None
    y_c = torch.compile(m)(x)
    y_c.float().pow(2).mean().backward()
    assert sqnr(y_e, y_c) >= 40 and sqnr(g_e, m[0].weight.grad) >= 35


def test_fused_cast_equals_eager_cast_bitwise():
    x = torch.randn(4096, 4096, device="cuda") * 3
    s = torch.tensor(448.0 / 15.0, device="cuda")
    assert torch.equal(to_float8_fused(x, s, torch.float8_e4m3fn).view(torch.uint8),
                       to_float8(x, s, torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_fsdp_float8_all_gather_over_nccl(tmp_path):
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu")
    env = dict(os.environ, FLOAT8_WORKER_DEVICE="cuda")
    proc = subprocess.run([sys.executable, os.path.join(here, "float8_fsdp_worker.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for r in (torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(2)):
        assert r["bytes_fp8"] <= 0.52 * r["bytes_bf16"]
        assert all(r["gather_exact"].values()), r["gather_exact"]
        assert r["pre"]["per_step_max_allreduce"] == [1] * 10
        assert r["pre"]["losses"] == r["nopre"]["losses"] == r["ref"]["losses"]
        # one Triton launch per block and step (forward's; backward's regather takes its bytes), same losses bit for bit
        assert r["batched"]["losses"] == r["pre"]["losses"] and r["batched_calls"]["many"] == 2 * 10
        assert r["batched_stale"]["losses"] == r["stale"]["losses"]
        assert r["dcp"]["after_load"] == r["dcp"]["after_save"]
        assert all(r["mxfp8"]["exact"].values()) and r["mxfp8"]["max_allreduce_on"] == [0, 0, 0]
