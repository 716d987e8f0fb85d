"""Triton / FlashInfer kernels for DSpark, each beside the torch reference it is tested against.

Import note: set TRITON_INTERPRET=1 BEFORE importing this package to run the Triton kernels on CPU tensors
(tests do); the kernels are decorated at import time.
"""

from dspark_kernels._rng import HAS_TRITON
from dspark_kernels.flashinfer_verify import (
    HAS_FLASHINFER,
    FlashInferRaggedVerify,
    kv_indptr_from_lens,
    ragged_verify_attention,
    ragged_verify_attention_reference,
    ragged_verify_attention_triton,
)
from dspark_kernels.flashinfer_static_verify import FlashInferStaticVerify, static_verify_layout
from dspark_kernels.markov_sampler import (
    GREEDY_EPS,
    MarkovSample,
    markov_sample,
    markov_sample_reference,
    markov_sample_triton,
)
from dspark_kernels.ragged_accept import ragged_accept, ragged_accept_reference, ragged_accept_triton

__all__ = [
    "GREEDY_EPS",
    "HAS_FLASHINFER",
    "HAS_TRITON",
    "FlashInferRaggedVerify",
    "FlashInferStaticVerify",
    "MarkovSample",
    "kv_indptr_from_lens",
    "markov_sample",
    "markov_sample_reference",
    "markov_sample_triton",
    "ragged_accept",
    "ragged_accept_reference",
    "ragged_accept_triton",
    "ragged_verify_attention",
    "ragged_verify_attention_reference",
    "ragged_verify_attention_triton",
    "static_verify_layout",
]
