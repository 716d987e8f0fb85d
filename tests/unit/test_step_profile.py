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
