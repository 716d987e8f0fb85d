"""Per-request DSpark parameters, carried in SGLang's `sampling_params.custom_params` (OpenAI: `extra_body`).

  custom_params = {"dspark_min_user_tps": 12.0}   # SLA floor for this request (tokens/s); overrides
                                                   # --dspark-min-user-tps; 0 = no floor for this request
  custom_params = {"dspark_draft_temperature": 0.5}  # overrides --dspark-draft-temperature for this request:
                                                   # a number >= 0, or "request" (its own temperature)
Validated where SGLang validates sampling parameters (tokenizer process), so a bad value is an HTTP 400.
"""

from __future__ import annotations

import math

import torch

SLA_KEY = "dspark_min_user_tps"
DRAFT_TEMPERATURE_KEY = "dspark_draft_temperature"
REQUEST = "request"


def _floor_of(custom_params) -> float | None:
    if not isinstance(custom_params, dict) or SLA_KEY not in custom_params:
        return None
    return custom_params[SLA_KEY]


def validate(custom_params) -> None:
    value = _floor_of(custom_params)
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"custom_params.{SLA_KEY} must be a finite number >= 0 (tokens/s), got {value!r}")


def _draft_temperature_of(custom_params):
    if not isinstance(custom_params, dict) or DRAFT_TEMPERATURE_KEY not in custom_params:
        return None
    return custom_params[DRAFT_TEMPERATURE_KEY]


def validate_draft_temperature(custom_params) -> None:
    value = _draft_temperature_of(custom_params)
    if value is None or value == REQUEST:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"custom_params.{DRAFT_TEMPERATURE_KEY} must be a number >= 0 or {REQUEST!r}, got {value!r}")


def after_sampling_params_verify(result, self, *args, **kwargs):
    validate(getattr(self, "custom_params", None))
    validate_draft_temperature(getattr(self, "custom_params", None))
    return result


def request_floors(reqs, server_floor: float | None) -> torch.Tensor | None:
    """Float[R] SLA floors for a batch (NaN = none), or None when no request has one."""
    floors = []
    for req in reqs:
        own = _floor_of(getattr(getattr(req, "sampling_params", None), "custom_params", None))
        value = server_floor if own is None else float(own)
        floors.append(float("nan") if not value else float(value))
    if all(math.isnan(f) for f in floors):
        return None
    return torch.tensor(floors, dtype=torch.float64)


def draft_temperature_caps(reqs, server_cap: float | None) -> torch.Tensor:
    """Float64[R]: the temperature each request's drafts may be sampled at, at most (inf = its own temperature)."""
    caps = []
    for req in reqs:
        own = _draft_temperature_of(getattr(getattr(req, "sampling_params", None), "custom_params", None))
        value = server_cap if own is None else (None if own == REQUEST else float(own))
        caps.append(math.inf if value is None else value)
    return torch.tensor(caps, dtype=torch.float64)


def register(HookRegistry, HookType) -> None:
    HookRegistry.register("sglang.srt.sampling.sampling_params.SamplingParams.verify",
                          after_sampling_params_verify, HookType.AFTER)
