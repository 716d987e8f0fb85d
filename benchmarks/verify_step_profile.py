"""Where a verify step's time goes next to a plain decode step, on the same DSPARK_EXT worker, one stream.

Starts one DSPARK_EXT server per controller (default fixed:0, whose steps all run as plain decode steps through the
worker, and fixed:3, whose steps all verify 3 drafts), with retrieval drafts off and SGLANG_DSPARK_PROFILE set on a
window of decode steps past the start-up cost profiling; drives one stream of eval-mix prompts until the profile is
written, and prints per controller the worker's record_function sections (dspark.*) in ms per step.

    python benchmarks/verify_step_profile.py --out benchmarks/results/verify-step-profile-DATE-CPU.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_dspark.bench.load import run_load_sync  # noqa: E402
from sglang_dspark.bench.machine import describe_machine  # noqa: E402
from sglang_dspark.bench.prompts import eval_mix  # noqa: E402
from sglang_dspark.bench.server import ServerProcess  # noqa: E402
from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR  # noqa: E402
from sglang_dspark.sglang_plugin.step_profile import SECTIONS_TAG  # noqa: E402

UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def sections(table: str, steps: int) -> dict[str, float]:
    """{range name: ms of CPU total per step} for the dspark.* ranges: from the profile's JSON sections line where it
    has one, else from the rows of its (top-60) table."""
    for line in table.splitlines():
        if line.startswith(SECTIONS_TAG + " "):
            ranges = json.loads(line[len(SECTIONS_TAG) + 1:])
            return {k: round(v["cpu_total_ms"] / steps, 2) for k, v in ranges.items()}
    out = {}
    for line in table.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) < 6 or not cols[0].startswith("dspark."):
            continue
        total = cols[4]  # Name, Self CPU %, Self CPU, CPU total %, CPU total, ...
        m = re.match(r"([\d.]+)(us|ms|s)$", total)
        if m:
            out[cols[0]] = round(float(m.group(1)) * UNITS[m.group(2)] / steps, 2)
    return out


def profile(controller: str, args, tmp: str) -> dict:
    prefix = os.path.join(tmp, controller.replace(":", "_"))
    env = {"SGLANG_DSPARK_PROFILE": prefix, "SGLANG_DSPARK_PROFILE_STEPS": f"{args.start}:{args.start + args.steps}"}
    flags = ["--speculative-algorithm", "DSPARK_EXT", "--speculative-draft-model-path", str(DEFAULT_DRAFTER_DIR),
             "--dspark-controller", controller, "--dspark-retrieval", "off",
             "--dspark-no-draft-skip", *args.server_args]
    prompts = eval_mix((args.requests + 2) // 3)
    t0 = time.time()
    with ServerProcess(flags, env=env) as srv:
        for p in prompts:
            run_load_sync(srv.base_url, [p], 1, args.max_tokens, progress=False)
            if glob.glob(prefix + ".*.txt"):
                break
        else:
            raise SystemExit(f"{controller}: no profile after {len(prompts)} requests (raise --requests)")
    path = glob.glob(prefix + ".*.txt")[0]
    table = open(path).read()
    return {"controller": controller, "sections_ms_per_step": sections(table, args.steps), "table": table,
            "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--controllers", default="fixed:0,fixed:3")
    p.add_argument("--start", type=int, default=120, help="first profiled decode step (past the cost profiling)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=None)
    p.add_argument("server_args", nargs="*", help="extra launch_server flags (after --)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [profile(c, args, tmp) for c in args.controllers.split(",")]
    for r in runs:
        print(f"\n## {r['controller']} (ms per decode step, CPU total incl. children)")
        for name, ms in sorted(r["sections_ms_per_step"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:32s} {ms:8.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": describe_machine(),
                       "command": "python " + " ".join(sys.argv), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
