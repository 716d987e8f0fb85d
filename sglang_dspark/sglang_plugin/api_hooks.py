"""Expose the per-request DSpark record: `meta_info["dspark"]` on /generate, a `dspark` field on OpenAI responses.

The extra top-level field is ignored by standard OpenAI clients (the `openai` package keeps it in `model_extra`).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict

from sglang_dspark.metrics.prometheus import on_request_meta_info
from sglang_dspark.metrics.request_stats import accumulate, replace_raw_lists

logger = logging.getLogger(__name__)

# Latest record per request id, for the streaming usage chunk (which SGLang builds without meta_info at hand).
_LATEST: "OrderedDict[str, dict]" = OrderedDict()
_LATEST_MAX = 4096


DSPARK_PREFIX = "dspark_"


def _remember(meta_info: dict) -> None:
    rid = meta_info.get("id")
    if rid is not None and "dspark" in meta_info:
        _LATEST[rid] = meta_info["dspark"]
        _LATEST.move_to_end(rid)
        while len(_LATEST) > _LATEST_MAX:
            _LATEST.popitem(last=False)


def _inject_into_usage_chunk(chunk: str) -> str:
    if not chunk.startswith("data: {") or '"usage"' not in chunk:
        return chunk
    try:
        data = json.loads(chunk[len("data: "):])
    except ValueError:
        return chunk
    if data.get("choices") or not data.get("usage"):
        return chunk
    record = _LATEST.pop(data.get("id"), None)
    if not record:
        return chunk
    data["dspark"] = record
    return "data: " + json.dumps(data) + "\n\n"


def around_collect_customized_info(original, self, i, req, logits_output, *args, **kwargs):
    """SGLang slices customized_info per output TOKEN when streaming; ours is per step. The worker emits, per
    request, one entry per token the step commits ([value, None, ...]; prefill: [None]), and here we extend instead
    of append, so entries stay aligned with tokens and every step value reaches exactly one streamed chunk."""
    info = getattr(logits_output, "customized_info", None) if logits_output is not None else None
    ours = {k: v for k, v in (info or {}).items() if k.startswith(DSPARK_PREFIX)}
    if not ours:
        return original(self, i, req, logits_output, *args, **kwargs)
    logits_output.customized_info = {k: v for k, v in info.items() if k not in ours} or None
    try:
        result = original(self, i, req, logits_output, *args, **kwargs)
    finally:
        logits_output.customized_info = info
    if req.customized_info is None:
        req.customized_info = {}
    for k, v in ours.items():
        req.customized_info.setdefault(k, []).extend(v[i])
    return result


async def around_stream(original, *args, **kwargs):
    async for chunk in original(*args, **kwargs):
        yield _inject_into_usage_chunk(chunk) if isinstance(chunk, str) else chunk


def after_update_request_meta_info(result, self, meta_info, state, customized_info, index, *args, **kwargs):
    try:
        _update_meta_info(self, meta_info, state, customized_info, index, *args, **kwargs)
    except Exception:  # statistics must never take the serving path down
        logger.exception("DSPARK_EXT: per-request statistics failed for one output")
    return result


def _update_meta_info(self, meta_info, state, customized_info, index, *args, **kwargs):
    acc = state.__dict__.setdefault("_dspark_acc", {})
    accumulate(acc, {k: v[index] for k, v in customized_info.items()})
    replace_raw_lists(meta_info, acc)
    _remember(meta_info)
    # args = (state, customized_info, index, finish_reason): at the finish, observe the request's tau on /metrics
    on_request_meta_info(self, meta_info, args[0] if args else kwargs.get("finish_reason"))


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
    for item in ret:
        _LATEST.pop(item.get("meta_info", {}).get("id"), None)
    return _with_dspark(result, _records(ret))


def register(HookRegistry, HookType) -> None:
    HookRegistry.register("sglang.srt.managers.scheduler_components.batch_result_processor."
                          "SchedulerBatchResultProcessor._maybe_collect_customized_info",
                          around_collect_customized_info, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info",
                          after_update_request_meta_info, HookType.AFTER)
    HookRegistry.register("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response",
                          after_build_response, HookType.AFTER)
    HookRegistry.register("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_chat_stream",
                          around_stream, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._generate_completion_stream",
        around_stream, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_completion_response",
        after_build_response, HookType.AFTER)
