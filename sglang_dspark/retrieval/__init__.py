"""Retrieval drafts: continuations copied from a request's own prompt and output (pure; no SGLang import)."""

from .lookup import suffix_continuation

__all__ = ["suffix_continuation"]
