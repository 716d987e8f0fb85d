"""Opt-in torch.profiler capture of a window of DSPARK_EXT decode steps, for finding where a step's time goes.

    SGLANG_DSPARK_PROFILE=/path/prefix SGLANG_DSPARK_PROFILE_STEPS=200:240 python -m sglang_dspark.launch_server ...

profiles decode steps 200..239 (counted from server start; set the start past the cost-profiling steps) and
writes /path/prefix.<pid>.txt: operator totals sorted by self CPU time, grouped by the worker's record_function
ranges (dspark.draft, dspark.verify_forward, dspark.accept, ...). No cost when the variable is unset.
"""

from __future__ import annotations

import os
from contextlib import nullcontext


class StepProfiler:
    def __init__(self, prefix: str | None, window: str | None):
        self.prefix = prefix
        self.start, self.stop = (int(x) for x in (window or "200:240").split(":"))
        self.step = 0
        self._prof = None

    @classmethod
    def from_env(cls) -> "StepProfiler | None":
        prefix = os.environ.get("SGLANG_DSPARK_PROFILE")
        return cls(prefix, os.environ.get("SGLANG_DSPARK_PROFILE_STEPS")) if prefix else None

    def before_step(self) -> None:
        if self.step == self.start and self._prof is None:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
            self._prof.__enter__()

    def after_step(self) -> None:
        self.step += 1
        if self._prof is not None and self.step >= self.stop:
            self._prof.__exit__(None, None, None)
            table = self._prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60)
            path = f"{self.prefix}.{os.getpid()}.txt"
            with open(path, "w") as f:
                f.write(f"decode steps {self.start}..{self.stop - 1}\n{table}\n")
            self._prof = None
            self.start = -1  # once


def section(name: str, enabled: bool):
    if not enabled:
        return nullcontext()
    from torch.profiler import record_function

    return record_function(name)
