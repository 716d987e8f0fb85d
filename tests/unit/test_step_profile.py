"""The opt-in step profiler records exactly its window of decode steps, once, and writes an operator table."""

import torch

from sglang_dspark.sglang_plugin.step_profile import StepProfiler, section


def test_profiles_only_the_window_and_writes_a_table(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DSPARK_PROFILE", str(tmp_path / "prof"))
    monkeypatch.setenv("SGLANG_DSPARK_PROFILE_STEPS", "2:4")
    prof = StepProfiler.from_env()
    x = torch.randn(64, 64)
    for step in range(8):
        prof.before_step()
        assert (prof._prof is not None) == (step in (2, 3))
        with section("dspark.verify_forward", True):
            x = torch.tanh(x @ x)
        prof.after_step()
    out = list(tmp_path.glob("prof.*.txt"))
    assert len(out) == 1
    text = out[0].read_text()
    assert text.startswith("decode steps 2..3") and "dspark.verify_forward" in text


def test_disabled_without_the_variable(monkeypatch):
    monkeypatch.delenv("SGLANG_DSPARK_PROFILE", raising=False)
    assert StepProfiler.from_env() is None


def test_every_dspark_range_is_written_as_json_and_read_back(tmp_path, monkeypatch):
    """Ranges with tiny self time fall off the top-60 table; the JSON line keeps them all, per step."""
    import importlib.util
    import pathlib

    monkeypatch.setenv("SGLANG_DSPARK_PROFILE", str(tmp_path / "prof"))
    monkeypatch.setenv("SGLANG_DSPARK_PROFILE_STEPS", "0:2")
    prof = StepProfiler.from_env()
    x = torch.randn(32, 32)
    for _ in range(2):
        prof.before_step()
        with section("dspark.verify_forward", True):
            for _ in range(3):
                with section("dspark.mod.o_proj", True):
                    x = torch.tanh(x @ x)
        prof.after_step()
    text = next(tmp_path.glob("prof.*.txt")).read_text()
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "verify_step_profile.py"
    spec = importlib.util.spec_from_file_location("verify_step_profile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    per_step = mod.sections(text, steps=2)
    assert set(per_step) == {"dspark.verify_forward", "dspark.mod.o_proj"}
    assert 0 < per_step["dspark.mod.o_proj"] <= per_step["dspark.verify_forward"]
