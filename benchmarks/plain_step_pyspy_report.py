"""Per-token function costs from `plain_step_profile.py --mode pyspy`: inclusive ms of py-spy samples (50 Hz) per
output token for each function, side by side for both servers, then sorted by the difference.

    python benchmarks/plain_step_pyspy_report.py runs/profile/prof_4.json [rows]
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import sys

MS_PER_SAMPLE = 20.0  # py-spy -r 50
FRAME = re.compile(r"(.*?) \((.*?)(?::\d+)?\)$")


def inclusive_samples(pattern: str) -> tuple[int, collections.Counter]:
    """(total samples, samples per function counted once per stack) over the raw files matching `pattern`."""
    total, per_function = 0, collections.Counter()
    for path in glob.glob(pattern):
        for line in open(path):
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            seen = set()
            for frame in stack.split(";"):
                m = FRAME.match(frame.strip())
                key = f"{m.group(1)} {m.group(2).split('site-packages/')[-1]}" if m else frame
                if key not in seen:
                    per_function[key] += n
                    seen.add(key)
    return total, per_function


def main() -> None:
    results = json.load(open(sys.argv[1]))
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    folder = os.path.dirname(sys.argv[1])
    names = list(results)
    samples = {k: inclusive_samples(os.path.join(folder, f"spy_{k}_*.txt")) for k in names}
    tokens = {k: sum(r["tokens"] for r in results[k]) for k in names}
    print("ms of samples per output token:", {k: round(MS_PER_SAMPLE * samples[k][0] / tokens[k], 2) for k in names})
    keys = {f for k in names for f, c in samples[k][1].items() if c > 0.01 * samples[k][0]}
    rows = [(f, *[MS_PER_SAMPLE * samples[k][1][f] / tokens[k] for k in names]) for f in keys]
    for title, order in (("by cost", lambda r: -max(r[1:])), (f"by difference ({names[-1]} - {names[0]})",
                                                               lambda r: -(r[-1] - r[1]))):
        print(f"\n--- {title}")
        print("%-100s " % "function", "  ".join("%10s" % k for k in names))
        for r in sorted(rows, key=order)[:limit]:
            print("%-100s " % r[0][:100], "  ".join("%10.2f" % x for x in r[1:]))


if __name__ == "__main__":
    main()
