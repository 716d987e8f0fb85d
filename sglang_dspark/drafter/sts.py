"""Sequential Temperature Scaling of the confidence head (paper §3 end; reference §3 "STS").

c_k = sigmoid(z_k / T_k). Temperatures are fitted left to right: T_k minimises the ECE of the cumulative product
prod_{i<=k} c_i (earlier T_i fixed) against the label "drafts 0..k were all accepted". Scaling by a positive
temperature is order-preserving per position, so AUROC at a single position never changes.
File: sts.json next to the checkpoint, {"format": "dspark-sts-v1", "temperatures": [T_1..T_B], ...meta}, plus
optionally "temperatures_sampled": [T_1..T_B] and "sampled": {...meta} for requests served at temperature > 0.

Our extension (optional keys "biases" / "biases_sampled", absent = 0): c_k = sigmoid(z_k / T_k + b_k), fitted by
fit_sts_affine left to right over a (T, b) grid. Why: a temperature only stretches logits around z = 0 (c = 0.5).
Our head, measured on free-running rounds, is calibrated below c ~ 0.15 and overconfident above (c = 0.95 realised
0.68-0.76 at position 1), an affine error in logit space that no temperature removes: temperature-only STS left
5-6% ECE at position 1 where the noise floor is ~2%. The affine fit minimises the log-loss of the prefix-survival
prediction, not its ECE: with a free bias, ECE is minimised by a constant at the base rate (T -> inf), which is
perfectly calibrated and useless to the controller; log-loss is a proper score and keeps the ranking.
Why two regimes: at T = 0 a draft is accepted iff it is the target's argmax; at T > 0 with probability
sum min(p, q). The same confidence logit predicts different acceptance rates under the two rules, and one set of
temperatures fitted on greedy labels mis-calibrates sampled requests (position 1: ECE 10.8% at T = 1).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, NamedTuple, Sequence

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


def apply_sts(conf_logits: torch.Tensor, temps: Sequence[float] | torch.Tensor,
              biases: Sequence[float] | torch.Tensor | None = None) -> torch.Tensor:
    """Calibrated per-position confidences sigmoid(z_k / T_k + b_k); conf_logits [..., B]."""
    n = conf_logits.shape[-1]
    t = torch.as_tensor(temps, dtype=torch.float32, device=conf_logits.device)[:n]
    scaled = conf_logits.float() / t
    if biases is not None:
        scaled = scaled + torch.as_tensor(biases, dtype=torch.float32, device=conf_logits.device)[:n]
    return torch.sigmoid(scaled)


def prefix_labels(accepted_prefix_len: torch.Tensor, verified_len: torch.Tensor, block_size: int):
    """label[n, k] = drafts 0..k all accepted; valid[n, k] = position k was verified."""
    k = torch.arange(block_size, device=accepted_prefix_len.device)
    return k < accepted_prefix_len[:, None], k < verified_len[:, None]


def fit_sts(conf_logits: torch.Tensor, accepted_prefix_len: torch.Tensor, verified_len: torch.Tensor | None = None,
            grid: Sequence[float] | torch.Tensor | None = None, bins: int = 20) -> list[float]:
    """Grid-search T_1..T_B left to right (see module doc). conf_logits [n, B]; accepted_prefix_len [n] = how
    many leading drafts were accepted; verified_len [n] = how many were verified (default B). Rows where position
    k was not verified do not vote for T_k. Ties prefer the temperature closest to 1."""
    temps, _ = _fit_sequential(conf_logits, accepted_prefix_len, verified_len, grid, torch.zeros(1), bins)
    return temps


def default_bias_grid() -> torch.Tensor:
    return torch.linspace(-3.0, 3.0, 61, dtype=torch.float64)  # 0.1 steps in logit space


def fit_sts_affine(conf_logits: torch.Tensor, accepted_prefix_len: torch.Tensor,
                   verified_len: torch.Tensor | None = None, grid: Sequence[float] | torch.Tensor | None = None,
                   bias_grid: Sequence[float] | torch.Tensor | None = None,
                   bins: int = 20) -> tuple[list[float], list[float]]:
    """A bias per position next to the temperature (module doc): (T_1..T_B, b_1..b_B), searched jointly per
    position, left to right, minimising the log-loss of the prefix-survival prediction. Ties prefer b closest to 0,
    then T closest to 1."""
    return _fit_sequential(conf_logits, accepted_prefix_len, verified_len, grid,
                           default_bias_grid() if bias_grid is None else bias_grid, bins, objective="nll")


def _nll_rows(pred: torch.Tensor, label: torch.Tensor, *_) -> torch.Tensor:
    p = pred.clamp(1e-9, 1 - 1e-9)
    return -(label * p.log() + (1 - label) * (1 - p).log()).mean(1)


def _fit_sequential(conf_logits, accepted_prefix_len, verified_len, grid, bias_grid, bins, objective="ece"):
    score = _ece_rows if objective == "ece" else _nll_rows
    z = conf_logits.double().cpu()
    n, B = z.shape
    acc = accepted_prefix_len.cpu().long()
    ver = torch.full((n,), B, dtype=torch.long) if verified_len is None else verified_len.cpu().long()
    grid_t = default_grid() if grid is None else torch.as_tensor(grid, dtype=torch.float64)
    grid_b = torch.as_tensor(bias_grid, dtype=torch.float64)
    if (grid_t <= 0).any():
        raise ValueError("STS grid temperatures must be > 0")
    # candidates ordered by preference so the first minimum wins ties: |b| ascending, then |log T| ascending
    grid_b = grid_b[grid_b.abs().argsort(stable=True)]
    grid_t = grid_t[grid_t.log().abs().argsort(stable=True)]
    labels, valid = prefix_labels(acc, ver, B)
    temps: list[float] = []
    biases: list[float] = []
    prefix = torch.ones(n, dtype=torch.float64)  # prod_{i<k} sigmoid(z_i / T_i + b_i)
    for k in range(B):
        rows = valid[:, k]
        best = (float("inf"), 1.0, 0.0)
        if rows.any():
            zk, pk, yk = z[rows, k], prefix[rows], labels[rows, k].double()
            for b in grid_b.tolist():  # one [G, n_k] slab per bias keeps memory flat
                pred = pk[None, :] * torch.sigmoid(zk[None, :] / grid_t[:, None] + b)
                errs = score(pred, yk, bins)
                i = int(torch.nonzero(errs <= errs.min() + 1e-12)[0])  # first of the (numerically) tied
                if float(errs[i]) < best[0] - 1e-12:
                    best = (float(errs[i]), float(grid_t[i]), round(float(b), 6))
        temps.append(best[1])
        biases.append(best[2])
        prefix = prefix * torch.sigmoid(z[:, k] / best[1] + best[2])
    return temps, biases


def survival_ece(conf_logits: torch.Tensor, accepted_prefix_len: torch.Tensor, verified_len: torch.Tensor | None,
                 temps: Sequence[float] | None = None, bins: int = 20,
                 biases: Sequence[float] | None = None) -> float:
    """ECE of cumulative-product predictions over all verified (row, position) pairs, pooled."""
    n, B = conf_logits.shape
    ver = torch.full((n,), B, dtype=torch.long) if verified_len is None else verified_len.cpu().long()
    probs = apply_sts(conf_logits.cpu(), temps if temps is not None else [1.0] * B, biases).double()
    surv = probs.cumprod(dim=-1)
    labels, valid = prefix_labels(accepted_prefix_len.cpu().long(), ver, B)
    return ece(surv[valid], labels[valid], bins)


REGIMES = ("greedy", "sampled")


def save_sts(path: str | os.PathLike, temps: Sequence[float], meta: dict[str, Any] | None = None,
             regime: str = "greedy", biases: Sequence[float] | None = None) -> None:
    """Write one regime's temperatures (and biases, if fitted). "greedy" rewrites the file (keeping an existing
    sampled set); "sampled" adds its set to an existing file, or starts a file whose greedy set is the same."""
    if regime not in REGIMES:
        raise ValueError(f"STS regime must be one of {REGIMES}, got {regime!r}")
    temps = [float(t) for t in temps]
    _check_temps(temps, path)
    if biases is not None:
        biases = [float(b) for b in biases]
        _check_biases(biases, len(temps), path)
    old = _read_doc(path) if os.path.exists(path) else None
    if regime == "greedy":
        doc = dict(meta or {})
        doc.update(format=STS_FORMAT, temperatures=temps)
        if biases is not None:
            doc["biases"] = biases
        if old is not None and "temperatures_sampled" in old:
            doc["temperatures_sampled"], doc["sampled"] = old["temperatures_sampled"], old.get("sampled", {})
            if "biases_sampled" in old:
                doc["biases_sampled"] = old["biases_sampled"]
    else:
        doc = old if old is not None else {"format": STS_FORMAT, "temperatures": temps,
                                           **({"biases": biases} if biases is not None else {})}
        doc["temperatures_sampled"], doc["sampled"] = temps, dict(meta or {})
        doc.pop("biases_sampled", None)
        if biases is not None:
            doc["biases_sampled"] = biases
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


def load_sts_biases(path: str | os.PathLike, regime: str = "greedy") -> list[float] | None:
    """The biases of one regime (None: temperature-only STS). "sampled" uses the greedy biases exactly when it
    uses the greedy temperatures (load_sts)."""
    if regime not in REGIMES:
        raise ValueError(f"STS regime must be one of {REGIMES}, got {regime!r}")
    doc = _read_doc(path)
    key = "biases_sampled" if regime == "sampled" and "temperatures_sampled" in doc else "biases"
    biases = doc.get(key)
    if biases is None:
        return None
    _check_biases(biases, len(doc["temperatures"]), path, key)
    return [float(b) for b in biases]


class StsParams(NamedTuple):
    """Both regimes of one sts.json (the sampled set falls back to the greedy one, as in load_sts); biases None
    where the file has none."""
    temperatures: list[float]
    temperatures_sampled: list[float]
    biases: list[float] | None
    biases_sampled: list[float] | None


def load_sts_params(path: str | os.PathLike) -> StsParams:
    return StsParams(load_sts(path), load_sts(path, "sampled"), load_sts_biases(path),
                     load_sts_biases(path, "sampled"))


def _check_biases(biases: Any, n: int, path: Any, key: str = "biases") -> None:
    ok = isinstance(biases, list) and len(biases) == n and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in biases)
    if not ok:
        raise StsFileError(f"{path}: key '{key}' must be a list of {n} finite numbers, got {biases!r}")


def _check_temps(temps: Any, path: Any, key: str = "temperatures") -> None:
    ok = isinstance(temps, list) and len(temps) > 0 and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in temps)
    if not ok:
        raise StsFileError(f"{path}: key '{key}' must be a non-empty list of finite numbers > 0, got {temps!r}")
