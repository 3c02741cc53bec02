"""torch.compile's analysis of which tensors a Triton kernel writes (torch._higher_order_ops.triton_kernel_wrap, used
for kernels launched inside a torch.library.triton_op) must name exactly the outputs of every kernels/moe kernel.
Where it names an input, functionalization clones that input on every call and, for a tensor that requires grad,
the compiled fused expert path fails ("a leaf Variable that requires grad is being used in an in-place operation"):
moe_layer run 7b, benchmarks/results/moe_layer-H100-2026-11-23.md. The analysis follows every argument of a helper
call whose result feeds a store address, so the kernels keep addresses out of such calls.

The analysis reads Triton's TTIR, which needs the compiled (not interpreted) kernels and a target: it runs in a
subprocess without TRITON_INTERPRET, with a stand-in driver that reports an sm_90 target (no GPU is touched)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r'''
import json, torch, triton
from triton.backends.compiler import GPUTarget
import torch._higher_order_ops.triton_kernel_wrap as tkw

class SM90:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)
    def get_current_device(self):
        return 0

triton.runtime.driver.set_active(SM90())
analyze = getattr(tkw, "identify_accessed_tensors", None)
if analyze is None:  # older torch: the set of mutated argument names
    names = lambda k, kw: sorted(tkw.identify_mutated_tensors(k, kw, {}))
else:
    names = lambda k, kw: sorted(d.name for d in analyze(k, kw, {}).read_writes.writes)
import kernels.moe.triton as kt
f32, i64, bf, u8, i32 = torch.float32, torch.int64, torch.bfloat16, torch.uint8, torch.int32
x, y = torch.empty(8, 64, dtype=bf), torch.empty(64, 64, dtype=bf)
src, pos, offs, w = torch.empty(64, dtype=i64), torch.empty(16, dtype=i64), torch.empty(4, dtype=i32), torch.empty(8, 2)
q, qt = torch.empty(64, 64, dtype=u8), torch.empty(64, 64, dtype=u8)
ins = dict(a_ptr=x, b_ptr=src, c_ptr=pos, d_ptr=w, e_ptr=y)
out = {}
for mode in (0, 1, 2, 3):
    for halves in ((False, True) if mode == 3 else (False,)):
        for col_tile, first in ((1, False), (64, False), (1, True), (64, True)):
            for rows, cols in ((True, True), (True, False), (False, True)) if mode == 0 else ((True, True),):
                kw = dict(ins, qr_ptr=q, sr_ptr=torch.empty(64, 2, dtype=u8), qc_ptr=qt,
                          sc_ptr=torch.empty(2, 64, dtype=u8), dot_ptr=torch.empty(1, 64), N=8, P=64, C=64, H=32,
                          MODE=mode, K=2, QB=32, BM=32, BD=64, HW_CAST=True, IS_BF16=False, COL_TILE=col_tile,
                          HALVES=halves, AMAX_FIRST=first, ROWS=rows, COLS=cols, FAST_SIGMOID=True)
                out[f"_mx_kernel MODE={mode} HALVES={halves} COL_TILE={col_tile} AMAX_FIRST={first} "
                    f"ROWS={rows} COLS={cols}"] = names(kt._mx_kernel, kw)
    ramax, gamax = torch.empty(64, dtype=i32), torch.empty(5, 64, dtype=i32)
    kw = dict(ins, ramax_ptr=ramax, gamax_ptr=gamax, dot_ptr=torch.empty(1, 64), offs_ptr=offs, N=8, P=64, C=64, H=32,
              E=4, MODE=mode, K=2, BM=32, BD=64, SUB=2, E_PAD=4, IS_BF16=False, FAST_SIGMOID=True)
    out[f"_f8_amax_kernel MODE={mode}"] = names(kt._f8_amax_kernel, kw)
    for rows, cols in ((True, True), (True, False), (False, True)) if mode == 0 else ((True, True),):
        kw = dict(ins, q_ptr=q, s_ptr=torch.empty(64), qc_ptr=qt, scale_ptr=torch.empty(4, 64), ramax_ptr=ramax,
                  gamax_ptr=gamax, offs_ptr=offs, N=8, P=64, C=64, H=32, E=4, MODE=mode, K=2, BM=32, BD=64, E_PAD=4,
                  HW_CAST=True, IS_BF16=False, ROWS=rows, COLS=cols, FAST_SIGMOID=True)
        out[f"_f8_quant_kernel MODE={mode} ROWS={rows} COLS={cols}"] = names(kt._f8_quant_kernel, kw)
kw = dict(y_ptr=y, pos_ptr=pos, w_ptr=w, out_ptr=torch.empty(8, 64, dtype=bf), N=8, D=64, K=2, BN=4, BD=64,
          IS_BF16=False, OUT_BITS=False)
out["_combine_kernel"] = names(kt._combine_kernel, kw)
print("RESULT " + json.dumps(out))
'''

EXPECTED = {
    "_mx_kernel": {"qr_ptr", "sr_ptr", "qc_ptr", "sc_ptr"},  # + dot_ptr in MODE 1
    "_f8_amax_kernel": {"ramax_ptr", "gamax_ptr"},  # + dot_ptr in MODE 1
    "_f8_quant_kernel": {"q_ptr", "s_ptr", "qc_ptr", "scale_ptr"},
    "_combine_kernel": {"out_ptr"},
}


@pytest.fixture(scope="module")
def analysis():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        pytest.fail(f"write analysis did not run (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("kernel", list(EXPECTED))
def test_write_analysis_names_only_the_outputs(analysis, kernel):
    cases = {k: v for k, v in analysis.items() if k.split()[0] == kernel}
    assert cases, f"no analysis of {kernel}"
    for case, written in cases.items():
        want = set(EXPECTED[kernel]) | ({"dot_ptr"} if "MODE=1" in case and kernel != "_f8_quant_kernel" else set())
        if "ROWS=False" in case:  # the token-major copy only (dispatch's outputs=TOKEN_MAJOR)
            want -= {"qr_ptr", "sr_ptr", "q_ptr", "s_ptr"}
        if "COLS=False" in case:  # the row copy only (outputs=ROWS)
            want -= {"qc_ptr", "sc_ptr", "scale_ptr"}
        assert set(written) == want, f"{case}: the analysis says it writes {sorted(written)}; expected {sorted(want)}"
