"""The launcher's defaults and its one-line errors, without starting SGLang."""

import subprocess
import sys

import pytest

from sglang_dspark import launch_server as ls
from sglang_dspark.embedded import DEFAULT_TARGET_DIR


def _val(argv, flag):
    return argv[argv.index(flag) + 1]


def test_cpu_defaults_filled_in(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda *a: False)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    argv = ls.build_argv(["--model-path", str(model)], cuda=False)
    assert _val(argv, "--device") == "cpu"
    assert int(_val(argv, "--max-total-tokens")) > 0
    assert _val(argv, "--host") == "127.0.0.1" and _val(argv, "--port") == "30000"
    assert "--speculative-algorithm" not in argv
    assert argv.count("--sleep-on-idle") == 1
    assert ls.build_argv(["--model-path", str(model), "--sleep-on-idle"], cuda=False).count("--sleep-on-idle") == 1


def test_user_flags_win_and_pass_through(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda *a: False)
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
    monkeypatch.setattr(ls, "_dspark_available", lambda *a: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    argv = ls.build_argv(["--model-path", "org/hub-model"], cuda=True)
    assert "--device" not in argv and "--max-total-tokens" not in argv and "--sleep-on-idle" not in argv


def test_default_model_is_embedded(monkeypatch):
    monkeypatch.setattr(ls, "_dspark_available", lambda *a: False)
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


# ------------------------------------------------------------------------------------- switching speculation
def _model_dir(tmp_path):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    return model


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A shipped drafter that exists and a plugin that imports: DSPARK_EXT is the launcher's default."""
    drafter = tmp_path / "shipped_drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    (drafter / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(ls, "DEFAULT_DRAFTER_DIR", drafter)
    return drafter


def _spec_flags(argv):
    return [a for a in argv if a.startswith("--speculative") or a.startswith("--dspark")]


def test_default_is_dspark_ext_with_the_shipped_drafter(tmp_path, shipped):
    argv = ls.build_argv(["--model-path", str(_model_dir(tmp_path))], cuda=False)
    assert _val(argv, "--speculative-algorithm") == "DSPARK_EXT"
    assert _val(argv, "--speculative-draft-model-path") == str(shipped)
    assert _val(argv, "--attention-backend") == "torch_native"


@pytest.mark.parametrize("spelling", [["--speculative-algorithm", "DSPARK_EXT"], ["--speculative-algorithm=dspark_ext"]])
def test_explicit_dspark_ext_is_the_default(tmp_path, shipped, spelling):
    model = str(_model_dir(tmp_path))
    default = ls.build_argv(["--model-path", model], cuda=False)
    explicit = ls.build_argv(["--model-path", model, *spelling], cuda=False)
    assert _val(explicit, "--speculative-draft-model-path") == str(shipped)
    assert (ls._flag_value(explicit, "--speculative-algorithm") or "").upper() == "DSPARK_EXT"
    assert sorted(a for a in explicit if a not in spelling) == sorted(a for a in default if a not in (
        "--speculative-algorithm", "DSPARK_EXT"))


def test_explicit_dspark_ext_without_any_drafter_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "DEFAULT_DRAFTER_DIR", tmp_path / "absent")
    with pytest.raises(SystemExit, match="DSPARK_EXT needs --speculative-draft-model-path"):
        ls.build_argv(["--model-path", str(_model_dir(tmp_path)), "--speculative-algorithm", "DSPARK_EXT"], cuda=False)


def test_a_user_drafter_turns_dspark_ext_on_even_without_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "DEFAULT_DRAFTER_DIR", tmp_path / "absent")
    drafter = tmp_path / "d"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    (drafter / "model.safetensors").write_bytes(b"")
    argv = ls.build_argv(["--model-path", str(_model_dir(tmp_path)), "--speculative-draft-model-path", str(drafter)],
                         cuda=False)
    assert _val(argv, "--speculative-algorithm") == "DSPARK_EXT" and argv.count("--speculative-draft-model-path") == 1


def test_no_drafter_anywhere_serves_plain(tmp_path, monkeypatch):
    monkeypatch.setattr(ls, "DEFAULT_DRAFTER_DIR", tmp_path / "absent")
    argv = ls.build_argv(["--model-path", str(_model_dir(tmp_path))], cuda=False)
    assert _spec_flags(argv) == []


@pytest.mark.parametrize("off", [["--no-dspark"], ["--speculative-algorithm", "NONE"], ["--speculative-algorithm", "none"],
                                 ["--speculative-algorithm=None"], ["--no-dspark", "--speculative-algorithm", "NONE"]])
def test_none_is_no_dspark(tmp_path, shipped, off):
    """NONE must not reach SGLang: 0.5.23 keeps the string and dies on the first request's spec metrics."""
    model = str(_model_dir(tmp_path))
    argv = ls.build_argv(["--model-path", model, *off], cuda=False)
    assert argv == ls.build_argv(["--model-path", model, "--no-dspark"], cuda=False)
    assert _spec_flags(argv) == [] and "--no-dspark" not in argv
    assert _val(argv, "--attention-backend") == "torch_native"


def test_none_keeps_the_users_other_flags(tmp_path, shipped):
    model = str(_model_dir(tmp_path))
    argv = ls.build_argv(["--speculative-algorithm", "NONE", "--model-path", model, "--port", "31001"], cuda=False)
    assert argv[:4] == ["--model-path", model, "--port", "31001"]


