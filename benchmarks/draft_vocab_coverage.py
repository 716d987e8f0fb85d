"""How often the target's next token lies inside a draft vocabulary (a token outside it can never be drafted), and
which tokens fall outside the last vocabulary given.

    python benchmarks/draft_vocab_coverage.py --per-dataset 10 VOCAB.safetensors [VOCAB2.safetensors ...]

HF target in bf16, greedy, 64 new tokens per prompt, `--per-dataset` prompts each of gsm8k / humaneval / mt-bench.
The generated ids are cached (runs/profile/eval_ids_<N>.json), so comparing more vocabularies later is instant.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import torch
from tqdm import tqdm

from sglang_dspark.bench.prompts import eval_mix
from sglang_dspark.drafter.draft_vocab import coverage, load_draft_vocab
from sglang_dspark.embedded import DEFAULT_TARGET_DIR
from sglang_dspark.train.target import read_target_config


def target_tokens(per_dataset: int, cache: str, batch: int = 10) -> list[int]:
    if os.path.exists(cache):
        return json.load(open(cache))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET_DIR)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET_DIR, dtype=torch.bfloat16).eval()
    prompts = [p for _, p in eval_mix(per_dataset)]
    ids: list[int] = []
    for i in tqdm(range(0, len(prompts), batch), desc="generate"):
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for p in prompts[i:i + batch]]
        enc = tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=64, do_sample=False)
        ids += [t for t in out[:, enc["input_ids"].shape[1]:].reshape(-1).tolist() if t != tok.pad_token_id]
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    json.dump(ids, open(cache, "w"))
    return ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vocabs", nargs="+", help="draft_vocab.safetensors files")
    p.add_argument("--per-dataset", type=int, default=10)
    args = p.parse_args()
    ids = torch.tensor(target_tokens(args.per_dataset, f"runs/profile/eval_ids_{args.per_dataset}.json"))
    vocab_size = read_target_config(str(DEFAULT_TARGET_DIR))["vocab_size"]
    counts = torch.bincount(ids, minlength=vocab_size)
    for path in args.vocabs:
        vocab = load_draft_vocab(path, vocab_size)
        print(f"{path}: {vocab.numel()} ids, {ids.numel()} target tokens, coverage {coverage(vocab, counts):.4f}")
    inside = torch.isin(ids, vocab)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET_DIR)
    print("most frequent outside the last:",
          [(tok.decode([t]), n) for t, n in Counter(ids[~inside].tolist()).most_common(20)])


if __name__ == "__main__":
    main()
