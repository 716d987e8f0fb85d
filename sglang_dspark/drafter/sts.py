"""Sequential Temperature Scaling of the confidence head (paper §3 end; reference §3 "STS").

c_k = sigmoid(z_k / T_k). Temperatures are fitted left to right: T_k minimises the ECE of the cumulative product
prod_{i<=k} c_i (earlier T_i fixed) against the label "drafts 0..k were all accepted". Scaling by a positive
temperature is order-preserving per position, so AUROC at a single position never changes.
File: sts.json next to the checkpoint, {"format": "dspark-sts-v1", "temperatures": [T_1..T_B], ...meta}, plus
optionally "temperatures_sampled": [T_1..T_B] and "sampled": {...meta} for requests served at temperature > 0.
Why two regimes: at T = 0 a draft is accepted iff it is the target's argmax; at T > 0 with probability
sum min(p, q). The same confidence logit predicts different acceptance rates under the two rules, and one set of
temperatures fitted on greedy labels mis-calibrates sampled requests (position 1: ECE 10.8% at T = 1).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import torch

STS_FORMAT = "dspark-sts-v1"


class StsFileError(ValueError):
    """An sts.json file is malformed."""


def default_grid() -> torch.Tensor:
    # Log-spaced 0.05 .. 20 (241 points, includes 1.0): confidence heads are rarely off by more than that.
    return torch.exp(torch.linspace(math.log(0.05), math.log(20.0), 241, dtype=torch.float64))


def ece(pred: torch.Tensor, label: torch.Tensor, bins: int = 20) -> float:
    """Expected calibration error with `bins` equal-width bins on [0, 1], weighted by bin counts."""
    pred = pred.double().flatten()
    label = label.double().flatten()
    n = pred.numel()
    if n == 0:
        return float("nan")
    idx = (pred.clamp(0, 1) * bins).long().clamp(max=bins - 1)
    count = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, torch.ones_like(pred))
    psum = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, pred)
    lsum = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, label)
    return float((psum - lsum).abs().sum() / n)  # sum_b (n_b/n) |mean_pred_b - mean_label_b|


def ece_noise_floor(pred: torch.Tensor, bins: int = 20, draws: int = 200, seed: int = 0) -> float:
    """Mean ECE of a perfectly calibrated predictor with these predictions: labels drawn as Bernoulli(pred).
    Binned ECE is biased upward by label noise (~ sum_b sqrt(p_b (1 - p_b) n_b) / n); on a few hundred rounds that
    alone is several percent, so a measured ECE is read against this floor."""
    pred = pred.double().flatten().clamp(0, 1)
    if pred.numel() == 0:
        return float("nan")
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(draws, pred.numel(), generator=gen, dtype=torch.float64) < pred).double()
    return float(_ece_rows(pred.expand(draws, -1).contiguous(), labels, bins, per_row_labels=True).mean())


def _ece_rows(pred: torch.Tensor, label: torch.Tensor, bins: int, per_row_labels: bool = False) -> torch.Tensor:
    """ECE of each row of pred [G, n] against one label vector [n], or label [G, n] per row (same binning as
    ece())."""
    G, n = pred.shape
    idx = (pred.clamp(0, 1) * bins).long().clamp(max=bins - 1)
    psum = torch.zeros(G, bins, dtype=torch.float64).scatter_add_(1, idx, pred)
    labels = label if per_row_labels else label.expand(G, n).contiguous()
    lsum = torch.zeros(G, bins, dtype=torch.float64).scatter_add_(1, idx, labels.double())
    return (psum - lsum).abs().sum(1) / n


def auroc(pred: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); nan when one class is absent."""
    pred = pred.double().flatten()
    label = label.bool().flatten()
    n_pos = int(label.sum())
    n_neg = label.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    sorted_pred, order = torch.sort(pred)
    ranks = torch.empty_like(pred)
    ranks[order] = torch.arange(1, pred.numel() + 1, dtype=torch.float64)
    # Average ranks of tied predictions.
    uniq, inverse, counts = torch.unique_consecutive(sorted_pred, return_inverse=True, return_counts=True)
    if len(uniq) < pred.numel():
        rank_sum = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, ranks[order])
        ranks[order] = (rank_sum / counts)[inverse]
    u = ranks[label].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def apply_sts(conf_logits: torch.Tensor, temps: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Calibrated per-position confidences sigmoid(z_k / T_k); conf_logits [..., B]."""
    t = torch.as_tensor(temps, dtype=torch.float32, device=conf_logits.device)
    return torch.sigmoid(conf_logits.float() / t[: conf_logits.shape[-1]])


def prefix_labels(accepted_prefix_len: torch.Tensor, verified_len: torch.Tensor, block_size: int):
    """label[n, k] = drafts 0..k all accepted; valid[n, k] = position k was verified."""
    k = torch.arange(block_size, device=accepted_prefix_len.device)
    return k < accepted_prefix_len[:, None], k < verified_len[:, None]


def fit_sts(conf_logits: torch.Tensor, accepted_prefix_len: torch.Tensor, verified_len: torch.Tensor | None = None,
            grid: Sequence[float] | torch.Tensor | None = None, bins: int = 20) -> list[float]:
    """Grid-search T_1..T_B left to right (see module doc). conf_logits [n, B]; accepted_prefix_len [n] = how
    many leading drafts were accepted; verified_len [n] = how many were verified (default B). Rows where position
    k was not verified do not vote for T_k. Ties prefer the temperature closest to 1."""
    z = conf_logits.double().cpu()
    n, B = z.shape
    acc = accepted_prefix_len.cpu().long()
    ver = torch.full((n,), B, dtype=torch.long) if verified_len is None else verified_len.cpu().long()
    grid_t = default_grid() if grid is None else torch.as_tensor(grid, dtype=torch.float64)
    if (grid_t <= 0).any():
        raise ValueError("STS grid temperatures must be > 0")
    labels, valid = prefix_labels(acc, ver, B)
    temps: list[float] = []
    prefix = torch.ones(n, dtype=torch.float64)  # prod_{i<k} sigmoid(z_i / T_i)
    for k in range(B):
        rows = valid[:, k]
        best_t = 1.0
        if rows.any():
            pred = prefix[rows][None, :] * torch.sigmoid(z[rows, k][None, :] / grid_t[:, None])  # [G, n_k]
            errs = _ece_rows(pred, labels[rows, k].double(), bins)
            # smallest ECE; among (numerically) equal ones the temperature closest to 1
            best = errs.min()
            tied = torch.nonzero(errs <= best + 1e-12).flatten()
            best_t = float(grid_t[tied[grid_t[tied].log().abs().argmin()]])
        temps.append(float(best_t))
        prefix = prefix * torch.sigmoid(z[:, k] / best_t)
    return temps


def survival_ece(conf_logits: torch.Tensor, accepted_prefix_len: torch.Tensor, verified_len: torch.Tensor | None,
                 temps: Sequence[float] | None = None, bins: int = 20) -> float:
    """ECE of cumulative-product predictions over all verified (row, position) pairs, pooled."""
    n, B = conf_logits.shape
    ver = torch.full((n,), B, dtype=torch.long) if verified_len is None else verified_len.cpu().long()
    probs = apply_sts(conf_logits.cpu(), temps if temps is not None else [1.0] * B).double()
    surv = probs.cumprod(dim=-1)
    labels, valid = prefix_labels(accepted_prefix_len.cpu().long(), ver, B)
    return ece(surv[valid], labels[valid], bins)


REGIMES = ("greedy", "sampled")


def save_sts(path: str | os.PathLike, temps: Sequence[float], meta: dict[str, Any] | None = None,
             regime: str = "greedy") -> None:
    """Write one regime's temperatures. "greedy" rewrites the file (keeping an existing sampled set); "sampled"
    adds its set to an existing file, or starts a file whose greedy set is the same temperatures."""
    if regime not in REGIMES:
        raise ValueError(f"STS regime must be one of {REGIMES}, got {regime!r}")
    temps = [float(t) for t in temps]
    _check_temps(temps, path)
    old = _read_doc(path) if os.path.exists(path) else None
    if regime == "greedy":
        doc = dict(meta or {})
        doc.update(format=STS_FORMAT, temperatures=temps)
        if old is not None and "temperatures_sampled" in old:
            doc["temperatures_sampled"], doc["sampled"] = old["temperatures_sampled"], old.get("sampled", {})
    else:
        doc = old if old is not None else {"format": STS_FORMAT, "temperatures": temps}
        doc["temperatures_sampled"], doc["sampled"] = temps, dict(meta or {})
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def _read_doc(path: str | os.PathLike) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise StsFileError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != STS_FORMAT:
        raise StsFileError(f"{path}: key 'format' must be '{STS_FORMAT}'")
    return doc


def load_sts(path: str | os.PathLike, regime: str = "greedy") -> list[float]:
    """The temperatures of one regime; "sampled" falls back to the greedy set when the file has none."""
    if regime not in REGIMES:
        raise ValueError(f"STS regime must be one of {REGIMES}, got {regime!r}")
    doc = _read_doc(path)
    temps = doc.get("temperatures")
    _check_temps(temps, path)
    if regime == "sampled" and "temperatures_sampled" in doc:
        temps = doc["temperatures_sampled"]
        _check_temps(temps, path, "temperatures_sampled")
        if len(temps) != len(doc["temperatures"]):
            raise StsFileError(f"{path}: 'temperatures_sampled' has {len(temps)} entries, 'temperatures' "
                               f"{len(doc['temperatures'])}")
    return [float(t) for t in temps]


def _check_temps(temps: Any, path: Any, key: str = "temperatures") -> None:
    ok = isinstance(temps, list) and len(temps) > 0 and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in temps)
    if not ok:
        raise StsFileError(f"{path}: key '{key}' must be a non-empty list of finite numbers > 0, got {temps!r}")
