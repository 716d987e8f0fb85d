"""`calibrate`: fit Sequential Temperature Scaling on held-out cache samples and write sts.json.

Acceptance labels are teacher-forced on the cached sequence (the block sees the true prefix, the Markov head is
fed the true previous tokens, the target distribution p_k comes from the cached final hidden state):
  * temperature 0 (greedy): position k accepted iff argmax q_k == argmax p_k;
  * temperature T > 0: accepted with probability alpha_k = sum_v min(p_k(v), q_k(v)) (both at temperature T), the
    acceptance probability of rejection sampling, drawn as a Bernoulli with a fixed seed.
accepted_prefix_len = leading run of accepted positions; verified_len = length of the valid label prefix.
This matches the soft label of the training confidence loss (1 - TV) at T = 1.
"""

from __future__ import annotations

import os

import torch
from tqdm import tqdm

from ..drafter import fit_sts, load_drafter, sample_anchors, save_sts
from ..drafter.sts import survival_ece
from .cache import CacheReader
from .losses import target_block_logits
from .target import load_target_shared_weights


def acceptance(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-position acceptance (bool [..., B]) under the definition in the module doc."""
    if temperature <= 0:
        return draft_logits.argmax(-1) == target_logits.argmax(-1)
    q = torch.softmax(draft_logits / temperature, dim=-1)
    p = torch.softmax(target_logits / temperature, dim=-1)
    alpha = torch.minimum(p, q).sum(-1).clamp(0, 1)
    u = torch.rand(alpha.shape, generator=generator).to(alpha.device)
    return u < alpha


@torch.no_grad()
def collect_calibration_data(model, cache: CacheReader, indices: list[int], num_anchors: int, max_length: int,
                             temperature: float, seed: int, device):
    """-> conf_logits [n, B], accepted_prefix_len [n], verified_len [n] over all kept blocks."""
    B = model.block_size
    confs, accs, vers = [], [], []
    gen = torch.Generator().manual_seed(seed)
    for idx in tqdm(indices, desc="calibrate", unit="sample"):
        s = cache[idx]
        ids = s["input_ids"][:max_length].long()[None].to(device)
        lm = s["loss_mask"][:max_length][None].to(device)
        anchors, keep = sample_anchors(lm, num_anchors, gen)
        if not keep.any():
            continue
        hidden = s["hidden"][:max_length][None].to(device)
        last = s["last_hidden"][:max_length][None].to(device)
        logits, conf, _, emask = model.forward_train(ids, hidden, lm, anchors, keep)
        tlogits = target_block_logits(model.lm_head, last, anchors, B)
        acc = acceptance(logits, tlogits, temperature, gen) & emask
        rows = keep[0] & emask[0, :, 0]
        confs.append(conf[0, rows].cpu())
        accs.append(acc[0, rows].long().cumprod(-1).sum(-1).cpu())
        vers.append(emask[0, rows].sum(-1).cpu())
    if not confs:
        raise ValueError("no calibration blocks: the held-out split has no samples with loss tokens")
    return torch.cat(confs), torch.cat(accs), torch.cat(vers)


def run_calibrate(args) -> dict:
    cache = CacheReader(args.cache)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target_path = args.target or cache.manifest["target"]
    embed = head = None
    if not args.no_target_weights:
        try:
            embed, head = load_target_shared_weights(target_path)
        except FileNotFoundError:
            pass
    model = load_drafter(args.drafter, embed, head, dtype=torch.float32, device=device)
    if model.confidence_head is None:
        raise ValueError(f"{args.drafter}: drafter has no confidence head; nothing to calibrate")
    _, held = cache.split(args.holdout_fraction)
    if not held:
        raise ValueError(f"{args.cache}: held-out split is empty (holdout_fraction={args.holdout_fraction})")
    held = held[: args.max_samples] if args.max_samples else held
    conf, acc, ver = collect_calibration_data(model, cache, held, args.num_anchors, args.max_length,
                                              args.temperature, args.seed, device)
    temps = fit_sts(conf, acc, ver)
    ece_raw, ece_sts = survival_ece(conf, acc, ver), survival_ece(conf, acc, ver, temps)
    full = ver == model.block_size  # blocks whose whole label prefix is valid: an unbiased prefix-length sample
    reached = torch.stack([(acc[full] >= k).sum() for k in range(model.block_size + 1)]).float()
    meta = {"block_size": model.block_size, "num_blocks": int(conf.shape[0]), "num_samples": len(held),
            # teacher-forced on held-out text: tokens per step if every block verified all B drafts (bonus incl.)
            "heldout_tau": 1.0 + float(acc[full].float().mean()) if bool(full.any()) else None,
            "heldout_cond_accept": (reached[1:] / reached[:-1].clamp_min(1)).tolist(),
            "acceptance": "greedy" if args.temperature <= 0 else f"rejection-sampling T={args.temperature}",
            "labels": "teacher-forced on the cached sequence", "ece_raw": ece_raw, "ece_sts": ece_sts}
    out = args.out or os.path.join(args.drafter, "sts.json")
    regime = getattr(args, "regime", None) or ("greedy" if args.temperature <= 0 else "sampled")
    save_sts(out, temps, meta, regime=regime)
    print(f"[calibrate] {regime}: {conf.shape[0]} blocks from {len(held)} samples; held-out tau "
          f"{meta['heldout_tau']}, conditional acceptance {[round(a, 3) for a in meta['heldout_cond_accept']]}; "
          f"ECE {ece_raw:.4f} -> {ece_sts:.4f}; T = {[round(t, 3) for t in temps]} -> {out}")
    return {"temperatures": temps, "path": out, **meta}
