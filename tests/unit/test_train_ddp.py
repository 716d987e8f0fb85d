"""`torchrun --nproc-per-node 2 -m sglang_dspark.train fit` (gloo) takes the same steps as one process at the same
global batch."""

import json
import os
import subprocess
import sys

import pytest

from sglang_dspark.train.tiny import make_tiny_cache

FIT = ["fit", "--layers", "1", "--block-size", "3", "--markov-rank", "4", "--intermediate-size", "32",
       "--num-anchors", "16", "--batch", "4", "--steps", "4", "--lr", "5e-3", "--warmup-ratio", "0",
       "--holdout-fraction", "0.2", "--save-every", "4", "--log-every", "1", "--max-length", "96",
       "--save-dtype", "fp32", "--device", "cpu"]


def _log(run):
    return [json.loads(x) for x in open(os.path.join(run, "train_log.jsonl"))]


@pytest.mark.timeout(600)
def test_two_gloo_processes_follow_the_single_process_loss_curve(tmp_path):
    make_tiny_cache(str(tmp_path), num_layers=3, n=10)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = [*FIT, "--cache", str(tmp_path / "cache")]
    subprocess.run([sys.executable, "-m", "sglang_dspark.train", *common, "--out", str(tmp_path / "one")],
                   check=True, env=env, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "-m", "sglang_dspark.train", *common, "--out", str(tmp_path / "two")],
                   check=True, env=env, timeout=300)
    one, two = _log(tmp_path / "one"), _log(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        assert a["blocks"] == b["blocks"]
        for key in ("loss", "ce", "l1", "conf", "grad_norm", "top1"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (key, a, b)
    assert one[-1]["loss"] < one[0]["loss"]  # the steps did train
    assert sorted(os.listdir(tmp_path / "two")) == ["latest", "step_4", "train_log.jsonl"]
