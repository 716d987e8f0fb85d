"""Profile `train fit` steps on a real cache: blocks per second and the operators that dominate a step.

    python benchmarks/train_step_profile.py --cache runs/cache --steps 6 [--threads 1] -- <extra train fit flags>

Runs the real `train fit` (from scratch, into a temporary directory) under torch.profiler, times the steps after the
first (warm-up) from the fit log, and prints the top operators by self CPU time with their input shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.train.__main__ import main as train_main

SHIPPED_SHAPE = ["--layers", "2", "--block-size", "7", "--intermediate-size", "1536", "--mask-token-id", "151665",
                 "--markov-rank", "32", "--num-anchors", "128", "--batch", "2", "--vocab-sample-top-k", "32",
                 "--vocab-sample-negatives", "4096", "--ce-weight", "1.0", "--l1-weight", "0.1"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default=None)
    p.add_argument("extra", nargs="*", help="train fit flags after --, replacing the shipped shape's")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as out:
        fit = ["fit", "--cache", args.cache, "--out", out, "--steps", str(args.steps), "--log-every", "1",
               "--save-every", str(10 ** 9), "--no-save-shared", *SHIPPED_SHAPE, *args.extra]
        t0 = time.time()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            train_main(fit)
        wall = time.time() - t0
        log = [json.loads(x) for x in open(Path(out) / "train_log.jsonl")]
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.top))
    # the profiler slows every op alike; the step rate without it comes from a second, unprofiled run
    with tempfile.TemporaryDirectory() as out:
        fit[fit.index("--out") + 1] = out
        train_main(fit)
        log = [json.loads(x) for x in open(Path(out) / "train_log.jsonl")]
    steps_timed = log[-1]["step"] - log[0]["step"]  # the first step warms up
    seconds = log[-1]["elapsed_s"] - log[0]["elapsed_s"]
    blocks = log[-1]["blocks"] - log[0]["blocks"]
    report = {"machine": describe_machine(), "threads": torch.get_num_threads(), "flags": fit,
              "steps_timed": steps_timed, "seconds_per_step": seconds / steps_timed,
              "blocks_per_second": blocks / seconds, "profiled_wall_s": wall}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
