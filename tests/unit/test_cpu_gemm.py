"""Row-count dtype dispatch for bf16 GEMMs on CPUs without native bf16 (sglang_plugin/cpu_gemm.py)."""

import pytest
import torch
import torch.nn.functional as F

from sglang_dspark.sglang_plugin import cost_profile, cpu_gemm
from sglang_dspark.sglang_plugin.cpu_gemm import (FP32_ATTR, RowDtypeGemm, measure_crossover, plan_for,
                                                  predicted_gemm_kind, wants_row_dispatch)
from sglang_dspark.sglang_plugin.options import DSparkOptions

AVX2 = {"sse2", "avx", "avx2", "fma"}


def test_auto_mode_follows_the_cpu_flags():
    assert wants_row_dispatch("auto", AVX2)
    assert not wants_row_dispatch("auto", AVX2 | {"avx512f", "avx512_bf16"})  # no AVX512-BW: no dp kernel
    assert wants_row_dispatch("auto", AVX2 | {"avx512f", "avx512bw", "avx512_bf16"})  # the dp kernel's CPUs
    assert not wants_row_dispatch("auto", AVX2 | {"amx_bf16"})
    assert not wants_row_dispatch("auto", None)  # flags unknown: leave SGLang's path alone
    assert wants_row_dispatch("on", AVX2 | {"amx_bf16"}) and not wants_row_dispatch("off", AVX2)
    with pytest.raises(ValueError, match="one of auto, on, off"):
        wants_row_dispatch("fp32", AVX2)
    with_kernel = cpu_gemm.KERNEL_DISPATCH if cpu_gemm._kernel() is not None else cpu_gemm.ROW_DISPATCH
    assert predicted_gemm_kind("auto", AVX2, "bfloat16", cuda=False) == with_kernel
    assert predicted_gemm_kind("auto", AVX2, "float32", cuda=False) == "native"
    assert predicted_gemm_kind("auto", AVX2, "bfloat16", cuda=True) == "native"
    native = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}
    assert predicted_gemm_kind("auto", native, "bfloat16", cuda=False) == (
        cpu_gemm._native_kind() if cpu_gemm._kernel() is not None else "native")
    from dspark_kernels import cpu_bf16_gemm
    assert cpu_gemm._native_kind() == (cpu_gemm.NATIVE_AMX_KERNEL_DISPATCH if cpu_bf16_gemm.load_amx()[0] is not None
                                       else cpu_gemm.NATIVE_KERNEL_DISPATCH)
    assert predicted_gemm_kind("off", native, "bfloat16", cuda=False) == "native"


def _weight(out_f=64, in_f=32, seed=0):
    return torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_linear_switches_side_at_the_crossover():
    w = _weight()
    gemm = RowDtypeGemm({(64, 32): 4})
    assert gemm.attach([w, w]) == 64 * 32 * 4  # one copy per tensor, however often it is listed
    w32 = getattr(w, FP32_ATTR)
    assert w32.dtype == torch.float32 and torch.equal(w32, w.float())  # exact upcast
    calls = []
    setattr(w, FP32_ATTR, _Spy(w32, calls))
    narrow = torch.randn(3, 32).bfloat16()
    assert torch.equal(gemm.linear(narrow, w), F.linear(narrow, w)) and not calls
    wide = torch.randn(2, 2, 32).bfloat16()  # 4 rows over two leading dims
    out = gemm.linear(wide, w, torch.ones(64).bfloat16())
    assert calls and out.dtype == torch.bfloat16 and out.shape == (2, 2, 64)
    want = (wide.float() @ w.float().T + 1).bfloat16()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


class _Spy(torch.Tensor):
    """The fp32 copy, recording that the wide side read it."""

    @staticmethod
    def __new__(cls, data, calls):
        t = torch.Tensor._make_subclass(cls, data)
        t.calls = calls
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in args:
            if isinstance(a, _Spy):
                a.calls.append(func.__name__)
        args = tuple(a.as_subclass(torch.Tensor) if isinstance(a, _Spy) else a for a in args)
        return func(*args, **(kwargs or {}))


