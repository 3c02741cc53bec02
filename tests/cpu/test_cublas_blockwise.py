"""titan_fp8::blockwise_scaled_mm's C++ kernel (kernels/grouped_gemm/cublas_blockwise.py): its operand layouts equal
the Python twin's (which tests/cpu/test_float8_blockwise_layout.py checks against torch 2.11's argument checks and
this torch's meta kernel), its ScalingType values are torch's, and the switch and the build fail with one clear line.

The C++ source builds here with the host compiler (~10 s, cached under $TITAN_FP8_CUTLASS_BUILD_DIR); the GEMM
itself runs on a GPU only (tests/gpu/test_cublas_blockwise_gpu.py compares the C++ and Python kernels bit for bit)."""
import pytest
import torch
import torch.nn.functional as F

from kernels.grouped_gemm import cublas_blockwise as cb

pytestmark = pytest.mark.skipif(not hasattr(F, "ScalingType") or not hasattr(torch, "_scaled_mm_v2"),
                                reason="torch.nn.functional.ScalingType / torch._scaled_mm_v2 not in this torch")


@pytest.fixture(scope="module")
def cpp():
    try:
        return cb.load_cpp()
    except cb.BlockwiseBindingUnavailable as e:
        if "not found" in str(e):  # no compiler / ninja on this machine: nothing to build
            pytest.skip(str(e))
        raise


