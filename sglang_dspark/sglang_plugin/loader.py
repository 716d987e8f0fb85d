"""Entry point of the `sglang.srt.plugins` group: SGLang calls `load()` early in every process.

It must stay cheap: it only registers hooks by dotted path and the DSPARK_EXT algorithm factory; the worker module
is imported lazily when SGLang asks for the worker class.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_loaded = False


def _after_add_cli_args(result, parser, *args, **kwargs):
    from sglang_dspark.sglang_plugin.options import add_dspark_args, add_launcher_args

    add_dspark_args(parser)
    add_launcher_args(parser)
    return result


def _around_from_cli_args(original, *args, **kwargs):
    from sglang_dspark.sglang_plugin.options import options_from_namespace

    ns = args[-1] if args else kwargs["args"]
    options_from_namespace(ns).export()
    return original(*args, **kwargs)


def load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.server_args.ServerArgs.add_cli_args", _after_add_cli_args, HookType.AFTER
    )
    HookRegistry.register(
        "sglang.srt.server_args.ServerArgs.from_cli_args", _around_from_cli_args, HookType.AROUND
    )
    from sglang_dspark.sglang_plugin import api_hooks, cpu_decode_attention, cpu_gemm, cpu_rotary, request_params
    from sglang_dspark.sglang_plugin.registration import register_algorithm

    api_hooks.register(HookRegistry, HookType)
    request_params.register(HookRegistry, HookType)
    cpu_gemm.register(HookRegistry, HookType)
    cpu_rotary.register(HookRegistry, HookType)
    cpu_decode_attention.register(HookRegistry, HookType)
    register_algorithm()
