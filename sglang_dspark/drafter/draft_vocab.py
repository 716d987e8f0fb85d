"""Reduced draft vocabulary: the drafter proposes only from the N token ids the target actually writes most.

Why: the drafter's lm_head is the target's (151,936 x 896 for the embedded model). On a CPU that matmul, plus the
Markov projection and the [R, B, V] logits it produces, is most of a draft pass (28.5% of a target verify at batch
1, 57% at batch 16). The target emits a few thousand distinct ids in practice, so restricting the draft head to the
most frequent N rows loses almost no acceptance: a draft outside the set is simply never proposed, and
verification stays lossless because the verifier sees the true draft distribution (zero outside the set).

File format: `draft_vocab.safetensors` next to the drafter checkpoint, one int64 tensor `token_ids` [N] (sorted,
unique, in [0, vocab_size)), metadata `coverage` = fraction of counted target tokens inside the set. Optional: a
DeepSpec checkpoint without it runs on the full vocabulary.
"""

from __future__ import annotations

import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

DRAFT_VOCAB_NAME = "draft_vocab.safetensors"


class DraftVocabError(ValueError):
    pass


def build_draft_vocab(counts: torch.Tensor, size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """Top-`size` ids by count; ids never counted are ranked by id (BPE ids are roughly in merge order, i.e. by
    corpus frequency). `always` (stop tokens, ...) are forced in. counts [V] -> sorted int64 ids [min(size, V)]."""
    V = counts.numel()
    size = min(size, V)
    # count-major, lower id breaks ties: score = count * V - id is exact in int64 for any realistic corpus
    score = counts.to(torch.int64) * V - torch.arange(V, dtype=torch.int64)
    forced = torch.tensor([i for i in always if 0 <= i < V], dtype=torch.int64)
    score[forced] = torch.iinfo(torch.int64).max
    return torch.topk(score, size).indices.sort().values


def coverage(ids: torch.Tensor, counts: torch.Tensor) -> float:
    total = float(counts.sum())
    return float(counts[ids].sum()) / total if total > 0 else 0.0


def save_draft_vocab(path: str, ids: torch.Tensor, cov: float | None = None) -> None:
    meta = {"format": "dspark-draft-vocab-v1"}
    if cov is not None:
        meta["coverage"] = f"{cov:.6f}"
    tmp = path + ".tmp"
    save_file({"token_ids": ids.to(torch.int64).contiguous()}, tmp, metadata=meta)
    os.replace(tmp, path)


def load_draft_vocab(path: str, vocab_size: int) -> torch.Tensor:
    try:
        with safe_open(path, framework="pt") as f:
            if "token_ids" not in f.keys():
                raise DraftVocabError(f"{path}: no tensor 'token_ids' (found {list(f.keys())})")
            ids = f.get_tensor("token_ids")
    except DraftVocabError:
        raise
    except Exception as e:  # safetensors raises several types for a truncated / foreign file
        raise DraftVocabError(f"{path}: not a readable safetensors file ({e})") from e
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or ids.numel() == 0:
        raise DraftVocabError(f"{path}: 'token_ids' must be a non-empty 1-D integer tensor, got "
                              f"{ids.dtype} {list(ids.shape)}")
    ids = ids.to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftVocabError(f"{path}: token ids outside [0, {vocab_size})")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise DraftVocabError(f"{path}: 'token_ids' must be sorted and unique")
    return ids
