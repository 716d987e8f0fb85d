"""Acceptance and calibration metrics of speculative rounds, plus PNG plots.

tau = sum(tau) / #rounds (bonus included, the paper's acceptance length).
survival@k = #(rounds with a > k) / #(rounds with n > k)            (DeepSpec's accept_rate@k)
cond@k     = #(a > k) / #(a > k-1 and n > k)                          (paper's conditional acceptance)
Confidence: for every verified position k, prediction prod_{i<=k} sigmoid(z_i [/ T_i]) vs label a > k; ECE with 20
equal-width bins and AUROC, pooled over positions and per position; raw and after STS. Next to the STS ECE, its noise
floor: the ECE a perfectly calibrated predictor would show on the same predictions (labels ~ Bernoulli(pred)).
"""

from __future__ import annotations

import torch

from ..drafter.sts import apply_sts, auroc, ece, ece_noise_floor, prefix_labels
from .spec_decode import Round


def stack_rounds(rounds: list[Round], B: int):
    """-> conf_logits [n, B] (zero past the verified drafts), accepted prefix len [n], verified len [n]."""
    conf = torch.zeros(len(rounds), B)
    for i, r in enumerate(rounds):
        conf[i, : len(r.conf_logits)] = r.conf_logits.float()
    acc = torch.tensor([r.accepted for r in rounds], dtype=torch.long)
    ver = torch.tensor([min(r.proposed, len(r.conf_logits)) for r in rounds], dtype=torch.long)
    return conf, acc, ver


def acceptance_stats(rounds: list[Round], B: int) -> dict:
    if not rounds:
        return {"tau": None, "rounds": 0, "survival_by_position": [], "cond_accept_by_position": []}
    a = torch.tensor([r.accepted for r in rounds])
    n = torch.tensor([r.proposed for r in rounds])
    surv, cond = [], []
    for k in range(B):
        seen = int((n > k).sum())
        prev_ok = int(((a > k - 1) & (n > k)).sum()) if k > 0 else seen
        hit = int((a > k).sum())
        surv.append(hit / seen if seen else None)
        cond.append(hit / prev_ok if prev_ok else None)
    return {"tau": sum(r.tau for r in rounds) / len(rounds), "rounds": len(rounds),
            "draft_tokens_per_round": float(n.float().mean()),
            "survival_by_position": surv, "cond_accept_by_position": cond}


def calibration_stats(rounds: list[Round], B: int, temps: list[float] | None,
                      biases: list[float] | None = None) -> dict:
    conf, acc, ver = stack_rounds(rounds, B)
    labels, valid = prefix_labels(acc, ver, B)
    out: dict = {}
    for name, t in (("raw", None), ("sts", temps)):
        if name == "sts" and t is None:
            out.update(ece_sts=None, auc_sts=None, ece_sts_by_position=None, ece_sts_floor=None,
                       ece_sts_floor_by_position=None)
            continue
        surv = apply_sts(conf, t if t is not None else [1.0] * B, biases if name == "sts" else None)
        surv = surv.double().cumprod(-1)
        out[f"ece_{name}"] = ece(surv[valid], labels[valid]) if valid.any() else None
        out[f"auc_{name}"] = auroc(surv[valid], labels[valid]) if valid.any() else None
        out[f"ece_{name}_by_position"] = [ece(surv[valid[:, k], k], labels[valid[:, k], k]) if valid[:, k].any()
                                          else None for k in range(B)]
        if name == "sts":  # what a perfectly calibrated predictor would score on these very predictions
            out["ece_sts_floor"] = ece_noise_floor(surv[valid]) if valid.any() else None
            out["ece_sts_floor_by_position"] = [ece_noise_floor(surv[valid[:, k], k]) if valid[:, k].any()
                                                else None for k in range(B)]
        out[f"_surv_{name}"] = (surv[valid], labels[valid])  # for the reliability plot (dropped from JSON)
    out["auc"] = out["auc_raw"]
    out["auc_by_position"] = [auroc(conf[valid[:, k], k], labels[valid[:, k], k]) if valid[:, k].any() else None
                              for k in range(B)]
    return out


def reliability_bins(pred: torch.Tensor, label: torch.Tensor, bins: int = 20):
    idx = (pred.clamp(0, 1) * bins).long().clamp(max=bins - 1)
    cnt = torch.bincount(idx, minlength=bins).double()
    mp = torch.bincount(idx, weights=pred.double(), minlength=bins) / cnt.clamp_min(1)
    ml = torch.bincount(idx, weights=label.double(), minlength=bins) / cnt.clamp_min(1)
    keep = cnt > 0
    return mp[keep].tolist(), ml[keep].tolist(), cnt[keep].tolist()


def write_plots(report: dict, calib_points: dict, out_dir: str) -> list[str]:
    """acceptance.png (conditional acceptance and survival by position, per dataset); reliability.png."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, st in report["per_dataset"].items():
        for ax, key in zip(axes, ("cond_accept_by_position", "survival_by_position")):
            ys = st[key]
            ax.plot([k + 1 for k, y in enumerate(ys) if y is not None], [y for y in ys if y is not None],
                    marker="o", label=f"{name} (tau={st['tau']:.2f})" if st["tau"] else name)
    for ax, title in zip(axes, ("conditional acceptance", "prefix survival")):
        ax.set_xlabel("draft position k")
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "acceptance.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    for name, (pred, label) in calib_points.items():
        if pred.numel():
            mp, ml, _ = reliability_bins(pred, label)
            ece_v = report.get(f"ece_{name}")
            ax.plot(mp, ml, marker="o", label=f"{name} (ECE={ece_v:.3f})" if ece_v is not None else name)
    ax.set_xlabel("predicted prefix survival")
    ax.set_ylabel("observed prefix survival")
    ax.set_title("reliability")
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "reliability.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