def test_shapes_without_a_crossover_get_no_copy():
    w = _weight()
    gemm = RowDtypeGemm({(64, 32): None})
    assert gemm.attach([w]) == 0 and getattr(w, FP32_ATTR, None) is None
    x = torch.randn(40, 32).bfloat16()
    assert torch.equal(gemm.linear(x, w), F.linear(x, w))


def test_measure_crossover_reads_the_timings(monkeypatch):
    """fp32 cheaper from 8 rows on: crossover 8; an fp32 win at 2 rows followed by a loss does not count."""
    fake = {1: (1.0, 2.0), 2: (2.0, 1.0), 4: (4.0, 5.0), 8: (8.0, 3.0), 16: (16.0, 4.0), 32: (32.0, 6.0)}
    clock = iter(x for r in (1, 2, 4, 8, 16, 32) for x in fake[r])
    monkeypatch.setattr(cpu_gemm, "_median_ms", lambda fn, reps: next(clock))
    crossover, timings = measure_crossover(_weight(), _weight().float())
    assert crossover == 8 and timings[8] == dict(bf16_ms=8.0, fp32_ms=3.0)
    clock = iter([1.0, 2.0] * 6)
    crossover, _ = measure_crossover(_weight(), _weight().float())
    assert crossover is None


def test_plan_caches_per_cpu_and_refuses_without_memory(tmp_path, monkeypatch):
    measured = []

    def fake_measure(w, w32, **kwargs):
        measured.append(tuple(w.shape))
        return (2 if w.shape[0] == 64 else None), {1: {}}

    monkeypatch.setattr(cpu_gemm, "measure_crossover", fake_measure)
    cache = tmp_path / "cpu_gemm.json"
    w_a, w_b, w_f32 = _weight(64, 32), _weight(16, 32, 1), torch.randn(64, 32)
    gemm, reason = plan_for([w_a, w_b, w_f32], str(cache), "cpu-A", available_bytes=None)
    assert gemm is not None and gemm.crossovers == {(16, 32): None, (64, 32): 2}
    assert sorted(measured) == [(16, 32), (64, 32)] and ">= 2 rows" in reason and "never" in reason
    assert getattr(w_a, FP32_ATTR) is not None and getattr(w_b, FP32_ATTR, None) is None
    measured.clear()
    plan_for([_weight(64, 32)], str(cache), "cpu-A", available_bytes=None)
    assert measured == []  # cached for this CPU
    plan_for([_weight(64, 32)], str(cache), "cpu-B", available_bytes=None)
    assert measured == [(64, 32)]  # another CPU measures again
    gemm, reason = plan_for([_weight(64, 32)], str(cache), "cpu-A", available_bytes=1000)
    assert gemm is None and "GiB available" in reason
    cache.write_text("{not json")
    assert plan_for([_weight(64, 32)], str(cache), "cpu-A", available_bytes=None)[0] is not None
    assert plan_for([torch.randn(4, 4)], None, "cpu-A", None) == (None, "no bf16 CPU linear weights")


def test_hook_targets_exist_in_the_installed_sglang():
    import importlib

    from sglang_dspark.sglang_plugin.cpu_gemm import register

    targets = []
    register(type("Registry", (), {"register": staticmethod(lambda t, fn, kind: targets.append(t))}),
             type("HookType", (), {"AFTER": "after", "AROUND": "around"}))
    assert len(targets) == 3
    for target in targets:
        module, cls, attr = target.rsplit(".", 2)
        assert callable(getattr(getattr(importlib.import_module(module), cls), attr)), target


def test_linear_hook_routes_only_planned_bf16_weights(monkeypatch):
    w = _weight()
    gemm = RowDtypeGemm({(64, 32): 2})
    gemm.attach([w])
    layer = type("Layer", (), {})()
    layer.weight = w
    original_calls = []

    def original(method, layer, x, bias=None, *args, **kwargs):
        original_calls.append(x.shape[0])
        return F.linear(x, layer.weight.to(x.dtype), bias)

    wide = torch.randn(5, 32).bfloat16()
    monkeypatch.setattr(cpu_gemm, "_ACTIVE", None)
    cpu_gemm.around_linear_apply(original, None, layer, wide)
    assert original_calls == [5]  # no plan: SGLang's path
    monkeypatch.setattr(cpu_gemm, "_ACTIVE", gemm)
    out = cpu_gemm.around_linear_apply(original, None, layer, wide)
    assert original_calls == [5] and torch.equal(out, (wide.float() @ w.float().T).bfloat16())
    cpu_gemm.around_linear_apply(original, None, layer, wide.float())  # fp32 activations: not ours
    layer.use_intel_amx_backend = True
    cpu_gemm.around_linear_apply(original, None, layer, wide)
    assert original_calls == [5, 5, 5]
    assert cpu_gemm.engine_gemm_kind() == cpu_gemm.ROW_DISPATCH


