"""Retrieval drafts: continuations copied from a request's own prompt and output, or from recent outputs of other
requests, with calibrated per-position confidences (pure; no SGLang import)."""

from .confidence import RetrievalConfidence
from .lookup import Candidate, prompt_candidate, suffix_continuation

__all__ = ["Candidate", "RetrievalConfidence", "prompt_candidate", "suffix_continuation"]
