"""Chat rendering and the assistant loss mask (reference §4.2).

The assistant header and turn end are read off the tokenizer's own chat template with a probe conversation
(ChatML: "<|im_start|>assistant\\n" and "<|im_end|>\\n"), so the same code serves Qwen2/Qwen3/Llama-3 style templates.
loss_mask = 1 on every token from just after an assistant header through that turn's end marker (inclusive).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
_PROBE_USER, _PROBE_ASSISTANT = "PROBEUSER7", "PROBEASSISTANT7"


@dataclass
class TemplateMarkers:
    assistant_header: str
    turn_end: str


def template_markers(tokenizer) -> TemplateMarkers:
    user = [{"role": "user", "content": _PROBE_USER}]
    plain = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False)
    with_gen = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": _PROBE_ASSISTANT}],
                                         tokenize=False, add_generation_prompt=False)
    if not with_gen.startswith(plain) or len(with_gen) == len(plain):
        raise ValueError("cannot derive the assistant header from the chat template")
    end = full[full.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
    if not end:
        raise ValueError("cannot derive the assistant turn end from the chat template")
    return TemplateMarkers(assistant_header=with_gen[len(plain):], turn_end=end)


def with_system_prompt(messages: list[dict], system_prompt: str | None = DEFAULT_SYSTEM_PROMPT) -> list[dict]:
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    if system_prompt and not any(m["role"] == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": system_prompt})
    return msgs


def assistant_spans(text: str, num_assistant: int, markers: TemplateMarkers) -> list[tuple[int, int]]:
    """Char spans [start, end) of the trainable part of each assistant turn, in order."""
    spans, cursor = [], 0
    for _ in range(num_assistant):
        head = text.find(markers.assistant_header, cursor)
        if head < 0:
            raise ValueError("assistant header not found in rendered conversation")
        start = head + len(markers.assistant_header)
        stop = text.find(markers.turn_end, start)
        end = len(text) if stop < 0 else stop + len(markers.turn_end)
        spans.append((start, end))
        cursor = end
    return spans


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int = 4096,
                          markers: TemplateMarkers | None = None,
                          system_prompt: str | None = DEFAULT_SYSTEM_PROMPT) -> tuple[list[int], list[int]]:
    """-> (input_ids, loss_mask), truncated to max_length. Needs a fast tokenizer (offset mapping)."""
    markers = markers or template_markers(tokenizer)
    msgs = with_system_prompt(messages, system_prompt)
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    spans = assistant_spans(text, sum(m["role"] == "assistant" for m in msgs), markers)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    mask, si = [], 0
    for s, _ in offsets:
        while si < len(spans) and s >= spans[si][1]:
            si += 1
        mask.append(int(si < len(spans) and spans[si][0] <= s < spans[si][1]))
    return ids[:max_length], mask[:max_length]


def render_prompt(tokenizer, user_turn: str) -> list[int]:
    """Eval prompt (reference §5): one user message, no system prompt, generation prompt, thinking disabled."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": user_turn}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
