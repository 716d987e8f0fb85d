"""SGLang's torch rotary path on CPU through one C call (dspark_kernels/cpu_rotary.py), same bits.

RotaryEmbedding.forward_cpu falls back to forward_native where SGLang's own CPU kernels are not built (this
project's CPU install): ~30 small ops per layer call, 10.8 ms of a ~98 ms plain decode step of the embedded model
on a 2-core Xeon. The AROUND hook takes only the base class's own neox-style path with nothing it does not
handle (no offsets, no fused KV store, no precomputed sin_cos_cache); everything else, and every call the kernel
declines, runs SGLang's code.
"""

from __future__ import annotations

import os

DISABLE_ENV = "SGLANG_DSPARK_NO_CPU_ROTARY"  # any non-empty value: SGLang's torch path


def around_forward_native(original, rope, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    if (offsets is None and fused_set_kv_buffer_arg is None and rope.is_neox_style
            and not hasattr(rope, "sin_cos_cache") and not query.is_cuda and not os.environ.get(DISABLE_ENV)):
        from dspark_kernels.cpu_rotary import rotary_neox

        out = rotary_neox(positions, query, key, rope.cos_sin_cache, rope.head_size, rope.rotary_dim)
        if out is not None:
            return out
    return original(rope, positions, query, key, offsets, fused_set_kv_buffer_arg)


def register(HookRegistry, HookType) -> None:
    HookRegistry.register("sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward_native",
                          around_forward_native, HookType.AROUND)
