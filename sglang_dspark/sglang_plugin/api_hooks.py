"""Expose the per-request DSpark record: `meta_info["dspark"]` on /generate, a `dspark` field on OpenAI responses.

The extra top-level field is ignored by standard OpenAI clients (the `openai` package keeps it in `model_extra`).
"""

from __future__ import annotations

from sglang_dspark.metrics.prometheus import on_request_meta_info
from sglang_dspark.metrics.request_stats import replace_raw_lists


def after_update_request_meta_info(result, self, meta_info, *args, **kwargs):
    replace_raw_lists(meta_info)
    # args = (state, customized_info, index, finish_reason): at the finish, observe the request's tau on /metrics
    on_request_meta_info(self, meta_info, args[3] if len(args) > 3 else kwargs.get("finish_reason"))
    return result


def _records(ret) -> dict | list | None:
    recs = [item.get("meta_info", {}).get("dspark") for item in ret]
    recs = [r for r in recs if r is not None]
    if not recs:
        return None
    return recs[0] if len(recs) == 1 else recs


def _with_dspark(response, record):
    if record is None or not hasattr(response, "model_dump"):
        return response
    base = type(response)
    ext = _EXTENDED.get(base)
    if ext is None:
        from pydantic import create_model

        ext = create_model(f"DSpark{base.__name__}", __base__=base, dspark=(dict | list | None, None))
        _EXTENDED[base] = ext
    return ext.model_construct(**dict(response), dspark=record)


_EXTENDED: dict[type, type] = {}


def after_build_response(result, self, request, ret, *args, **kwargs):
    return _with_dspark(result, _records(ret))


def register(HookRegistry, HookType) -> None:
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info",
                          after_update_request_meta_info, HookType.AFTER)
    HookRegistry.register("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response",
                          after_build_response, HookType.AFTER)
    HookRegistry.register(
        "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_completion_response",
        after_build_response, HookType.AFTER)
