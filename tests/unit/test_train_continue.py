"""`train continue`: a training round from the committed drafter on fresh data, recorded, resumable (tiny target)."""

import json
import shutil

import pytest
import torch

from sglang_dspark.train import accumulate
from sglang_dspark.train.__main__ import main
from sglang_dspark.train.tiny import make_tiny_cache


def test_ship_only_a_better_calibrated_drafter():
    curve = [{"tau": 1.4, "shipped": True}, {"tau": 1.6, "shipped": False}]
    assert accumulate.should_ship(1.5, 0.02, curve)[0]
    assert not accumulate.should_ship(1.39, 0.02, curve)[0]
    assert not accumulate.should_ship(1.9, 0.05, curve)[0]
    assert not accumulate.should_ship(1.9, None, curve)[0]
    assert accumulate.should_ship(1.1, 0.01, [])[0]


def test_taus_are_compared_only_between_rows_measured_the_same_way():
    fp32 = {"dtype": "fp32", "limit": 10, "tokens": 64}
    bf16 = {"dtype": "bf16", "limit": 20, "tokens": 64}
    curve = [{"tau": 1.4, "shipped": True, "eval": fp32}, {"tau": 1.3, "shipped": True, "eval": bf16},
             {"tau": 1.5, "shipped": False, "eval": bf16}]
    assert accumulate.shipped_tau(curve, fp32) == 1.4 and accumulate.shipped_tau(curve, bf16) == 1.3
    assert accumulate.shipped_tau(curve, {**bf16, "limit": 5}) is None
    assert accumulate.should_ship(1.35, 0.01, curve, bf16)[0]
    assert not accumulate.should_ship(1.35, 0.01, curve, fp32)[0]


def test_autocast_only_where_bf16_is_native():
    from sglang_dspark.train.fit import use_autocast

    assert use_autocast("auto", "cpu", ["avx2", "avx512f", "amx_bf16"])
    assert use_autocast("auto", "cpu", ["avx2", "avx512_bf16"])
    assert not use_autocast("auto", "cpu", ["avx2"])
    assert use_autocast("auto", "cuda", [])
    assert use_autocast("bf16", "cpu", ["avx2"]) and not use_autocast("none", "cuda", [])


def test_worst_position_ece_forgives_positions_at_their_noise_floor():
    rep = {"ece_sts_by_position": [0.01, 0.05, 0.2, None], "ece_sts_floor_by_position": [0.02, 0.03, 0.25, None]}
    assert accumulate.worst_position_ece(rep) == pytest.approx(0.05)
    assert accumulate.worst_position_ece({}) is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cont")
    make_tiny_cache(str(root), num_layers=3, n=4)
    main(["fit", "--cache", str(root / "cache"), "--layers", "1", "--block-size", "3", "--markov-rank", "4",
          "--intermediate-size", "32", "--num-anchors", "8", "--batch", "2", "--steps", "2", "--save-every", "2",
          "--holdout-fraction", "0.25", "--max-length", "96", "--no-save-shared", "--out", str(root / "run")])
    drafter = root / "drafter"
    shutil.copytree(root / "run" / "step_2", drafter, ignore=shutil.ignore_patterns("training_state.pt"))
    return root, drafter


def test_two_rounds_accumulate_on_fresh_prompts(tiny, monkeypatch):
    root, drafter = tiny
    monkeypatch.setattr(accumulate, "DEFAULT_STEP_SECONDS", 30.0)  # 60 s of fit budget -> 2 steps
    torch.set_num_threads(1)
    args = ["continue", "--budget-min", "1", "--drafter", str(drafter), "--target", str(root / "t"), "--work",
            str(root / "work"), "--prompts", "6", "--eval-limit", "2", "--eval-tokens", "6", "--sts-prompts", "2",
            "--fit-args", "--max-length 96 --eval-every 0 --num-anchors 8 --steps 3"]
    first = main(args + ["--dtype", "fp32"])
    assert not (root / "work").exists()
    assert json.loads((drafter / "training" / "cursor.json").read_text()) == {"next": 6}
    assert first["cursor"] == 6 and first["blocks"] > 0 and first["tau"] >= 1.0 and first["cpu_hours"] > 0
    second = main(args + ["--dtype", "fp32"])
    curve = accumulate.read_curve(str(drafter))
    # the first round measured the drafter it started from; the second had that row to beat and measured nothing
    assert curve[0]["baseline"] and curve[0]["shipped"] and curve[0]["tau"] >= 1.0 and "cursor" not in curve[0]
    assert [r.get("cursor") for r in curve] == [None, 6, 12]
    assert curve[2]["blocks"] > curve[1]["blocks"] and curve[2]["cpu_hours"] > curve[1]["cpu_hours"]
    assert curve[1]["prompts"] == 6 and curve[1]["data_seconds"] > 0
    assert curve[1]["sts_set"] == "eval-dev"  # the STS was fitted on the eval sets' dev slice
    assert accumulate.prompt_seconds(curve, "text") == pytest.approx(curve[2]["data_seconds"] / 6)
    assert accumulate.prompt_seconds(curve, "generate") == accumulate.DEFAULT_PROMPT_SECONDS["generate"]
    assert second == curve[2]
    assert {r["eval"]["dtype"] for r in curve} == {"fp32"}
    # other eval settings have no row to beat: the drafter in place is measured again, and blocks keep counting
    third = main(args + ["--dtype", "bf16"])
    curve = accumulate.read_curve(str(drafter))
    assert curve[3]["baseline"] and curve[3]["eval"]["dtype"] == "bf16" and curve[3]["blocks"] == curve[2]["blocks"]
    assert third == curve[4] and third["eval"]["dtype"] == "bf16"


