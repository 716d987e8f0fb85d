"""Opt-in torch.profiler capture of a window of DSPARK_EXT decode steps, for finding where a step's time goes.

    SGLANG_DSPARK_PROFILE=/path/prefix SGLANG_DSPARK_PROFILE_STEPS=200:240 python -m sglang_dspark.launch_server ...

profiles decode steps 200..239 (counted from server start; set the start past the cost-profiling steps) and
writes /path/prefix.<pid>.txt: operator totals sorted by self CPU time, grouped by the worker's record_function
ranges (dspark.draft, dspark.verify_forward, dspark.accept, ...). No cost when the variable is unset.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext

SECTIONS_TAG = "DSPARK_SECTIONS"  # the line after the table: {range: {cpu_total_ms, calls}} as JSON


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
            averages = self._prof.key_averages()
            table = averages.table(sort_by="self_cpu_time_total", row_limit=60)
            # every dspark.* range, however small its self time (the table keeps only the top 60 rows)
            ranges = {e.key: {"cpu_total_ms": e.cpu_time_total / 1e3, "calls": e.count}
                      for e in averages if e.key.startswith("dspark.")}
            path = f"{self.prefix}.{os.getpid()}.txt"
            with open(path, "w") as f:
                f.write(f"decode steps {self.start}..{self.stop - 1}\n{table}\n")
                f.write(f"{SECTIONS_TAG} {json.dumps(ranges)}\n")
            self._prof = None
            self.start = -1  # once


def section(name: str, enabled: bool):
    if not enabled:
        return nullcontext()
    from torch.profiler import record_function

    return record_function(name)


def install_module_sections(model_runner) -> int:
    """Wrap the target's decoder sub-modules, the forward-batch set-up and the attention metadata in record_function
    ranges (dspark.mod.<name>, dspark.sglang.<name>) so a profile splits a forward into its parts, plain and verify
    alike. Only called when profiling: each range costs a few microseconds. Returns how many callables it wrapped."""
    from torch.profiler import record_function

    def wrap(fn, name):
        def ranged(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return ranged

    wrapped = 0
    layers = getattr(getattr(model_runner.model, "model", None), "layers", None) or []
    for layer in layers:
        for path, module in layer.named_modules():
            if path and path.count(".") <= 1:  # self_attn, self_attn.qkv_proj, ..., mlp.down_proj, the norms
                module.forward = wrap(module.forward, f"dspark.mod.{path.split('.')[-1]}")
                wrapped += 1
    backend = model_runner.attn_backend
    backend.init_forward_metadata = wrap(backend.init_forward_metadata, "dspark.sglang.attn_metadata")
    logits = getattr(model_runner.model, "logits_processor", None)
    if logits is not None:
        logits.forward = wrap(logits.forward, "dspark.sglang.logits_processor")
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    init_new = ForwardBatch.init_new.__func__
    ForwardBatch.init_new = classmethod(wrap(init_new, "dspark.sglang.forward_batch_init"))
    return wrapped + 3