def test_forced_crossover_measures_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_gemm, "measure_crossover", lambda *a, **k: pytest.fail("measured"))
    cache = tmp_path / "cpu_gemm.json"
    gemm, reason = plan_for([_weight(64, 32), _weight(16, 32, 1)], str(cache), "cpu-A", None, forced_crossover=2)
    assert gemm.crossovers == {(16, 32): 2, (64, 32): 2} and not cache.exists()


def _spy_narrow(calls):
    def narrow(x, weight, bias=None):
        calls.append(x.reshape(-1, x.shape[-1]).shape[0])
        return F.linear(x, weight, bias)
    return narrow


def test_kernel_plan_gains_without_copies_and_runs_without_them_when_memory_is_short(tmp_path, monkeypatch):
    """With the small-M kernel as the narrow side, a plan where fp32 never wins still routes every call to the
    kernel; a plan whose copies do not fit keeps the kernel and drops the copies, where the torch-bf16 narrow side
    is refused outright. Its cache entries do not mix with the torch-bf16 ones."""
    rows_seen = []

    def fake_measure(w, w32, rows, narrow):
        rows_seen.append(rows)
        return (None if w.shape[0] == 16 else 32), {1: {}}

    monkeypatch.setattr(cpu_gemm, "measure_crossover", fake_measure)
    cache = tmp_path / "cpu_gemm.json"
    calls = []
    w_a, w_b = _weight(64, 32), _weight(16, 32, 1)
    gemm, reason = plan_for([w_b], str(cache), "cpu-A", None, narrow=_spy_narrow(calls))
    assert gemm is not None and gemm.kind == cpu_gemm.KERNEL_DISPATCH and gemm.crossovers == {(16, 32): None}
    assert rows_seen == [cpu_gemm.KERNEL_CALIBRATION_ROWS] and "small-M kernel" in reason
    x = torch.randn(40, 32).bfloat16()
    assert torch.equal(gemm.linear(x, w_b), F.linear(x, w_b)) and calls == [40]
    gemm, reason = plan_for([w_a], str(cache), "cpu-A", available_bytes=1000, narrow=_spy_narrow(calls))
    assert gemm.crossovers == {(64, 32): None} and getattr(w_a, FP32_ATTR, None) is None
    assert "none kept" in reason
    rows_seen.clear()
    gemm, _ = plan_for([_weight(64, 32)], str(cache), "cpu-A", None)  # torch-bf16 narrow side: not cached yet
    assert rows_seen == [cpu_gemm.CALIBRATION_ROWS] and gemm.kind == cpu_gemm.ROW_DISPATCH


def test_hooks_send_narrow_calls_of_planned_weights_to_the_kernel(monkeypatch):
    w = _weight()
    calls = []
    gemm = RowDtypeGemm({(64, 32): 8}, _spy_narrow(calls), cpu_gemm.KERNEL_DISPATCH)
    gemm.attach([w])
    layer = type("Layer", (), {})()
    layer.weight = w
    monkeypatch.setattr(cpu_gemm, "_ACTIVE", gemm)
    original = lambda *a, **k: pytest.fail("SGLang's path ran for a planned weight")  # noqa: E731
    cpu_gemm.around_linear_apply(original, None, layer, torch.randn(3, 32).bfloat16())
    cpu_gemm.around_linear_apply(original, None, layer, torch.randn(9, 32).bfloat16())  # fp32 copy
    assert calls == [3]
    assert cpu_gemm.engine_gemm_kind() == cpu_gemm.KERNEL_DISPATCH