def test_fit_stops_at_max_minutes_with_a_checkpoint(tiny):
    root, drafter = tiny
    out = main(["fit", "--cache", str(root / "cache"), "--out", str(root / "timed"), "--init-from", str(drafter),
                "--steps", "50", "--batch", "1", "--num-anchors", "8", "--max-length", "96", "--save-every", "100",
                "--holdout-fraction", "0.25", "--no-save-shared", "--max-minutes", "0.00001"])
    assert out["final_step"] == 1
    assert (root / "timed" / "step_1").is_dir()


def test_an_interrupted_round_resumes_at_its_stage(tiny, monkeypatch):
    root, drafter = tiny
    calls = []
    real = accumulate.Round.stage

    def stage(self, name, fn):
        if name == "fit" and not calls:
            calls.append(name)
            raise KeyboardInterrupt
        return real(self, name, fn)

    monkeypatch.setattr(accumulate.Round, "stage", stage)
    monkeypatch.setattr(accumulate, "DEFAULT_STEP_SECONDS", 30.0)
    args = ["continue", "--budget-min", "1", "--drafter", str(drafter), "--target", str(root / "t"), "--work",
            str(root / "work2"), "--prompts", "4", "--eval-limit", "1", "--eval-tokens", "4", "--no-ship",
            "--sts-prompts", "2",
            "--fit-args", "--max-length 96 --eval-every 0 --num-anchors 8 --steps 3"]
    settings = {"dtype": accumulate.resolve_dtype("auto"), "limit": 1, "tokens": 4}
    tdir = accumulate.training_dir(str(drafter))
    tdir.mkdir(exist_ok=True)
    with open(tdir / "curve.jsonl", "a") as f:  # a shipped row measured as this round measures
        f.write(json.dumps({"tau": 1.0, "blocks": 0, "cpu_hours": 0.0, "shipped": True, "eval": settings}) + "\n")
    with pytest.raises(KeyboardInterrupt):
        main(args)
    state = json.loads((root / "work2" / "state.json").read_text())
    assert state["done"] == ["baseline", "data", "capture"] and state["eval"] == settings
    assert state["results"]["baseline"]["skipped"]  # the curve already holds a shipped row
    out = main(args)
    assert out["shipped"] is False
    kept = root / "work2-candidate"  # a rejected candidate is kept, with the STS fitted free-running for it
    sts = json.loads((kept / "sts.json").read_text())
    assert "temperatures" in sts and "temperatures_sampled" in sts and (kept / "model.safetensors").exists()


def _prompt_file(path, n):
    path.write_text("".join(json.dumps({"turns": [f"{path.stem} prompt {i}"]}) + "\n" for i in range(n)))
    return str(path)


def test_calibration_prompts_avoid_the_measured_and_benchmarked_slices(tmp_path):
    from sglang_dspark.eval.datasets import calibration_prompts, load_prompts

    path = _prompt_file(tmp_path / "set.jsonl", 60)
    dev = calibration_prompts(path, 8, eval_limit=20, bench_rows=10)
    measured = set(load_prompts(path, 20))
    assert len(set(dev)) == 8 and not set(dev) & measured
    assert not set(dev) & {f"set prompt {i}" for i in range(10)}
    assert calibration_prompts(path, 8, eval_limit=5, bench_rows=10) == dev  # not tied to the eval's size
    with pytest.raises(ValueError, match="outside the eval and benchmark slices"):
        calibration_prompts(path, 40, eval_limit=20, bench_rows=10)


def test_sts_prompts_come_from_the_eval_dev_slices_or_the_pool(tmp_path, monkeypatch):
    import argparse

    from sglang_dspark.eval import datasets

    paths = [_prompt_file(tmp_path / f"{name}.jsonl", 60) for name in ("a", "b", "c")]
    monkeypatch.setattr(datasets, "default_datasets", lambda: paths)
    p = argparse.ArgumentParser()
    accumulate.add_args(p)
    args = p.parse_args(["--budget-min", "1", "--sts-prompts", "7", "--eval-limit", "20"])
    turns = accumulate.sts_prompt_turns(args, cursor=0)
    assert len(turns) == 7 and len(set(turns)) == 7
    assert not set(turns) & set(datasets.load_prompts(paths[0], 20))
    pool = accumulate.sts_prompt_turns(p.parse_args(["--budget-min", "1", "--sts-prompts", "3", "--sts-set", "pool"]),
                                       cursor=5)
    assert len(pool) == 3 and not set(pool) & set(turns)
