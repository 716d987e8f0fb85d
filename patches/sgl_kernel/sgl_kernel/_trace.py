"""Opt-in call log: with SGL_KERNEL_STANDIN_TRACE=<file>, the first call of each op in
each process appends "<pid> <op>" to <file>. Tests use it as evidence of which ops a
serving path really ran."""

from __future__ import annotations

import functools
import os

_TRACE_FILE = os.environ.get("SGL_KERNEL_STANDIN_TRACE")
_seen: set[str] = set()


def traced(fn):
    if not _TRACE_FILE:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if fn.__name__ not in _seen:
            _seen.add(fn.__name__)
            with open(_TRACE_FILE, "a") as f:
                f.write(f"{os.getpid()} {fn.__name__}\n")
        return fn(*args, **kwargs)

    return wrapper
