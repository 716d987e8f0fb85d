"""Build a tiny random HF causal LM (< 1 MB) with a real byte-level BPE tokenizer.

Offline and deterministic from `seed`: the tokenizer is trained with `tokenizers`
on a built-in corpus plus a fixed list of stdlib modules, the weights come from
torch's seeded init. Used by the SGLang CPU smoke tests and the DSpark tests.

    path = build_tiny_model(tmp_path / "tiny", arch="llama")
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_BUILTIN_CORPUS = """
Speculative decoding drafts several tokens cheaply and lets the target model verify them in one pass.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
def add(a, b):
    return a + b

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828
"""
# Fixed stdlib modules: a bigger corpus gives the BPE enough pairs to reach the vocab size.
_STDLIB_FILES = ["textwrap.py", "string.py", "json/decoder.py", "json/encoder.py", "argparse.py", "dataclasses.py"]
_ARCHS = ("llama", "qwen2", "qwen3")


def _corpus() -> list[str]:
    texts = [_BUILTIN_CORPUS] * 4
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in _STDLIB_FILES:
        path = stdlib / name
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def build_tokenizer(vocab: int):
    """Byte-level BPE with chat template; eos = <|im_end|>, pad/bos = <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _config(arch: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, ids: dict, dtype: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,  # keeps the file < 1 MB
        initializer_range=0.2,  # wide logits: no near-ties in greedy argmax across implementations
        torch_dtype=dtype,
        **ids,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    return Qwen3Config(head_dim=hidden // heads, **common)


def build_tiny_model(
    out_dir: str | Path,
    dtype: str = "float32",
    arch: str = "llama",
    vocab: int = 2048,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """Write config.json, model.safetensors, tokenizer files into out_dir; return it."""
    from transformers import AutoModelForCausalLM

    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {_ARCHS}, got {arch!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab)
    ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = _config(arch, vocab, hidden, layers, heads, kv_heads, ids, dtype)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tiny_model.json").write_text(json.dumps({"arch": arch, "seed": seed, "dtype": dtype}))
    return out


if __name__ == "__main__":
    import sys
    import time

    t0 = time.time()
    path = build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny_model")
    size = sum(p.stat().st_size for p in path.iterdir())
    print(f"{path}: {size / 1024:.0f} KiB in {time.time() - t0:.1f}s")
