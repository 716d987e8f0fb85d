"""The per-request DSpark statistics record, built from the per-step values the worker emits.

Per step the worker emits, for each request: drafted (1 if a draft pass ran for it), verified (l_r: draft tokens the
target checked) and accepted (drafts accepted). Each step also commits one target token (the bonus), so
tau = (accepted + steps) / steps is the mean tokens per target forward, the paper's acceptance length.
It also emits source: where the step's verified drafts came from (index into SOURCE_NAMES: the drafter, prompt/output
lookup, the cross-request corpus; -1 when nothing was proposed for the request, and on fallback steps).
"""

from __future__ import annotations

from sglang_dspark.sglang_plugin.stats import SOURCE_NAMES

RAW_KEYS = ("dspark_drafted", "dspark_verified", "dspark_accepted")
VERIFY_LENS_KEY = "dspark_verify_lens"
SOURCE_KEY = "dspark_source"
_KEYS = (*RAW_KEYS, VERIFY_LENS_KEY, SOURCE_KEY)


def summarize(meta_info: dict) -> dict | None:
    """meta_info with the accumulated per-step lists -> the record (None when DSpark did not run)."""
    verified = meta_info.get("dspark_verified")
    if not verified:  # no decode step yet (or the request finished at prefill)
        return None
    accepted = meta_info.get("dspark_accepted") or []
    drafted = meta_info.get("dspark_drafted") or []
    steps = len(verified)
    record = {
        "verify_steps": steps,
        "draft_steps": int(sum(drafted)),
        "verified": int(sum(verified)),
        "accepted": int(sum(accepted)),
        "wasted": int(sum(verified)) - int(sum(accepted)),
        "mean_tau": round((sum(accepted) + steps) / steps, 4) if steps else None,
        "mean_verify_len": round(sum(verified) / steps, 4) if steps else None,
    }
    if VERIFY_LENS_KEY in meta_info:
        record["verify_lens"] = list(meta_info[VERIFY_LENS_KEY])
    by_source = _by_source(meta_info.get(SOURCE_KEY), verified, accepted)
    if by_source:
        record["by_source"] = by_source
    return record


def _by_source(sources, verified, accepted) -> dict | None:
    """{source name: {"steps", "verified", "accepted"}} over the steps whose drafts came from that source; sources
    with no step are left out. None when the steps carry no source (an older worker: lists of other lengths) or
    none had one (all -1)."""
    if not sources or len(sources) != len(verified) or len(accepted) != len(verified):
        return None
    out: dict[str, dict[str, int]] = {}
    for src, v, a in zip(sources, verified, accepted):
        if 0 <= src < len(SOURCE_NAMES):
            entry = out.setdefault(SOURCE_NAMES[src], {"steps": 0, "verified": 0, "accepted": 0})
            entry["steps"] += 1
            entry["verified"] += int(v)
            entry["accepted"] += int(a)
    return {name: out[name] for name in SOURCE_NAMES if name in out} or None


def accumulate(acc: dict, new_values: dict) -> None:
    """Append one output's new per-step values ({key: [..]}) to a request's running lists."""
    for key in _KEYS:
        if key in new_values:
            # Entries are per output token: the step's value on its first token, None on the others.
            acc.setdefault(key, []).extend(v for v in new_values[key] if v is not None)


def replace_raw_lists(meta_info: dict, acc: dict) -> None:
    """Swap the raw per-step lists in meta_info for the compact `dspark` record built from `acc` (the request's
    complete lists: SGLang's own accumulation restarts per chunk when streaming)."""
    for key in _KEYS:
        meta_info.pop(key, None)
    record = summarize(acc)
    if record is not None:
        meta_info["dspark"] = record
