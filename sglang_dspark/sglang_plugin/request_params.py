"""Per-request DSpark parameters, carried in SGLang's `sampling_params.custom_params` (OpenAI: `extra_body`).

  custom_params = {"dspark_min_user_tps": 12.0}   # SLA floor for this request (tokens/s); overrides
                                                   # --dspark-min-user-tps; 0 = no floor for this request
  custom_params = {"dspark_draft_temperature": 0.5}  # overrides --dspark-draft-temperature for this request:
                                                   # a number >= 0, or "request" (its own temperature)
  custom_params = {"dspark_max_verify": 0}         # at most this many drafts verified per step for this request;
                                                   # 0 = no speculation for it (it is not drafted for either)
  custom_params = {"dspark_retrieval": "prompt"}   # retrieval drafts for this request: off, prompt (its own prompt /
                                                   # output), corpus (recent outputs of all requests) or both;
                                                   # overrides --dspark-retrieval
Validated where SGLang validates sampling parameters (tokenizer process), so a bad value is an HTTP 400.
"""

from __future__ import annotations

import math

import torch

SLA_KEY = "dspark_min_user_tps"
DRAFT_TEMPERATURE_KEY = "dspark_draft_temperature"
MAX_VERIFY_KEY = "dspark_max_verify"
RETRIEVAL_KEY = "dspark_retrieval"
RETRIEVAL_MODES = ("off", "prompt", "corpus", "both")
REQUEST = "request"


def _param(key: str, custom_params):
    """The request's value for `key` (None when absent or when custom_params is not a dict)."""
    return custom_params.get(key) if isinstance(custom_params, dict) else None


def _request_param(req, key: str):
    return _param(key, getattr(getattr(req, "sampling_params", None), "custom_params", None))


def _nonnegative_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def validate(custom_params) -> None:
    value = _param(SLA_KEY, custom_params)
    if value is None:
        return
    if not _nonnegative_number(value):
        raise ValueError(f"custom_params.{SLA_KEY} must be a finite number >= 0 (tokens/s), got {value!r}")


def validate_draft_temperature(custom_params) -> None:
    value = _param(DRAFT_TEMPERATURE_KEY, custom_params)
    if value is None or value == REQUEST:
        return
    if not _nonnegative_number(value):
        raise ValueError(f"custom_params.{DRAFT_TEMPERATURE_KEY} must be a number >= 0 or {REQUEST!r}, got {value!r}")


def validate_max_verify(custom_params) -> None:
    value = _param(MAX_VERIFY_KEY, custom_params)
    if value is None:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        raise ValueError(f"custom_params.{MAX_VERIFY_KEY} must be an integer >= 0, got {value!r}")


def validate_retrieval(custom_params) -> None:
    value = _param(RETRIEVAL_KEY, custom_params)
    if value is None:
        return
    if value not in RETRIEVAL_MODES:
        raise ValueError(f"custom_params.{RETRIEVAL_KEY} must be one of {', '.join(RETRIEVAL_MODES)}, got {value!r}")


def after_sampling_params_verify(result, self, *args, **kwargs):
    custom = getattr(self, "custom_params", None)
    validate(custom)
    validate_draft_temperature(custom)
    validate_max_verify(custom)
    validate_retrieval(custom)
    return result


def verify_caps(reqs) -> torch.Tensor | None:
    """Long[R] per-request caps on the verify length (-1 = none), or None when no request sets one."""
    caps = [_request_param(req, MAX_VERIFY_KEY) for req in reqs]
    if all(c is None for c in caps):
        return None
    return torch.tensor([-1 if c is None else int(c) for c in caps], dtype=torch.int64)


def request_floors(reqs, server_floor: float | None) -> torch.Tensor | None:
    """Float[R] SLA floors for a batch (NaN = none), or None when no request has one."""
    floors = []
    for req in reqs:
        own = _request_param(req, SLA_KEY)
        value = server_floor if own is None else float(own)
        floors.append(float("nan") if not value else float(value))
    if all(math.isnan(f) for f in floors):
        return None
    return torch.tensor(floors, dtype=torch.float64)


def draft_temperature_caps(reqs, server_cap: float | None) -> torch.Tensor:
    """Float64[R]: the temperature each request's drafts may be sampled at, at most (inf = its own temperature)."""
    caps = []
    for req in reqs:
        own = _request_param(req, DRAFT_TEMPERATURE_KEY)
        value = server_cap if own is None else (None if own == REQUEST else float(own))
        caps.append(math.inf if value is None else value)
    return torch.tensor(caps, dtype=torch.float64)


def retrieval_modes(reqs, server_mode: str) -> list[str]:
    """Per request: which retrieval sources may draft for it (its custom_params, else the server's flag)."""
    return [_request_param(req, RETRIEVAL_KEY) or server_mode for req in reqs]


def register(HookRegistry, HookType) -> None:
    HookRegistry.register("sglang.srt.sampling.sampling_params.SamplingParams.verify",
                          after_sampling_params_verify, HookType.AFTER)
