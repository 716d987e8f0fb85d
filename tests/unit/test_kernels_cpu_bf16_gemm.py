"""dspark_kernels/cpu_bf16_gemm.py: the small-M bf16 GEMMs (AVX2 and AVX512-BF16) against an fp64 reference, their batch
invariance, their fallbacks."""

import pytest
import torch
import torch.nn.functional as F

from dspark_kernels import cpu_bf16_gemm
from dspark_kernels.cpu_bf16_gemm import small_m_linear


def _kernel_or_skip():
    fn, reason = cpu_bf16_gemm.load()
    if fn is None:
        print(f"small-M kernel unavailable here: {reason}")
        pytest.skip(f"small-M kernel unavailable: {reason}")


def _dp_kernel_or_skip():
    fn, reason = cpu_bf16_gemm.load_dp()
    if fn is None:
        print(f"AVX512-BF16 small-M kernel unavailable here: {reason}")
        pytest.skip(f"AVX512-BF16 small-M kernel unavailable: {reason}")


def _amx_kernel_or_skip():
    fn, reason = cpu_bf16_gemm.load_amx()
    if fn is None:
        print(f"AMX-BF16 small-M kernel unavailable here: {reason}")
        pytest.skip(f"AMX-BF16 small-M kernel unavailable: {reason}")


def _reference(x, w, bias=None):
    """fp64 product of the same (exactly upcast) values: the kernel's fp32 sums must land within fp32 rounding."""
    y = x.double() @ w.double().T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("m", [1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("n,k", [(1, 8), (5, 13), (130, 896), (4, 4864)])
def test_matches_the_reference_for_ragged_shapes(m, n, k):
    _kernel_or_skip()
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g)
    for b in (None, bias):
        got = small_m_linear(x, w, b)
        assert got.dtype == torch.float32 and got.shape == (m, n)
        want = _reference(x, w, b)
        bound = 1e-5 * (x.double().abs() @ w.double().abs().T + 1)  # fp32 accumulation of k products
        assert ((got.double() - want).abs() <= bound).all()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 17])
@pytest.mark.parametrize("n,k", [(1, 8), (5, 13), (7, 40), (130, 896), (4, 4864)])
def test_the_dp_kernel_matches_the_reference_for_ragged_shapes(m, n, k, monkeypatch):
    """bf16 inputs: every K tail (masked loads), every row remainder of the 4-row blocks, N not a multiple of 4."""
    _dp_kernel_or_skip()
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", (None, "only the dp kernel under test"))
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_amx", (None, "only the dp kernel under test"))
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16()
    for b in (None, bias):
        got = small_m_linear(x, w, b)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        want = _reference(x, w, b)
        # fp32 sums of exact bf16 products, then one rounding to bf16 (2^-8 relative) of the output
        bound = 1e-5 * (x.double().abs() @ w.double().abs().T + 1) + 2 ** -8 * want.abs()
        assert ((got.double() - want).abs() <= bound).all()


@pytest.mark.parametrize("m", [1, 2, 15, 16, 17, 33])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (1152, 896), (32, 4864)])
def test_the_amx_kernel_matches_the_reference(m, n, k, monkeypatch):
    """Tile shapes: one and several 16-row blocks of W, an odd and an even number of 32-wide k-chunks (the two
    accumulator tiles), rows of x past one 16-row tile and zero-padded ones."""
    _amx_kernel_or_skip()
    calls = []
    real = cpu_bf16_gemm.load_amx()[0]
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_amx", (lambda *a: calls.append(a) or real(*a), ""))
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16()
    for b in (None, bias):
        got = small_m_linear(x, w, b)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        want = _reference(x, w, b)
        bound = 1e-5 * (x.double().abs() @ w.double().abs().T + 1) + 2 ** -8 * want.abs()
        assert ((got.double() - want).abs() <= bound).all()
    assert len(calls) == 2  # the AMX kernel ran, not the dp one


def test_shapes_off_the_amx_tiles_take_the_dp_kernel(monkeypatch):
    _amx_kernel_or_skip()
    _dp_kernel_or_skip()
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_amx", (lambda *a: pytest.fail("AMX kernel on an off-tile shape"), ""))
    for n, k in ((130, 896), (32, 40)):
        w = torch.randn(n, k).bfloat16()
        x = torch.randn(3, k).bfloat16()
        assert small_m_linear(x, w).shape == (3, n)


