"""Retrieval drafts: continuations copied from a request's own prompt and output, from recent outputs of other
requests, or from a static n-gram table of the target's own answers, with calibrated per-position confidences
(pure; no SGLang import)."""

from .confidence import RetrievalConfidence
from .lookup import Candidate, prompt_candidate, suffix_continuation
from .ngram_table import NgramTable

__all__ = ["Candidate", "NgramTable", "RetrievalConfidence", "prompt_candidate", "suffix_continuation"]
