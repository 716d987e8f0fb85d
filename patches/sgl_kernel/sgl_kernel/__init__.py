"""CPU stand-in for `sgl_kernel`, written in torch (sglang_dspark CI only).

No CPU build of sgl-kernel exists on PyPI, yet SGLang 0.5.23's CPU engine
imports it unconditionally. This package provides, with real semantics, the
ops that plain serving (torch_native) and speculative decoding on the
intel_amx backend use; see README.md for the list and the verified paths.

Any other public name still imports (sglang imports many names on paths it
never runs) but raises NotImplementedError naming the op when called, so a
missing op on a live path is loud rather than silently wrong. Submodules other
than `speculative` do not exist: sglang relies on ImportError from e.g.
`sgl_kernel.scalar_type` to pick its own fallbacks.
"""

from __future__ import annotations

from sgl_kernel import attention as _attention  # noqa: F401  registers torch.ops.sgl_kernel.*
from sgl_kernel.kvcache import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu
from sgl_kernel.spec_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)
from sgl_kernel import speculative  # noqa: E402  (real submodule)
from sgl_kernel._trace import traced

# Wrapped here (not in the defining modules) so the unit tests can call the raw functions.
for _name in (
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
):
    globals()[_name] = traced(globals()[_name])

__version__ = "0.0.0+cpu.standin"
IS_CPU_STANDIN = True  # lets tooling tell this package from the real CUDA one


class MissingOp:
    """Placeholder for an op this stand-in does not implement: fails when called."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{self.__name__} is not implemented by the sglang_dspark CPU stand-in "
            "(patches/sgl_kernel); add a torch version and a test if this path is needed"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in: missing op {self.__name__}>"


def __getattr__(name: str):
    # Dunder/private lookups (e.g. __path__ probes, pickling) must stay AttributeError.
    if name.startswith("_"):
        raise AttributeError(name)
    op = MissingOp(name)
    globals()[name] = op
    return op