def test_the_amx_kernel_is_batch_and_thread_invariant():
    _amx_kernel_or_skip()
    w = torch.randn(304, 896).bfloat16()
    x = torch.randn(19, 896).bfloat16()
    full = small_m_linear(x, w)
    for i in range(19):
        assert torch.equal(small_m_linear(x[i:i + 1], w), full[i:i + 1])
    assert torch.equal(small_m_linear(x[3:9], w), full[3:9])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(small_m_linear(x, w), full)
    finally:
        torch.set_num_threads(threads)


def test_the_dp_kernel_is_batch_and_thread_invariant():
    _dp_kernel_or_skip()
    w = torch.randn(301, 896).bfloat16()
    x = torch.randn(11, 896).bfloat16()
    full = small_m_linear(x, w)
    for i in range(11):
        assert torch.equal(small_m_linear(x[i:i + 1], w), full[i:i + 1])
    assert torch.equal(small_m_linear(x[3:9], w), full[3:9])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(small_m_linear(x, w), full)
    finally:
        torch.set_num_threads(threads)


def test_bf16_input_is_rounded_once_and_leading_dims_and_strides_are_kept():
    _kernel_or_skip()
    w = torch.randn(37, 24).bfloat16()
    x = torch.randn(2, 3, 48).bfloat16()[..., ::2]  # non-contiguous, two leading dims
    got = small_m_linear(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 37)
    want = _reference(x.reshape(-1, 24), w).float().bfloat16().reshape(2, 3, 37)
    assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
    assert small_m_linear(torch.empty(0, 24).bfloat16(), w).shape == (0, 37)


def test_a_row_does_not_depend_on_the_other_rows_or_the_thread_count():
    """Each output is one thread's fixed-order sum: batch-invariant, unlike torch's bf16 GEMM."""
    _kernel_or_skip()
    w = torch.randn(301, 896).bfloat16()
    x = torch.randn(9, 896)
    full = small_m_linear(x, w)
    for i in range(9):
        assert torch.equal(small_m_linear(x[i:i + 1], w), full[i:i + 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(small_m_linear(x, w), full)
    finally:
        torch.set_num_threads(threads)


def test_falls_back_to_torch_where_the_kernel_cannot_run(monkeypatch):
    w = torch.randn(16, 8).bfloat16()
    x = torch.randn(3, 8).bfloat16()
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", (None, "test"))
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_dp", (None, "test"))
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_amx", (None, "test"))
    assert torch.equal(small_m_linear(x, w), F.linear(x, w))
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", None)
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_dp", None)
    w_f32 = torch.randn(16, 8)  # not bf16: torch's path even where the kernel is built
    assert torch.equal(small_m_linear(x.float(), w_f32), F.linear(x.float(), w_f32))


def test_a_failed_build_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", None)
    monkeypatch.setattr(cpu_bf16_gemm, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(cpu_bf16_gemm, "_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(cpu_bf16_gemm.platform, "system", lambda: "Linux")
    monkeypatch.setattr(cpu_bf16_gemm.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CC", "false")
    fn, reason = cpu_bf16_gemm.load()
    assert fn is None and "could not build" in reason and "false failed" in reason
    assert list(tmp_path.iterdir()) == []  # nothing half-written left in the cache
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", None)
    monkeypatch.setattr(cpu_bf16_gemm, "_cpu_flags", lambda: {"avx"})
    assert cpu_bf16_gemm.load() == (None, "the CPU lacks avx2, fma")
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", None)
    monkeypatch.setenv(cpu_bf16_gemm.DISABLE_ENV, "1")
    assert cpu_bf16_gemm.load()[0] is None
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded", None)  # later tests load the real kernel again
    monkeypatch.delenv(cpu_bf16_gemm.DISABLE_ENV)
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_dp", None)
    monkeypatch.setattr(cpu_bf16_gemm, "_cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    assert cpu_bf16_gemm.load_dp() == (None, "the CPU lacks avx512bw, avx512_bf16")
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_dp", None)
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_amx", None)
    assert cpu_bf16_gemm.load_amx() == (None, "the CPU lacks amx_tile, amx_bf16")
    monkeypatch.setattr(cpu_bf16_gemm, "_loaded_amx", None)
