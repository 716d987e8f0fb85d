"""The launcher's defaults and its one-line errors, without starting SGLang."""

import subprocess
import sys

import pytest

from sglang_dspark import launch_server as ls
from sglang_dspark.embedded import DEFAULT_TARGET_DIR


def _val(argv, flag):
    return argv[argv.index(flag) + 1]


def test_cpu_defaults_filled_in(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda: False)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    argv = ls.build_argv(["--model-path", str(model)], cuda=False)
    assert _val(argv, "--device") == "cpu"
    assert int(_val(argv, "--max-total-tokens")) > 0
    assert _val(argv, "--host") == "127.0.0.1" and _val(argv, "--port") == "30000"
    assert "--speculative-algorithm" not in argv


def test_user_flags_win_and_pass_through(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda: False)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    user = ["--model-path", str(model), "--port", "31000", "--max-total-tokens", "4096", "--attention-backend",
            "intel_amx", "--some-future-sglang-flag", "x"]
    argv = ls.build_argv(user, cuda=False)
    assert argv[: len(user)] == user
    assert argv.count("--port") == 1 and argv.count("--max-total-tokens") == 1 and argv.count("--attention-backend") == 1


def test_gpu_adds_no_cpu_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    argv = ls.build_argv(["--model-path", "org/hub-model"], cuda=True)
    assert "--device" not in argv and "--max-total-tokens" not in argv


def test_default_model_is_embedded(monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda: False)
    monkeypatch.setattr(ls, "_check_model_dir", lambda kind, p: None)
    argv = ls.build_argv([], cuda=False)
    assert _val(argv, "--model-path") == str(DEFAULT_TARGET_DIR)


@pytest.mark.parametrize("make", ["missing", "file", "no_config", "no_weights"])
def test_bad_model_path_is_one_line_error(tmp_path, make):
    p = tmp_path / "model"
    if make == "file":
        p.write_text("x")
    elif make == "no_config":
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"")
    elif make == "no_weights":
        p.mkdir()
        (p / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, "-m", "sglang_dspark.launch_server", "--model-path", str(p)],
                       capture_output=True, text=True, timeout=60, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert str(p) in lines[0] and lines[0].startswith("sglang_dspark:")


def test_help_lists_sglang_and_dspark_flags():
    r = subprocess.run([sys.executable, "-m", "sglang_dspark.launch_server", "--help"], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    for flag in ("--model-path", "--speculative-draft-model-path", "--dspark-controller", "--dspark-gamma",
                 "--dspark-sts-path", "--dspark-draft-temperature", "--no-dspark"):
        assert flag in r.stdout, flag


def test_draft_temperature_flag_parses_numbers_and_request_and_rejects_the_rest():
    import argparse

    from sglang_dspark.sglang_plugin.options import DSparkOptions, add_dspark_args, options_from_namespace

    parser = argparse.ArgumentParser()
    add_dspark_args(parser)
    assert options_from_namespace(parser.parse_args([])).draft_temperature == DSparkOptions().draft_temperature == 0
    assert options_from_namespace(parser.parse_args(["--dspark-draft-temperature", "0.5"])).draft_temperature == 0.5
    assert options_from_namespace(parser.parse_args(["--dspark-draft-temperature", "request"])).draft_temperature \
        is None
    for bad in ("-1", "hot", "nan", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--dspark-draft-temperature", bad])


def test_bf16_on_a_cpu_without_native_bf16_gets_a_dtype_note(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    avx2 = {"fma", "avx", "avx2"}
    argv = ["--model-path", str(model)]
    note = ls.cpu_bf16_note(argv, avx2)
    assert note and "fp32 copies" in note  # --dspark-cpu-gemm auto
    note = ls.cpu_bf16_note(argv + ["--dspark-cpu-gemm", "off"], avx2)
    assert note and "--dtype float32" in note
    assert ls.cpu_bf16_note(argv, avx2 | {"avx512f", "avx512_bf16"}) is None  # native bf16 dot products
    assert ls.cpu_bf16_note(argv, avx2 | {"amx_bf16"}) is None
    assert ls.cpu_bf16_note(argv + ["--dtype", "float32"], avx2) is None
    assert ls.cpu_bf16_note(argv, set()) is None  # flags unknown (not Linux): say nothing
    (model / "config.json").write_text('{"torch_dtype": "float32"}')
    assert ls.cpu_bf16_note(argv, avx2) is None