def test_kernel_crossovers_are_cached_per_kernel_build(tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(cpu_gemm, "measure_crossover",
                        lambda w, w32, **k: (measured.append(1), (None, {1: {}}))[1])
    cache = str(tmp_path / "cpu_gemm.json")
    for build, expect in (("aaa", 1), ("aaa", 1), ("bbb", 2)):
        plan_for([_weight()], cache, "cpu-A", None, narrow=F.linear, narrow_id=build)
        assert len(measured) == expect


def test_route_drafter_sends_every_draft_gemm_through_the_plan(tmp_path, monkeypatch):
    """A bf16 drafter with a reduced vocabulary: its nn.Linear layers, the reduced lm_head and Markov W2 all go
    through the plan's linear, and a greedy draft pass proposes what the unrouted drafter proposes (up to bf16
    near-ties of the logits)."""
    from tests.unit.test_drafter_model import context, make_model

    calls = []
    monkeypatch.setattr(cpu_gemm, "_kernel", lambda: _spy_narrow(calls))
    monkeypatch.setattr(cpu_gemm, "_kernel_id", lambda: "test")
    monkeypatch.setattr(cpu_gemm, "measure_crossover", lambda w, w32, **k: (None, {1: {}}))
    monkeypatch.setattr(cost_profile, "CACHE_DIR", tmp_path / "cost_models")  # the crossover cache lives beside it
    model = make_model(dtype=torch.bfloat16)
    model.set_draft_vocab(torch.arange(0, 64, 2))
    _, k, v = context(model)
    args = (torch.tensor([3]), torch.tensor([10]), k.bfloat16(), v.bfloat16(), torch.ones(1, 10, dtype=torch.bool),
            torch.zeros(1))
    before = model.propose(*args)
    assert calls == []
    reason = cpu_gemm.route_drafter(model)
    assert "small-M kernel" in reason
    after = model.propose(*args)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert len(calls) > n_linear  # every module once at least, plus the reduced lm_head and the W2 steps
    assert model.draft_lm_head_linear != F.linear and model.markov_head.w2_linear != F.linear
    torch.testing.assert_close(after.logits, before.logits)  # the spy runs F.linear: same values
    assert torch.equal(after.tokens, before.tokens)


def test_measure_crossover_against_torch_bf16_when_there_is_no_fp32_copy(monkeypatch):
    fake = {1: (1.0, 2.0), 2: (2.0, 2.5), 4: (4.0, 3.0), 8: (8.0, 3.0)}
    clock = iter(x for r in (1, 2, 4, 8) for x in fake[r])
    monkeypatch.setattr(cpu_gemm, "_median_ms", lambda fn, reps: next(clock))
    crossover, timings = measure_crossover(_weight(), None, rows=(1, 2, 4, 8))
    assert crossover == 4 and timings[4] == dict(narrow_ms=4.0, torch_bf16_ms=3.0)


def test_native_bf16_plan_keeps_torch_bf16_as_the_wide_side_and_makes_no_copy(tmp_path, monkeypatch):
    """A CPU with native bf16: the kernel below each shape's crossover, torch's bf16 GEMM from it, no fp32 copy;
    no plan without a kernel, or where torch wins from one row on."""
    seen = []

    def fake_measure(w, w32, rows, narrow):
        seen.append(w32)
        return {64: 4, 16: None, 8: rows[0]}[w.shape[0]], {1: {}}

    monkeypatch.setattr(cpu_gemm, "measure_crossover", fake_measure)
    cache = tmp_path / "cpu_gemm.json"
    calls = []
    w_a, w_b = _weight(64, 32), _weight(16, 32, 1)
    gemm, reason = plan_for([w_a, w_b], str(cache), "cpu-A", available_bytes=1000, narrow=_spy_narrow(calls),
                            wide_bf16=True)
    assert gemm.kind == cpu_gemm.NATIVE_KERNEL_DISPATCH and seen == [None, None] and "AVX512-BF16" in reason
    assert gemm.crossovers == {(16, 32): None, (64, 32): 4} and getattr(w_a, FP32_ATTR, None) is None
    x3, x5 = torch.randn(3, 32).bfloat16(), torch.randn(5, 32).bfloat16()
    assert torch.equal(gemm.linear(x3, w_a), F.linear(x3, w_a)) and calls == [3]
    assert torch.equal(gemm.linear(x5, w_a), F.linear(x5, w_a)) and calls == [3]  # torch's bf16 GEMM
    assert torch.equal(gemm.linear(x5, w_b), F.linear(x5, w_b)) and calls == [3, 5]  # never crosses over
    amx, _ = plan_for([w_a, w_b], str(cache), "cpu-A", available_bytes=1000, narrow=_spy_narrow(calls),
                      narrow_id="amx-build", wide_bf16=True, native_kind=cpu_gemm.NATIVE_AMX_KERNEL_DISPATCH)
    assert amx.kind == cpu_gemm.NATIVE_AMX_KERNEL_DISPATCH  # its own cost-model key: a new kernel is re-profiled
    gemm, reason = plan_for([_weight(8, 32, 2)], str(cache), "cpu-A", None, narrow=_spy_narrow(calls),
                            wide_bf16=True)
    assert gemm is None and "every measured row count" in reason
    gemm, reason = plan_for([w_a], str(cache), "cpu-A", None, wide_bf16=True)
    assert gemm is None and "no small-M kernel" in reason


def test_widening_the_kernel_counts_measures_again_and_names_it_in_the_cost_key(tmp_path, monkeypatch):
    """A cache measured up to 64 rows cannot say where a prefill-width crossover lies: widening the counts must
    measure again, and the cost model, priced with the old crossovers, must not be reused."""
    seen = []
    monkeypatch.setattr(cpu_gemm, "measure_crossover", lambda w, w32, rows, narrow: (seen.append(rows), (8, {}))[1])
    cache = str(tmp_path / "cpu_gemm.json")
    tags = []
    for widest in (64, 64, 512):
        gemm, _ = plan_for([_weight()], cache, "cpu-A", None, narrow=F.linear, narrow_id="k",
                           kernel_rows=cpu_gemm.kernel_calibration_rows(widest))
        tags.append(cpu_gemm.cost_tag(gemm.kind, gemm.widest))
    assert seen == [(1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]
    assert tags[0] == tags[1] != tags[2]
    assert cpu_gemm.cost_tag(cpu_gemm.ROW_DISPATCH, 32) == cpu_gemm.ROW_DISPATCH
    assert cpu_gemm.KERNEL_CALIBRATION_ROWS[-1] == DSparkOptions().cpu_gemm_rows


def test_cpu_gemm_rows_flag_takes_powers_of_two_from_64(tmp_path):
    import argparse

    from sglang_dspark.sglang_plugin.options import add_dspark_args, options_from_namespace

    parser = argparse.ArgumentParser()
    add_dspark_args(parser)
    assert options_from_namespace(parser.parse_args(["--dspark-cpu-gemm-rows", "1024"])).cpu_gemm_rows == 1024
    for bad in ("32", "100", "8192", "wide"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--dspark-cpu-gemm-rows", bad])


def test_a_crossover_beyond_64_rows_is_found(monkeypatch):
    """The kernel ahead up to 128 rows and fp32 ahead from 256: the crossover is 256, not 'never'."""
    rows = cpu_gemm.KERNEL_CALIBRATION_ROWS
    assert rows[-1] >= 256
    fake = {r: ((r, 2.0 * r) if r < 256 else (r, 0.6 * r)) for r in rows}
    clock = iter(x for r in rows for x in fake[r])
    monkeypatch.setattr(cpu_gemm, "_median_ms", lambda fn, reps: next(clock))
    crossover, _ = measure_crossover(_weight(), _weight().float(), rows=rows, narrow=F.linear)
    assert crossover == 256


def test_slow_calls_are_timed_once_after_the_warm_up(monkeypatch):
    calls = []
    now = iter(range(0, 10_000, 1))
    monkeypatch.setattr(cpu_gemm.time, "perf_counter", lambda: next(now) * (0.5 if slow else 0.0001))
    for slow, expect in ((True, 2), (False, 4)):
        calls.clear()
        cpu_gemm._median_ms(lambda: calls.append(1), reps=3)
        assert len(calls) == expect