def _operands(M, K, N, b_is_tile, inverse, device, gen=None):
    """Quantized-operand stand-ins in the layouts the callers pass: 1x128 factors of a outer-major when inverse
    (mx128's quantizers write them so), else row-major; b's tile factors as the padded buffer when inverse."""
    kb = K // 128

    def rnd(*shape):
        if device == "meta":
            return torch.empty(*shape, device="meta")
        return torch.rand(*shape, generator=gen) + 0.5

    a_q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=device)
    b_q = torch.empty(N, K, dtype=torch.float8_e4m3fn, device=device)
    a_s = rnd(kb, M).t() if inverse else rnd(M, kb)
    if b_is_tile:
        b_s = cb.pad_tile_factors(rnd(N // 128, kb)) if inverse else rnd(N // 128, kb)
    else:
        b_s = rnd(kb, N).t() if inverse else rnd(N, kb)
    return a_q, a_s, b_q, b_s


# the shapes of test_float8_blockwise_layout (K / N not multiples of 4 blocks: the padded tile layout)
SHAPES = [(8192, 4096, 4096), (8192, 4096, 2816), (8192, 2816, 4096), (128, 128, 128), (256, 384, 640),
          (384, 640, 256)]


@pytest.mark.parametrize("inverse", [False, True], ids=["our_scales", "factors"])
@pytest.mark.parametrize("b_is_tile", [True, False], ids=["128x128", "1x128"])
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_cpp_layouts_equal_the_python_twin(cpp, M, K, N, b_is_tile, inverse):
    """Shapes, strides and dtypes at the model's shapes (meta: no memory); values and which scale tensors pass
    through uncopied at the small ones (real CPU tensors, fresh random scales)."""
    device = "meta" if M * K > 2**20 else "cpu"
    gen = None if device == "meta" else torch.Generator().manual_seed(torch.seed() % 2**31)
    ops = _operands(M, K, N, b_is_tile, inverse, device, gen)
    want = cb.blockwise_scaled_mm_args(*ops, b_is_tile, inverse)
    want = (want[0], want[1], want[2], want[4])
    got = torch.ops.titan_fp8.blockwise_scaled_mm_layouts(*ops, b_is_tile, inverse)
    for name, w, g in zip(("mat_a", "mat_b", "scale_a", "scale_b"), want, got):
        assert (tuple(g.shape), g.stride(), g.dtype) == (tuple(w.shape), w.stride(), w.dtype), name
        if device == "cpu" and w.dtype == torch.float32:
            assert torch.equal(g, w), name
    if device == "cpu" and inverse:  # the factors cuBLAS reads as they are: no copy, in both kernels
        a_s, b_s = ops[1], ops[3]
        assert got[2].data_ptr() == a_s.data_ptr() and got[3].data_ptr() == b_s.data_ptr()


def test_cpp_kernel_is_the_ops_cuda_kernel(cpp):
    """Once loaded, the op's one CUDA kernel is the library's (the Python one was dropped, not overridden)."""
    dump = torch._C._dispatch_dump("titan_fp8::blockwise_scaled_mm")
    cuda = [line for line in dump.splitlines() if line.startswith("CUDA:")]
    assert len(cuda) == 1 and "blockwise_mm.cpp" in cuda[0], dump


def test_cpp_recipes_are_torchs(cpp):
    got = list(torch.ops.titan_fp8.blockwise_scaled_mm_recipes())
    assert got == [int(F.ScalingType.BlockWise1x128.value), int(F.ScalingType.BlockWise128x128.value)]


def test_cpp_layouts_reject_a_3d_operand(cpp):
    a_q, a_s, b_q, b_s = _operands(128, 128, 128, True, False, "cpu")
    with pytest.raises(RuntimeError, match="must be 2-D.*a_q \\[1, 128, 128\\]"):
        torch.ops.titan_fp8.blockwise_scaled_mm_layouts(a_q[None], a_s, b_q, b_s, True, False)


@pytest.fixture
def fresh_state(monkeypatch):
    """A process state where nothing was picked or loaded (the C++ build the module fixture made stays loaded,
    but load_cpp no longer knows it: every path below fails before the library is touched)."""
    monkeypatch.setattr(cb, "_STATE", {"backend": None, "cpp_loaded": False, "warned": False})


def test_missing_compiler_is_one_line(monkeypatch, fresh_state):
    monkeypatch.setenv("CXX", "/nonexistent/bin/c++")
    with pytest.raises(cb.BlockwiseBindingUnavailable) as e:
        cb.load_cpp()
    msg = str(e.value)
    assert "\n" not in msg and "C++ compiler not found" in msg and "/nonexistent/bin/c++" in msg and "CXX" in msg


def test_missing_source_is_one_line(fresh_state, tmp_path):
    with pytest.raises(cb.BlockwiseBindingUnavailable, match="C\\+\\+ source not found: .*nothing.cpp"):
        cb.load_cpp(str(tmp_path / "nothing.cpp"))


def test_failed_build_is_one_line(monkeypatch, fresh_state, tmp_path):
    bad = tmp_path / "broken.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setenv("TITAN_FP8_CUTLASS_BUILD_DIR", str(tmp_path / "build"))
    with pytest.raises(cb.BlockwiseBindingUnavailable) as e:
        cb.load_cpp(str(bad))
    assert "\n" not in str(e.value) and "building the C++ blockwise_scaled_mm kernel failed" in str(e.value)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("titan_fp8::blockwise_scaled_mm", "CUDA")


def test_switch_names_a_bad_value(monkeypatch, fresh_state):
    monkeypatch.setenv("TITAN_FP8_BLOCKWISE_MM", "cublas")
    with pytest.raises(ValueError, match="TITAN_FP8_BLOCKWISE_MM='cublas'; allowed: auto, cpp, python"):
        cb.load_backend()


def test_named_cpp_raises_where_auto_picks_python(monkeypatch, fresh_state, caplog):
    monkeypatch.setenv("CXX", "/nonexistent/bin/c++")
    monkeypatch.setenv("TITAN_FP8_BLOCKWISE_MM", "cpp")
    with pytest.raises(cb.BlockwiseBindingUnavailable, match="C\\+\\+ compiler not found"):
        cb.load_backend()
    assert cb._STATE["backend"] is None
    monkeypatch.setenv("TITAN_FP8_BLOCKWISE_MM", "auto")
    with caplog.at_level("WARNING", logger=cb.__name__):
        assert cb.load_backend() == "python"
    assert "auto picked the Python kernel (C++ compiler not found" in caplog.text
    monkeypatch.setenv("TITAN_FP8_BLOCKWISE_MM", "cpp")  # once picked, another named backend is an error
    with pytest.raises(RuntimeError, match="already runs the python kernel"):
        cb.load_backend()


def test_python_kernel_before_load_backend(monkeypatch, fresh_state, caplog):
    """A call that reaches the Python CUDA kernel before anything picked: "cpp" raises naming load_backend, auto
    runs it and warns once (CPU tensors stand in for CUDA ones; F.scaled_mm is replaced by a recorder)."""
    calls = []
    monkeypatch.setattr(F, "scaled_mm", lambda *a, **k: calls.append(a) or torch.zeros(1))
    ops = _operands(128, 128, 128, True, True, "cpu", torch.Generator().manual_seed(0))
    monkeypatch.setenv("TITAN_FP8_BLOCKWISE_MM", "cpp")
    with pytest.raises(RuntimeError, match="before kernels.grouped_gemm.cublas_blockwise.load_backend"):
        cb._python_cuda_kernel(*ops, True, True)
    monkeypatch.setenv("TITAN_FP8_BLOCKWISE_MM", "auto")
    with caplog.at_level("WARNING", logger=cb.__name__):
        cb._python_cuda_kernel(*ops, True, True)
        cb._python_cuda_kernel(*ops, True, True)
    assert len(calls) == 2 and caplog.text.count("running its Python kernel") == 1