@pytest.mark.parametrize("algo", ["NGRAM", "ngram", "STANDALONE", "EAGLE"])
def test_sglang_algorithms_pass_through_without_dspark_ext_flags(tmp_path, shipped, algo):
    user = ["--model-path", str(_model_dir(tmp_path)), "--speculative-algorithm", algo,
            "--speculative-num-draft-tokens", "4"]
    argv = ls.build_argv(user, cuda=False)
    assert argv[: len(user)] == user
    assert argv.count("--speculative-algorithm") == 1
    assert "--speculative-draft-model-path" not in argv  # not the shipped DSpark drafter
    assert not any(a.startswith("--dspark") for a in argv)
    assert _val(argv, "--attention-backend") == "intel_amx"  # torch_native cannot verify
    assert _val(argv, "--device") == "cpu"


def test_sglang_algorithm_keeps_the_users_drafter_and_backend(tmp_path, shipped):
    model = str(_model_dir(tmp_path))
    user = ["--model-path", model, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", model,
            "--attention-backend", "torch_native"]
    argv = ls.build_argv(user, cuda=False)
    assert argv[: len(user)] == user and argv.count("--attention-backend") == 1
    assert argv.count("--speculative-draft-model-path") == 1


def test_sglang_algorithm_on_gpu_adds_nothing(tmp_path, shipped):
    user = ["--model-path", str(_model_dir(tmp_path)), "--speculative-algorithm", "DSPARK"]
    argv = ls.build_argv(user, cuda=True)
    assert argv[: len(user)] == user and "--attention-backend" not in argv and "--device" not in argv


@pytest.mark.parametrize("algo,needle", [("DSPARK", "DSPARK_EXT"), ("dspark", "DSPARK_EXT"), ("DFLASH", "CUDA"),
                                         ("UNO", "CUDA")])
def test_cuda_only_algorithm_on_cpu_is_a_one_line_error(tmp_path, shipped, algo, needle):
    with pytest.raises(SystemExit) as e:
        ls.build_argv(["--model-path", str(_model_dir(tmp_path)), "--speculative-algorithm", algo], cuda=False)
    msg = str(e.value)
    assert msg.startswith("sglang_dspark:") and f"--speculative-algorithm {algo}" in msg and needle in msg
    assert "\n" not in msg


def test_cuda_only_algorithm_on_another_accelerator_is_left_to_sglang(tmp_path, shipped):
    user = ["--model-path", str(_model_dir(tmp_path)), "--speculative-algorithm", "DSPARK", "--device", "npu"]
    argv = ls.build_argv(user, cuda=False)
    assert argv[: len(user)] == user
    assert "--attention-backend" not in argv and "--max-total-tokens" not in argv  # CPU fill-ins are for the CPU


@pytest.mark.parametrize("algo", ["NGRAM", "DSPARK_EXT"])
def test_no_dspark_with_a_speculative_algorithm_is_refused(tmp_path, shipped, algo):
    with pytest.raises(SystemExit, match="--no-dspark conflicts with --speculative-algorithm " + algo):
        ls.build_argv(["--model-path", str(_model_dir(tmp_path)), "--no-dspark", "--speculative-algorithm", algo],
                      cuda=False)


def test_last_algorithm_wins_as_in_argparse(tmp_path, shipped):
    argv = ls.build_argv(["--model-path", str(_model_dir(tmp_path)), "--speculative-algorithm", "DSPARK_EXT",
                          "--speculative-algorithm", "NONE"], cuda=False)
    assert _spec_flags(argv) == []


def test_profile_load_only_for_dspark_ext(tmp_path, shipped):
    model = str(_model_dir(tmp_path))
    for off in (["--no-dspark"], ["--speculative-algorithm", "NONE"], ["--speculative-algorithm", "NGRAM"]):
        assert ls._wants_profile_load(ls.build_argv(["--model-path", model, *off], cuda=False), cuda=False) is False


def test_cuda_only_algorithm_exits_before_importing_sglang(tmp_path):
    """The refusal is a one-line stderr message and a non-zero exit, in well under SGLang's import time."""
    model = _model_dir(tmp_path)
    r = subprocess.run([sys.executable, "-m", "sglang_dspark.launch_server", "--model-path", str(model),
                        "--speculative-algorithm", "DSPARK"], capture_output=True, text=True, timeout=120,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "SGLANG_USE_CPU_ENGINE": "1"})
    assert r.returncode != 0
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("sglang_dspark:") and "DSPARK_EXT" in lines[0], r.stderr


def test_cpu_ranks_get_one_core_set_each():
    from sglang_dspark.launch_server import cpu_thread_binds

    assert cpu_thread_binds(["--model-path", "m"], [0, 1]) is None
    assert cpu_thread_binds(["--tp-size", "2"], [0, 1]) == "0|1"
    assert cpu_thread_binds(["--tp", "2", "--dp-size", "2"], list(range(8))) == "0-1|2-3|4-5|6-7"
    assert cpu_thread_binds(["--dp-size", "2"], [4, 5, 6]) == "4|5"
    with pytest.raises(SystemExit, match="need at least 4 cores"):
        cpu_thread_binds(["--tp-size", "4"], [0, 1])
