"""The target's attention during DSPARK_EXT verify forwards on SGLang's torch_native backend (the CPU default).

SGLang's torch_native EXTEND pads each request's query to its whole KV length (dspark_kernels/cpu_verify_attention.py says
why that dominates a verify step on a CPU). While the worker runs a verify forward it switches the backend to
`chain_attention_sdpa`; prefill and plain decode keep SGLang's own code. The backend object is re-classed in place
(not rebuilt) so every reference SGLang holds to it - forward batches, CUDA-graph runners - stays valid.
"""

from __future__ import annotations

from contextlib import contextmanager

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from dspark_kernels.cpu_verify_attention import chain_attention_sdpa


class TorchNativeChainVerifyBackend(TorchNativeAttnBackend):
    chain_verify = False  # True only inside `verify_attention(...)`

    def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                                 enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
        windowed = sliding_window_size is not None and sliding_window_size > -1
        if not self.chain_verify or encoder_lens is not None or is_cross_attn or not causal or windowed:
            return super()._run_sdpa_forward_extend(
                query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens,
                extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
        return chain_attention_sdpa(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                    extend_seq_lens, scale=scaling)


def install_chain_verify(backend) -> bool:
    """Re-class a plain TorchNativeAttnBackend; False (nothing changed) for any other backend."""
    if type(backend) is not TorchNativeAttnBackend:
        return False
    backend.__class__ = TorchNativeChainVerifyBackend
    return True


@contextmanager
def verify_attention(backend):
    if not isinstance(backend, TorchNativeChainVerifyBackend):
        yield
        return
    backend.chain_verify = True
    try:
        yield
    finally:
        backend.chain_verify = False
