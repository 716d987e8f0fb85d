"""bf16 serving on CPUs without bf16 dot products: narrow GEMMs on the bf16 weights, wide ones on fp32 copies.

On a CPU without AVX512-BF16 / AMX (the AVX2-only EPYC of BENCHMARKS "A second machine type"), torch's bf16 GEMM
costs in proportion to its rows: 8 rows of the embedded model's lm_head take 7.6x one row, 32 rows 30x. The fp32
GEMM on the same (exactly upcast) weights reads twice the bytes, so it loses for one row, but it batches: 8 rows
cost 3x one row. Which is cheaper depends on the row count, and it changes inside one server: plain decoding
at concurrency 1 is one row per layer call, a verify pass or a batch of 8 requests is 8 or more, a prefill
hundreds. So each GEMM shape gets a measured crossover row count, and every call takes the cheaper side.

The narrow side is our small-M kernel (dspark_kernels/cpu_bf16_gemm.py) where it builds: it reads the bf16 weights once
for all rows, so 8 rows cost 2-4x one row instead of 7.6x, and it beats fp32 up to ~32 rows; fp32 copies are then
kept only for shapes where fp32 still wins at some measured count (prefill widths). Without the kernel the narrow
side is torch's own bf16 GEMM.

On CPUs with native bf16 dot products (AVX512-BF16, AMX) torch's bf16 GEMM is the wide side instead: there the
narrow side is the AVX512-BF16 kernel (vdpbf16ps, bf16 inputs), which on an EPYC Zen 4 runs the embedded model's
one-row GEMMs in ~0.75x torch's time and eight rows in ~0.8x, and on CPUs with AMX the AMX kernel for every shape
that fits its tiles: flat in the row count up to 16 rows (a Xeon's 8-row gate_up in 0.66x torch's time, its
8-row lm_head in 0.69x); each shape's crossover to torch is measured the same way, and no fp32 copy is made.

Numerics: the fp32 side multiplies the same bf16 values (upcast exactly) with fp32 accumulation and rounds the
output to bf16, as torch's bf16 CPU GEMM also accumulates in fp32; outputs differ in summation order only, the
same class of difference bf16 batch variance already has. float32 models are never touched.

Memory: the fp32 copies cost twice the bf16 weights of every shape that has a crossover; the plan is refused
(with a log line, SGLang's own path kept) when that would leave less than a quarter of available memory.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sglang_dspark.cpu_features import has_native_bf16

logger = logging.getLogger(__name__)

CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32)


def kernel_calibration_rows(widest: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(widest.bit_length()))


# The kernel stays ahead of fp32 further out: on an EPYC Zen 3 the embedded model's gate_up crosses between 128
# and 256 rows and its down projection near 128, so counts reach prefill widths (--dspark-cpu-gemm-rows' default)
KERNEL_CALIBRATION_ROWS = kernel_calibration_rows(512)
SLOW_CALL_MS = 100.0  # a call this slow is timed once after its warm-up: the wide counts of the lm_head take seconds
MODES = ("auto", "on", "off")
FP32_ATTR = "_dspark_fp32_copy"
ROW_DISPATCH = "bf16-fp32-by-rows"  # narrow side: torch's bf16 GEMM
KERNEL_DISPATCH = "bf16-smallm-by-rows"  # narrow side: dspark_kernels/cpu_bf16_gemm.py
NATIVE_KERNEL_DISPATCH = "bf16dp-smallm-by-rows"  # native bf16 CPU: the AVX512-BF16 kernel, then torch's bf16 GEMM
NATIVE_AMX_KERNEL_DISPATCH = "bf16amx-smallm-by-rows"  # the same with the AMX kernel for the shapes it takes
NATIVE_KINDS = (NATIVE_KERNEL_DISPATCH, NATIVE_AMX_KERNEL_DISPATCH)
DP_KERNEL_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")
FORCED_CROSSOVER_ENV = "SGLANG_DSPARK_CPU_GEMM_CROSSOVER"  # tests: one crossover for every shape, nothing measured


def wants_row_dispatch(mode: str, cpu_flags: set[str] | None) -> bool:
    """auto: on when the CPU's flags are known and name no native bf16 dot product (the AVX2 kernel and fp32
    copies), or name AVX512-BF16 (its kernel before torch's bf16 GEMM); on / off: as said."""
    if mode not in MODES:
        raise ValueError(f"--dspark-cpu-gemm must be one of {', '.join(MODES)}; got {mode!r}")
    if mode != "auto":
        return mode == "on"
    return cpu_flags is not None and (not has_native_bf16(cpu_flags) or all(f in cpu_flags for f in DP_KERNEL_FLAGS))


def _median_ms(fn, reps: int) -> float:
    t0 = time.perf_counter()
    fn()
    if (time.perf_counter() - t0) * 1e3 > SLOW_CALL_MS:
        reps = 1
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure_crossover(weight: torch.Tensor, weight_fp32: torch.Tensor | None, rows=CALIBRATION_ROWS, reps: int = 3,
                      margin: float = 0.9, narrow=F.linear) -> tuple[int | None, dict]:
    """Smallest measured row count from which the wide GEMM beats the narrow bf16 one (`narrow(x, weight)`) by
    `margin` at it and every larger measured count; None if it never does. Also the timings. The wide GEMM is fp32
    on `weight_fp32` (input upcast and output downcast included), or torch's bf16 GEMM when `weight_fp32` is None."""
    timings = {}
    wins = []
    for r in rows:
        x = torch.randn(r, weight.shape[1], dtype=weight.dtype)
        t_bf16 = _median_ms(lambda: narrow(x, weight), reps)
        if weight_fp32 is None:
            t_wide = _median_ms(lambda: F.linear(x, weight), reps)
            timings[r] = dict(narrow_ms=round(t_bf16, 4), torch_bf16_ms=round(t_wide, 4))
        else:
            t_wide = _median_ms(lambda: F.linear(x.float(), weight_fp32).to(weight.dtype), reps)
            timings[r] = dict(bf16_ms=round(t_bf16, 4), fp32_ms=round(t_wide, 4))
        wins.append(t_wide < margin * t_bf16)
    crossover = None
    for i in range(len(rows) - 1, -1, -1):
        if not wins[i]:
            break
        crossover = rows[i]
    return crossover, timings


@dataclass
class RowDtypeGemm:
    """Per-shape crossovers and the dispatching linear. `crossovers[(out, in)]`: rows from which fp32 is used
    (None: never); below it `narrow` (the small-M kernel, or torch's bf16 GEMM) runs on the bf16 weight."""

    crossovers: dict[tuple[int, int], int | None] = field(default_factory=dict)
    narrow: Callable = F.linear
    kind: str = ROW_DISPATCH
    wide_fp32: bool = True  # False: torch's bf16 GEMM from the crossover on (native bf16 CPUs), no copies
    widest: int = CALIBRATION_ROWS[-1]  # the widest row count the crossovers were measured at

    def handles(self, weight: torch.Tensor | None) -> bool:
        return dispatchable(weight) and tuple(weight.shape) in self.crossovers

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        crossover = self.crossovers.get(tuple(weight.shape))
        if not self.wide_fp32:
            if crossover is not None and x.numel() >= crossover * x.shape[-1]:
                return F.linear(x, weight, bias)
            return self.narrow(x, weight, bias)
        w32 = getattr(weight, FP32_ATTR, None)
        if crossover is None or w32 is None or x.numel() < crossover * x.shape[-1]:
            return self.narrow(x, weight, bias)
        b32 = None if bias is None else bias.float()
        return F.linear(x.float(), w32, b32).to(x.dtype)

    def attach(self, weights: list[torch.Tensor]) -> int:
        """Give every weight whose shape has a crossover its fp32 copy; returns the bytes added."""
        added = 0
        if not self.wide_fp32:
            return 0
        for w in weights:
            if self.crossovers.get(tuple(w.shape)) is not None and getattr(w, FP32_ATTR, None) is None:
                copy = w.detach().float().contiguous()
                setattr(w, FP32_ATTR, copy)
                added += copy.numel() * copy.element_size()
        return added


def dispatchable(weight: torch.Tensor | None) -> bool:
    return (isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.dtype == torch.bfloat16
            and weight.device.type == "cpu")


def plan_for(weights: list[torch.Tensor], cache_path: str | None, cpu_key: str,
             available_bytes: int | None, forced_crossover: int | None = None,
             narrow: Callable | None = None, narrow_id: str = "",
             wide_bf16: bool = False, native_kind: str = NATIVE_KERNEL_DISPATCH,
             kernel_rows: tuple[int, ...] | None = None) -> tuple[RowDtypeGemm | None, str]:
    """Measure (or read from the cache) each distinct shape's crossover, attach fp32 copies; (None, reason) when
    there is nothing to gain. narrow: the small-M kernel (None: torch's bf16 GEMM), narrow_id: its build, part of
    the cache key (a rebuilt kernel is measured again). wide_bf16 (a CPU with native bf16): torch's bf16 GEMM is
    the wide side and no fp32 copy is made (native_kind names which kernel builds: the cost model is keyed by it);
    without a kernel there is then nothing to plan. With the kernel a plan with no
    fp32 copy still gains, and one whose copies do not fit in memory runs without them. forced_crossover (tests:
    the same path on any CPU) skips the measurement and the cache."""
    weights = [w for w in weights if dispatchable(w)]
    shapes = sorted({tuple(w.shape) for w in weights})
    if not shapes:
        return None, "no bf16 CPU linear weights"
    if wide_bf16 and narrow is None:
        return None, "no small-M kernel here, and torch's bf16 GEMM is native"
    kind, rows = ((ROW_DISPATCH, CALIBRATION_ROWS) if narrow is None
                  else (KERNEL_DISPATCH, kernel_rows or KERNEL_CALIBRATION_ROWS))
    kind = native_kind if wide_bf16 else kind
    narrow = narrow or F.linear
    # aten: the old key; the kernel kinds name their widest count, so widening the counts measures again
    cache_key = cpu_key if kind == ROW_DISPATCH else f"{cpu_key}; {kind} {narrow_id}".rstrip() + f"; to {rows[-1]} rows"
    cache = {} if forced_crossover is not None else _read_cache(cache_path, cache_key)
    crossovers = {}
    for shape in shapes:
        key = f"{shape[0]}x{shape[1]}"
        if forced_crossover is not None:
            crossovers[shape] = forced_crossover
            continue
        if key in cache:
            crossovers[shape] = cache[key]["crossover"]
            continue
        w = next(w for w in weights if tuple(w.shape) == shape)
        crossovers[shape], timings = measure_crossover(w, None if wide_bf16 else w.detach().float(), rows=rows,
                                                       narrow=narrow)
        cache[key] = dict(crossover=crossovers[shape], timings=timings)
    if forced_crossover is None:
        _write_cache(cache_path, cache_key, cache)
    if kind == ROW_DISPATCH and all(c is None for c in crossovers.values()):
        return None, "bf16 GEMMs are the cheaper side at every measured row count"
    if wide_bf16:
        if all(c == rows[0] for c in crossovers.values()):
            return None, "torch's bf16 GEMM is the cheaper side at every measured row count"
        gemm = RowDtypeGemm(crossovers, narrow, kind, wide_fp32=False, widest=rows[-1])
        summary = ", ".join(f"{o}x{i}: {'never' if c is None else f'>= {c} rows'}" for (o, i), c in crossovers.items())
        return gemm, f"AVX512-BF16 / AMX small-M kernel below the crossover; torch's bf16 GEMM from: {summary}"
    unique = {w.data_ptr(): w for w in weights if crossovers[tuple(w.shape)] is not None}  # tied lm_head once
    need = sum(w.numel() * 4 for w in unique.values())
    note = ""
    if available_bytes is not None and need > 0.75 * available_bytes:
        refusal = f"fp32 copies need {need / 2**30:.1f} GiB of the {available_bytes / 2**30:.1f} GiB available"
        if kind == ROW_DISPATCH:
            return None, refusal
        crossovers = dict.fromkeys(crossovers)  # the kernel alone, at every width
        note = f" ({refusal}: none kept)"
    gemm = RowDtypeGemm(crossovers, narrow, kind, widest=rows[-1])
    added = gemm.attach(weights)
    summary = ", ".join(f"{o}x{i}: {'never' if c is None else f'>= {c} rows'}" for (o, i), c in crossovers.items())
    side = "small-M kernel" if kind == KERNEL_DISPATCH else "torch bf16"
    return gemm, f"{side} below the crossover; fp32 copies {added / 2**30:.2f} GiB{note}; fp32 GEMM from: {summary}"


def _read_cache(path: str | None, cpu_key: str) -> dict:
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        return data.get(cpu_key, {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # a broken cache is re-measured, not fatal


def _write_cache(path: str | None, cpu_key: str, entries: dict) -> None:
    if not path:
        return
    try:
        data = {}
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
        data[cpu_key] = entries
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:
        logger.warning("cpu gemm: could not write the crossover cache %s (%s)", path, exc)


# ------------------------------------------------------------------------------------------ SGLang hooks

_ACTIVE: RowDtypeGemm | None = None


def _kernel():
    """The small-M kernel's linear, or None where it cannot be built here (the reason is logged once)."""
    from dspark_kernels import cpu_bf16_gemm

    return cpu_bf16_gemm.small_m_linear if cpu_bf16_gemm.available() else None


def _native_kind() -> str:
    from dspark_kernels import cpu_bf16_gemm

    return NATIVE_AMX_KERNEL_DISPATCH if cpu_bf16_gemm.load_amx()[0] is not None else NATIVE_KERNEL_DISPATCH


def _kernel_id() -> str:
    from dspark_kernels import cpu_bf16_gemm

    return cpu_bf16_gemm.build_id()


def _plan(weights: list[torch.Tensor], forced_crossover: int | None = None) -> tuple[RowDtypeGemm | None, str]:
    """plan_for with this process's crossover cache, CPU, free memory and narrow side (the kernel where it builds)."""
    from sglang_dspark.sglang_plugin import cost_profile
    from sglang_dspark.sglang_plugin.options import DSparkOptions

    flags = cost_profile.cpuinfo_field("flags")
    return plan_for(weights, str(cost_profile.CACHE_DIR.parent / "cpu_gemm.json"), cost_profile.cpu_identity(),
                    available_memory(), forced_crossover, _kernel(), _kernel_id(),
                    # the forced crossover (tests) pins the fp32-copy path on every CPU
                    wide_bf16=forced_crossover is None and bool(flags) and has_native_bf16(set(flags.split())),
                    native_kind=_native_kind(),
                    kernel_rows=kernel_calibration_rows(DSparkOptions.current().cpu_gemm_rows))


def predicted_gemm_kind(mode: str, cpu_flags: set[str] | None, dtype: str, cuda: bool) -> str:
    """What engine_gemm_kind() will say in the scheduler, as the launcher can tell before it starts (it cannot
    tell a plan refused for memory, or one with no shape to gain)."""
    if cuda or dtype not in ("bfloat16", "bf16") or not wants_row_dispatch(mode, cpu_flags):
        return "native"
    if cpu_flags is not None and has_native_bf16(cpu_flags):
        return _native_kind() if _kernel() is not None else "native"
    return KERNEL_DISPATCH if _kernel() is not None else ROW_DISPATCH


def cost_tag(kind: str, widest: int) -> str:
    """A GEMM kind as the cost model's key names it: the kernel kinds add their widest calibrated count, since
    widening the counts moves crossovers below verify widths (a verify pass then costs differently)."""
    return f"{kind} to {widest} rows" if kind in (KERNEL_DISPATCH, *NATIVE_KINDS) else kind


def engine_cost_tag() -> str:
    return "native" if _ACTIVE is None else cost_tag(_ACTIVE.kind, _ACTIVE.widest)


def engine_gemm_kind() -> str:
    """Which GEMM path the target runs (the drafter's dtype follows it); the cost model's key uses
    engine_cost_tag(), which adds the widest calibrated count."""
    return _ACTIVE.kind if _ACTIVE is not None else "native"


def _target_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """Weights of the unquantized linear layers and the lm_head (tied or not)."""
    out = []
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if type(method).__name__ == "UnquantizedLinearMethod" and not getattr(module, "use_intel_amx_backend", False):
            out.append(getattr(module, "weight", None))
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and not getattr(lm_head, "use_intel_amx_backend", False):
        out.append(getattr(lm_head, "weight", None))
    return [w for w in out if w is not None]


def after_load_model(result, model_runner, *args, **kwargs):
    """ModelRunner.load_model AFTER hook: plan the target's GEMMs when the options and the CPU ask for it."""
    global _ACTIVE
    from sglang_dspark.sglang_plugin import cost_profile
    from sglang_dspark.sglang_plugin.options import DSparkOptions

    model = getattr(model_runner, "model", None)
    if model is None or str(getattr(model_runner, "device", "")) != "cpu":
        return result
    flags = cost_profile.cpuinfo_field("flags")  # "" where unknown: auto then stays off
    if not wants_row_dispatch(DSparkOptions.current().cpu_gemm, set(flags.split()) if flags else None):
        return result
    forced = os.environ.get(FORCED_CROSSOVER_ENV)
    gemm, reason = _plan(_target_weights(model), int(forced) if forced else None)
    _ACTIVE = gemm
    logger.info("dspark cpu gemm: %s", reason if gemm else f"off ({reason})")
    return result


def available_memory() -> int | None:
    try:
        import psutil

        return psutil.virtual_memory().available
    except ImportError:
        return None


def route_drafter(drafter: torch.nn.Module) -> str:
    """Send a bf16 drafter's GEMMs (its nn.Linear layers, the reduced lm_head and Markov W2) through a plan of
    their own: the small-M kernel below each shape's crossover, fp32 copies above it. A draft pass is R x gamma
    rows, the kernel's range; an fp32 drafter spent 29 of its 44 ms per pass in the reduced lm_head alone.
    Returns the plan's log line; leaves the drafter as it is when there is no plan."""
    if _kernel() is None:
        return "off (no small-M kernel here)"
    linears = [m for m in drafter.modules() if type(m) is torch.nn.Linear]
    markov = getattr(drafter, "markov_head", None)
    # the reduced-vocabulary rows the serving path multiplies by (set_draft_vocab), beside the modules' weights
    functional = {"draft_lm_head_linear": (drafter, getattr(drafter, "_draft_lm_head", None)),
                  "w2_linear": (markov, getattr(drafter, "_draft_w2", None))}
    weights = [m.weight for m in linears] + [w for _, w in functional.values() if w is not None]
    gemm, reason = _plan(weights)
    if gemm is None:
        return f"off ({reason})"
    for m in linears:
        if gemm.handles(m.weight):
            m.forward = functools.partial(_module_linear, gemm, m)
    for attr, (owner, w) in functional.items():
        if owner is not None and w is not None and gemm.handles(w):
            setattr(owner, attr, gemm.linear)
    return reason


def _module_linear(gemm: RowDtypeGemm, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != module.weight.dtype:
        return F.linear(x, module.weight, module.bias)
    return gemm.linear(x, module.weight, module.bias)


def around_linear_apply(original, method, layer, x, bias=None, *args, **kwargs):
    """UnquantizedLinearMethod.apply: the cheaper dtype for this call's row count."""
    gemm = _ACTIVE
    if gemm is None or args or kwargs or getattr(layer, "use_intel_amx_backend", False):
        return original(method, layer, x, bias, *args, **kwargs)
    weight = getattr(layer, "weight", None)
    if not gemm.handles(weight) or x.dtype != weight.dtype:
        return original(method, layer, x, bias)
    return gemm.linear(x, weight, bias)


def around_compute_lm_head(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    """LogitsProcessor._compute_lm_head: same as its plain-weight CPU branch, through the dispatching linear."""
    gemm = _ACTIVE
    weight = getattr(lm_head, "weight", None)
    plain = (gemm is not None and gemm.handles(weight) and not hidden_states.is_cuda
             and not hasattr(lm_head, "set_lora") and not getattr(processor, "use_fp32_lm_head", False)
             and getattr(processor, "rl_on_policy_target", None) is None
             and not getattr(lm_head, "use_intel_amx_backend", False))
    if plain:
        from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

        plain = not should_apply_lm_head_quant_method(lm_head, getattr(lm_head, "quant_method", None))
    if not plain:
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    return gemm.linear(hidden_states.to(weight.dtype), weight)


def register(HookRegistry, HookType) -> None:
    HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.load_model", after_load_model,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
                          around_linear_apply, HookType.AROUND)
    HookRegistry.register("sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
                          around_compute_lm_head, HookType.AROUND)
