"""Tiny random HF targets (Qwen3 / Qwen2 shaped, byte-level ChatML tokenizer) for tests and smoke runs.

Nothing is downloaded: the tokenizer is built from the 256 byte symbols plus ChatML specials, and the model has
random weights. The embedding table is padded beyond the tokenizer (like Qwen3's 151936 rows for 151669 tokens),
so the drafter's default mask token is the first unused row.
"""

from __future__ import annotations

import json
import os
import random

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def make_tiny_target(path: str, family: str = "qwen3", num_layers: int = 4, hidden_size: int = 64,
                     seed: int = 0):
    """Write a random `family` (qwen3 | qwen2) causal LM + tokenizer to `path`; returns (model, tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = make_tiny_tokenizer()
    vocab = len(tokenizer) + 13  # padded rows beyond the tokenizer
    kwargs = dict(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  eos_token_id=tokenizer.eos_token_id, bos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    if family == "qwen3":
        kwargs["head_dim"] = hidden_size // 4
    config = AutoConfig.for_model(family, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than HF init: peaked, input-dependent distributions
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    model.eval()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id]
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def make_tiny_conversations(path: str, n: int = 8, seed: int = 0) -> None:
    """JSONL rows {"id", "messages"} with one or two user/assistant exchanges of repetitive text."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "one", "two", "three", "the", "cat", "sat", "on", "mat"]
    with open(path, "w") as f:
        for i in range(n):
            msgs = []
            if i % 3 == 0:
                msgs.append({"role": "system", "content": "Be brief."})
            for _ in range(1 + i % 2):
                msgs.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(2, 5)))})
                msgs.append({"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(6, 12)))})
            f.write(json.dumps({"id": f"s{i}", "messages": msgs}) + "\n")


def make_tiny_prompts(path: str, n: int = 3, seed: int = 0) -> None:
    """Eval-style JSONL rows {"turns": [...]}."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"turns": [" ".join(rng.choices(["x", "y", "zz", "count", "to"], k=4))]}) + "\n")


def make_tiny_cache(root, num_layers: int = 3, n: int = 6, layer_ids: str = "0,1", family: str = "qwen2"):
    """A tiny random target at <root>/t, `n` conversations and their fp32 feature cache at <root>/cache.
    Returns (target_dir, cache_dir) as strings."""
    from .__main__ import main

    target, conv, cache = os.path.join(root, "t"), os.path.join(root, "conv.jsonl"), os.path.join(root, "cache")
    make_tiny_target(target, family, num_layers=num_layers, hidden_size=32)
    make_tiny_conversations(conv, n=n)
    main(["capture", "--target", target, "--data", conv, "--out", cache, "--target-layer-ids", layer_ids,
          "--dtype", "fp32", "--min-loss-tokens", "5", "--max-length", "96"])
    return target, cache
