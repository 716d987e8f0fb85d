"""Online calibration of the drafter's confidences: per-position ECE tracking and STS re-fitting.

Confidence logits z[r, k] model P(draft k accepted | drafts < k accepted). Served confidences are
c[r, k] = sigmoid(z[r, k] / T_k + b_k) (Sequential Temperature Scaling, one temperature per position; the bias is
our optional extension, drafter/sts.py, 0 when the sts.json has none). The monitor
compares predicted prefix survival prod_{i<=k} c[r, i] with the realised label "drafts 0..k all accepted" on the
positions that were actually verified (k < verify_len), in `num_bins` equal-width bins per position - the same
ECE the DeepSpec evaluator reports. When online calibration is on and some position's ECE exceeds the threshold
(with enough samples), refit() fits new temperatures on a rolling buffer of raw (logits, outcome) rows; a refit is
temperature-only and clears the biases (fit_fn returns temperatures).

fit_sts_grid is a self-contained STS fit (grid search, positions in order, earlier temperatures fixed);
drafter/sts.py's fit_sts(conf_logits, accepted_prefix_len, verified_len) -> list[float] can be injected instead.
"""

from typing import Callable

import torch

FitFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list[float]]
DEFAULT_GRID = torch.logspace(-1.0, 1.0, 161, dtype=torch.float64)  # T in [0.1, 10], ~3% steps


def binned_ece(pred: torch.Tensor, label: torch.Tensor, num_bins: int) -> torch.Tensor:
    """ECE of each row of pred[g, n] against label[n] (equal-width bins). Float64[g]."""
    groups, n = pred.shape
    if n == 0:
        return torch.full((groups,), float("nan"), dtype=torch.float64)
    bins = (pred * num_bins).long().clamp(0, num_bins - 1)
    flat = (torch.arange(groups).unsqueeze(1) * num_bins + bins).reshape(-1)
    sum_pred = torch.bincount(flat, weights=pred.reshape(-1).double(), minlength=groups * num_bins)
    sum_label = torch.bincount(flat, weights=label.double().expand(groups, n).reshape(-1), minlength=groups * num_bins)
    # sum over bins of (count_b / n) * |mean_pred_b - mean_label_b| = sum_b |sum_pred_b - sum_label_b| / n
    return (sum_pred - sum_label).abs().reshape(groups, num_bins).sum(1) / n


def fit_sts_grid(
    conf_logits: torch.Tensor,
    accepted_prefix_len: torch.Tensor,
    verified_len: torch.Tensor,
    grid: torch.Tensor = DEFAULT_GRID,
    num_bins: int = 20,
) -> list[float]:
    """Per-position temperatures minimising prefix-survival ECE, fitted k = 0..G-1 in order."""
    logits = conf_logits.double()
    num_rows, gamma = logits.shape
    temps: list[float] = []
    prefix = torch.ones(num_rows, dtype=torch.float64)  # prod_{i<k} sigmoid(z_i / T_i*)
    grid = grid.double()
    for k in range(gamma):
        rows = verified_len > k
        if int(rows.sum()) == 0:
            temps.append(1.0)
        else:
            pred = prefix[rows] * torch.sigmoid(logits[rows, k].unsqueeze(0) / grid.unsqueeze(1))
            label = (accepted_prefix_len[rows] > k).double()
            temps.append(float(grid[int(binned_ece(pred, label, num_bins).argmin())]))
        prefix = prefix * torch.sigmoid(logits[:, k] / temps[-1])
    return temps


