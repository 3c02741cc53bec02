"""benchmarks/mxfp8_grouped_gemm_backends' op variants that change a setting (the CUTLASS schedule, the quantizers'
launch rule) must hold it over the op's backward too: autograd runs the backward's kernels (dgrad, wgrad, the dO and
W^T quantizations) after the forward call has returned. Until session 29 the settings covered the forward call
only, so those A/Bs timed the backward with the defaults."""
import os

from benchmarks import mxfp8_grouped_gemm_backends as bench
from kernels.grouped_gemm import quant_triton


class _Out:
    def __init__(self, seen):
        self.seen = seen

    def backward(self, go):
        self.seen.append(("bwd", quant_triton.rowcol_launch, os.environ.get(bench.SCHED_ENV)))


def test_fwd_bwd_holds_nested_settings_over_the_backward(monkeypatch):
    monkeypatch.delenv(bench.SCHED_ENV, raising=False)
    real, seen = quant_triton.rowcol_launch, []

    def op(x, w, offs):
        seen.append(("fwd", quant_triton.rowcol_launch, os.environ.get(bench.SCHED_ENV)))
        return _Out(seen)

    fn = bench.with_schedule(bench.with_quant_launch(op, bench.launch_rule_s28), "cooperative")
    bench.fwd_bwd(fn, None, None, None, None)
    rule = bench.launch_rule_s28
    assert seen == [("fwd", rule, "cooperative"), ("bwd", rule, "cooperative")]
    # and both are put back afterwards, also when the op raises
    assert quant_triton.rowcol_launch is real and bench.SCHED_ENV not in os.environ

    def bad(x, w, offs):
        raise RuntimeError("boom")
    try:
        bench.fwd_bwd(bench.with_quant_launch(bad, rule), None, None, None, None)
    except RuntimeError:
        pass
    assert quant_triton.rowcol_launch is real
    # a plain op runs as it is
    seen.clear()
    bench.fwd_bwd(op, None, None, None, None)
    assert seen == [("fwd", real, None), ("bwd", real, None)]


def test_launch_rule_s28_is_the_previous_rule():
    """The A/B baseline: 128 x 128 programs, 4 warps for 32-token column copies, 8 otherwise."""
    r = bench.launch_rule_s28
    assert r(1, 32, 1, True, True) == (128, 128, 4) and r(1, 32, 128, False, True) == (128, 128, 4)
    assert r(1, 128, 128, True, True) == (128, 128, 8)


def test_rowcol_grid_is_held_over_the_backward_and_put_back():
    """The _qp2 op rows (session 44): the CUDA quantizer's persistent grid of 2 CTAs per SM over forward AND
    backward (the dO quantization runs in the backward), the default (0: one CTA per tile) afterwards."""
    from kernels.grouped_gemm import quant_cuda
    seen = []

    class Out:
        def backward(self, go):
            seen.append(("bwd", quant_cuda.CTAS_PER_SM))

    def op(x, w, offs):
        seen.append(("fwd", quant_cuda.CTAS_PER_SM))
        return Out()

    bench.fwd_bwd(bench.with_rowcol_grid(op, 2), None, None, None, None)
    assert seen == [("fwd", 2), ("bwd", 2)] and quant_cuda.CTAS_PER_SM == 0
