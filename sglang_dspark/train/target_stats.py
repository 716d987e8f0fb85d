"""`targets`: per-position target statistics next to a feature cache, so `fit` never runs the 152k-row lm_head.

Why: with a sampled vocabulary, the rest of a CPU fit step is small, but the target distribution at every block
slot was recomputed each step (N·B rows × V × d, two thirds of the step at N = 32, and it grows with the anchors).
The target's distribution at a position is fixed, so it is computed once per cached token instead:

<cache>/shard-XXXXX.targets.safetensors   per sample i: "{i}.topk_ids" int32 [S, K] (descending target logit),
                                          "{i}.lse" float32 [S] (log-sum-exp of the target logits, fp32)
metadata {"top_k": K}. Only positions a fit block can read are computed (rows_fit_reads); the rest hold lse NaN.
With these, p_t over any column subset `cols` is exact:
exp(last_hidden @ lm_head[cols]^T - lse) (see `target_probs`). Files are written whole per shard, so a killed run
resumes at the first shard without one.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from .cache import CacheReader, targets_path


# Dummy (padding) blocks of fit sit at position 0, so its slots read positions < block size; cover any block size.
LEADING_ROWS = 32


def rows_fit_reads(loss_mask: torch.Tensor) -> torch.Tensor:
    """bool [S]: the positions a fit block can read, i.e. the leading rows and everything from the position before
    the first loss token on (anchors need loss tokens). Long prompts make the rest most of a sample."""
    S = loss_mask.shape[0]
    need = torch.zeros(S, dtype=torch.bool)
    need[:LEADING_ROWS] = True
    hits = torch.nonzero(loss_mask.bool()).flatten()
    if len(hits):
        need[max(0, int(hits[0]) - 1):] = True
    return need


def position_stats(last_hidden: torch.Tensor, lm_head_weight: torch.Tensor, top_k: int, chunk: int = 256,
                   rows: torch.Tensor | None = None):
    """last_hidden [S, d] -> (topk_ids int32 [S, K], lse fp32 [S]), computed in fp32 like fit's lm_head.
    With `rows` (bool [S]) only those positions are computed; the others hold id 0 and lse NaN (fit refuses them)."""
    S = last_hidden.shape[0]
    idx = torch.arange(S) if rows is None else torch.nonzero(rows).flatten()
    w = lm_head_weight.float()
    ids = torch.zeros(S, top_k, dtype=torch.int32)
    lse = torch.full((S,), float("nan"))
    for s in range(0, len(idx), chunk):
        at = idx[s: s + chunk]
        logits = last_hidden[at].float() @ w.T
        lse[at] = torch.logsumexp(logits, dim=-1)
        ids[at] = logits.topk(top_k, dim=-1).indices.to(torch.int32)
    return ids, lse


def target_probs(last_hidden_rows: torch.Tensor, lm_head_weight: torch.Tensor, lse: torch.Tensor,
                 cols: torch.Tensor) -> torch.Tensor:
    """Exact target probabilities of columns `cols` [C] at rows [..., d] with their log-sum-exp [...] -> [..., C]."""
    logits = last_hidden_rows.float() @ lm_head_weight[cols].float().T
    return torch.exp(logits - lse[..., None])


def run_targets(cache_dir: str, lm_head_weight: torch.Tensor, top_k: int = 32) -> dict:
    """Write the missing `.targets.safetensors` files of a cache; returns counts."""
    shards = CacheReader.shard_files(cache_dir)
    todo = [fn for fn in shards if not _complete(fn, top_k)]
    reader = CacheReader(cache_dir)
    by_shard: dict[str, list[int]] = {}
    for idx, (fn, _, _) in enumerate(reader.entries):
        by_shard.setdefault(fn, []).append(idx)
    tokens = 0
    bar = tqdm(total=sum(len(by_shard[fn]) for fn in todo), desc="targets", unit="sample")
    for fn in todo:
        out = {}
        for idx in by_shard[fn]:
            _, i, _ = reader.entries[idx]
            sample = reader.read(idx, ("loss_mask", "last_hidden"))  # not the features: most of a sample's bytes
            rows = rows_fit_reads(sample["loss_mask"])
            ids, lse = position_stats(sample["last_hidden"], lm_head_weight, top_k, rows=rows)
            out[f"{i}.topk_ids"], out[f"{i}.lse"] = ids.contiguous(), lse.contiguous()
            tokens += int(rows.sum())
            bar.update(1)
        path = targets_path(fn)
        save_file(out, path + ".tmp", metadata={"top_k": json.dumps(top_k)})
        os.replace(path + ".tmp", path)
    bar.close()
    return {"shards": len(shards), "written": len(todo), "tokens": tokens}  # tokens: positions computed


def _complete(shard_file: str, top_k: int) -> bool:
    path = targets_path(shard_file)
    if not os.path.exists(path):
        return False
    with safe_open(path, framework="pt") as f:
        return json.loads(f.metadata().get("top_k", "0")) >= top_k


def run_targets_cli(args) -> dict:
    from .target import load_target_shared_weights

    reader = CacheReader(args.cache)
    _, head = load_target_shared_weights(args.target or reader.manifest["target"])
    result = run_targets(args.cache, head, args.top_k)
    print(f"[targets] {result['written']} of {result['shards']} shards written ({result['tokens']} tokens)")
    return result