class CalibrationMonitor:
    def __init__(
        self,
        gamma: int,
        num_bins: int = 20,
        ece_threshold: float = 0.05,
        min_count: int = 500,
        online: bool = False,
        buffer_size: int = 50_000,
        fit_fn: FitFn | None = None,
        temperatures: list[float] | None = None,
        temperatures_sampled: list[float] | None = None,
        biases: list[float] | None = None,
        biases_sampled: list[float] | None = None,
    ):
        self.gamma = gamma
        self.num_bins = num_bins
        self.ece_threshold = ece_threshold
        self.min_count = min_count
        self.online = online  # --dspark-online-calibration
        self.fit_fn = fit_fn or fit_sts_grid
        self.temperatures = torch.tensor(temperatures if temperatures is not None else [1.0] * gamma, dtype=torch.float64)
        if self.temperatures.numel() != gamma:
            raise ValueError(f"need {gamma} temperatures, got {self.temperatures.numel()}")
        # requests at T > 0 (drafter/sts.py: greedy and sampled acceptance are calibrated apart); None: same set
        self.temperatures_sampled = (None if temperatures_sampled is None
                                     else torch.tensor(temperatures_sampled, dtype=torch.float64))
        if self.temperatures_sampled is not None and self.temperatures_sampled.numel() != gamma:
            raise ValueError(f"need {gamma} sampled temperatures, got {self.temperatures_sampled.numel()}")
        self.biases = self._per_position(biases, "biases")
        self.biases_sampled = self._per_position(biases_sampled, "sampled biases")
        self.num_refits = 0
        # rolling buffer of raw rows for refit()
        self._logits = torch.zeros(buffer_size, gamma, dtype=torch.float32)
        self._accepted = torch.zeros(buffer_size, dtype=torch.long)
        self._verified = torch.zeros(buffer_size, dtype=torch.long)
        self._write = 0
        self._filled = 0
        self.reset_stats()

    def _per_position(self, values: list[float] | None, what: str) -> torch.Tensor:
        out = torch.zeros(self.gamma, dtype=torch.float64) if values is None else torch.tensor(values,
                                                                                              dtype=torch.float64)
        if out.numel() != self.gamma:
            raise ValueError(f"need {self.gamma} {what}, got {out.numel()}")
        return out

    def reset_stats(self) -> None:
        shape = (self.gamma, self.num_bins)
        self._count = torch.zeros(shape, dtype=torch.float64)
        self._sum_pred = torch.zeros(shape, dtype=torch.float64)
        self._sum_label = torch.zeros(shape, dtype=torch.float64)

    def calibrate(self, conf_logits: torch.Tensor, sampled: torch.Tensor | None = None) -> torch.Tensor:
        """Calibrated per-position acceptance probabilities sigmoid(z / T_k + b_k): Float[R, G].
        sampled: Bool[R], rows served at temperature > 0 (they use the sampled set when there is one)."""
        dev = conf_logits.device
        temps = self.temperatures.to(device=dev, dtype=torch.float32)
        bias = self.biases.to(device=dev, dtype=torch.float32)
        if sampled is not None and self.temperatures_sampled is not None and bool(sampled.any()):
            hot = sampled.to(dev).view(-1, 1)
            temps = torch.where(hot, self.temperatures_sampled.to(device=dev, dtype=torch.float32), temps)
            bias = torch.where(hot, self.biases_sampled.to(device=dev, dtype=torch.float32), bias)
        return torch.sigmoid(conf_logits.float() / temps + bias)

    def record(self, conf_logits: torch.Tensor, verify_lens: torch.Tensor, accept_lens: torch.Tensor,
               sampled: torch.Tensor | None = None) -> None:
        """Log one step: raw logits [R, G], verified drafts [R], accepted drafts [R]."""
        logits = conf_logits.detach().float().cpu()
        verify_lens, accept_lens = verify_lens.cpu().long(), accept_lens.cpu().long()
        positions = torch.arange(self.gamma).unsqueeze(0)
        pred = torch.cumprod(self.calibrate(logits, sampled).double(), 1)
        verified = positions < verify_lens.unsqueeze(1)
        label = (positions < accept_lens.unsqueeze(1)).double()
        bins = (pred * self.num_bins).long().clamp(0, self.num_bins - 1)
        flat = (positions * self.num_bins + bins)[verified]
        size = self.gamma * self.num_bins
        self._count += torch.bincount(flat, minlength=size).double().view(self.gamma, -1)
        self._sum_pred += torch.bincount(flat, weights=pred[verified], minlength=size).view(self.gamma, -1)
        self._sum_label += torch.bincount(flat, weights=label[verified], minlength=size).view(self.gamma, -1)
        self._push(logits, accept_lens, verify_lens)

    def _push(self, logits: torch.Tensor, accepted: torch.Tensor, verified: torch.Tensor) -> None:
        capacity = self._logits.shape[0]
        keep = verified > 0  # rows that verified nothing carry no calibration signal
        logits, accepted, verified = logits[keep][-capacity:], accepted[keep][-capacity:], verified[keep][-capacity:]
        idx = (self._write + torch.arange(logits.shape[0])) % capacity
        self._logits[idx], self._accepted[idx], self._verified[idx] = logits, accepted, verified
        self._write = (self._write + logits.shape[0]) % capacity
        self._filled = min(capacity, self._filled + logits.shape[0])

    def counts(self) -> torch.Tensor:
        """Verified samples per position since the last reset. Float64[G]."""
        return self._count.sum(1)

    def ece(self) -> torch.Tensor:
        """Per-position ECE of predicted prefix survival (nan where nothing was verified). Float64[G]."""
        n = self.counts()
        return (self._sum_pred - self._sum_label).abs().sum(1) / n  # nan when n == 0

    def needs_refit(self) -> bool:
        ece = torch.nan_to_num(self.ece(), nan=0.0)
        return bool(((self.counts() >= self.min_count) & (ece > self.ece_threshold)).any())

    def maybe_refit(self) -> bool:
        """Refit when online calibration is on and some position drifted; returns whether it refitted."""
        if self.online and self.needs_refit():
            self.refit()
            return True
        return False

    def refit(self) -> list[float]:
        """Fit STS temperatures on the buffered raw rows, install them, restart the ECE statistics."""
        n = self._filled
        if n == 0:
            return self.temperatures.tolist()
        temps = self.fit_fn(self._logits[:n], self._accepted[:n], self._verified[:n])
        if len(temps) != self.gamma or not all(t > 0 for t in temps):
            raise ValueError(f"fit function returned invalid temperatures {temps}")
        self.temperatures = torch.tensor([float(t) for t in temps], dtype=torch.float64)
        self.temperatures_sampled = None  # live outcomes mix both regimes: one refitted set serves both
        self.biases.zero_()
        self.biases_sampled.zero_()
        self.num_refits += 1
        self.reset_stats()
        return self.temperatures.tolist()
