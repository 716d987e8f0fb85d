"""The per-request DSpark statistics record, built from the per-step values the worker emits.

Per step the worker emits, for each request: drafted (1 if a draft pass ran for it), verified (l_r: draft tokens the
target checked) and accepted (drafts accepted). Each step also commits one target token (the bonus), so
tau = (accepted + steps) / steps is the mean tokens per target forward, the paper's acceptance length.
"""

from __future__ import annotations

RAW_KEYS = ("dspark_drafted", "dspark_verified", "dspark_accepted")
VERIFY_LENS_KEY = "dspark_verify_lens"


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
    return record


def accumulate(acc: dict, new_values: dict) -> None:
    """Append one output's new per-step values ({key: [..]}) to a request's running lists."""
    for key in (*RAW_KEYS, VERIFY_LENS_KEY):
        if key in new_values:
            # Entries are per output token: the step's value on its first token, None on the others.
            acc.setdefault(key, []).extend(v for v in new_values[key] if v is not None)


def replace_raw_lists(meta_info: dict, acc: dict) -> None:
    """Swap the raw per-step lists in meta_info for the compact `dspark` record built from `acc` (the request's
    complete lists: SGLang's own accumulation restarts per chunk when streaming)."""
    for key in (*RAW_KEYS, VERIFY_LENS_KEY):
        meta_info.pop(key, None)
    record = summarize(acc)
    if record is not None:
        meta_info["dspark"] = record
