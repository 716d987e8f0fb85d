"""Acceptance math for speculative decoding of ragged draft chains (pure torch, no SGLang).

The worker scatters ragged target outputs into dense [R, G(+1), ...] tensors plus per-row verify lengths;
stop-token truncation stays with the worker.
"""

from .greedy import accept_greedy
from .rejection import accept_rejection
from .result import AcceptResult

__all__ = ["AcceptResult", "accept_greedy", "accept_rejection"]
