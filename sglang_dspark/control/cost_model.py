"""Engine step-time model: t(T, R, K) = a + b*T + c*R + d*K + jag(T).

T = tokens in the target forward (anchors + verified drafts), R = requests, K = KV tokens attended over.
jag(T) is an optional per-bucket offset over T (e.g. CUDA-graph padding sizes make the curve a staircase);
bucket i covers (edges[i-1], edges[i]], the last bucket everything above.

fit(): Huber-weighted iteratively reweighted least squares, then bucket offsets = median residual per bucket.
update(): online refinement - recursive least squares (with forgetting) on the linear part plus an EWMA of the
residual per bucket; residuals beyond `outlier_k` robust scales are rejected (a GC pause or a compile must not
teach the model), unless `max_consecutive_rejects` in a row arrive, which we take as a real regime change.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

KEY_FIELDS = ("model", "dtype", "device", "sglang_version")
# Feature scales keep the normal equations well conditioned (K is ~1e6 when T is ~1e2).
FEATURE_SCALE = np.array([1.0, 256.0, 64.0, 65536.0])
MIN_STEP_S = 1e-6
MIN_RELATIVE_SCALE = 0.01  # outlier gate never tighter than 1% of the predicted step time
MAX_RLS_TRACE = 1e4
RLS_RESET_VARIANCE = 1e3  # RLS prior covariance (scaled features) when starting afresh  # bounds covariance wind-up under forgetting when (T, R, K) barely vary


@dataclass
class CostSample:
    verify_tokens: int
    num_requests: int
    kv_tokens: int
    step_time_s: float


def _features(T, R, K) -> np.ndarray:
    T, R, K = np.broadcast_arrays(np.asarray(T, float), np.asarray(R, float), np.asarray(K, float))
    return np.stack([np.ones_like(T), T, R, K], axis=-1) / FEATURE_SCALE


def _as_float(x):
    return x.double() if isinstance(x, torch.Tensor) else float(x)


def nonnegative_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a step never gets faster with more tokens, requests or KV):
    drop the most negative column and refit until none is negative (small active-set NNLS)."""
    active = list(range(X.shape[1]))
    beta = np.zeros(X.shape[1])
    while active:
        sub = np.linalg.lstsq(X[:, active], y, rcond=None)[0]
        if (sub >= 0).all():
            beta[active] = sub
            break
        active.pop(int(np.argmin(sub)))
    return beta


def _huber_fit(X: np.ndarray, y: np.ndarray, iters: int = 30) -> np.ndarray:
    """Huber IRLS, non-negative: a profile whose T, R and K move together (short warm-up prompts) otherwise
    trades a negative term against an inflated one, and that extrapolates badly to larger batches."""
    w = np.ones(len(y))
    beta = np.zeros(X.shape[1])
    for _ in range(iters):
        sw = np.sqrt(w)
        beta = nonnegative_lstsq(X * sw[:, None], y * sw)
        resid = y - X @ beta
        scale = 1.4826 * np.median(np.abs(resid - np.median(resid))) + 1e-12
        delta = 1.345 * scale  # 95% efficiency under Gaussian noise
        w_new = np.minimum(1.0, delta / np.maximum(np.abs(resid), 1e-15))
        if np.allclose(w_new, w):
            break
        w = w_new
    return beta


class EngineCostModel:
    def __init__(
        self,
        coef: tuple[float, float, float, float] = (0.01, 0.0, 0.0, 0.0),
        bucket_edges: list[int] | None = None,
        key: dict | None = None,
        forgetting: float = 0.995,
        outlier_k: float = 4.0,
        bucket_rate: float = 0.1,
        max_consecutive_rejects: int = 20,
    ):
        self.coef = [float(c) for c in coef]  # seconds, seconds/token, seconds/request, seconds/KV token
        self.bucket_edges = sorted(int(e) for e in bucket_edges) if bucket_edges else []
        self.bucket_offsets = [0.0] * (len(self.bucket_edges) + 1 if self.bucket_edges else 0)
        self.key = dict(key) if key else {}
        self.forgetting = forgetting
        self.outlier_k = outlier_k
        self.bucket_rate = bucket_rate
        self.max_consecutive_rejects = max_consecutive_rejects
        self.num_fit_samples = 0
        self.num_updates = 0
        self.num_rejected = 0
        self.num_regime_changes = 0
        self._consecutive_rejects = 0
        self._residual_scale: float | None = None  # robust scale (EWMA of |residual|), seconds
        self._rls_P = np.eye(4) * RLS_RESET_VARIANCE  # RLS inverse-covariance in scaled-feature space
        self._rls_beta: np.ndarray | None = None  # unconstrained RLS estimate (scaled); None: start from coef
        self.last_predicted_s: float | None = None
        self.last_measured_s: float | None = None

    # ------------------------------------------------------------------------------------------ prediction
    def _bucket_index(self, T) -> np.ndarray:
        return np.searchsorted(np.asarray(self.bucket_edges), np.asarray(T), side="left")

    def predict(self, T, R, K):
        """Predicted step seconds; accepts scalars, numpy arrays or torch tensors (broadcast)."""
        a, b, c, d = self.coef
        if isinstance(T, torch.Tensor):
            T64 = T.double()
            t = a + b * T64 + c * _as_float(R) + d * _as_float(K)
            if self.bucket_edges:
                edges = torch.tensor(self.bucket_edges, dtype=torch.float64, device=T.device)
                offsets = torch.tensor(self.bucket_offsets, dtype=torch.float64, device=T.device)
                # comparison-count instead of torch.bucketize: same bucket index, and it stays single-threaded
                # for a few thousand elements (bucketize's OpenMP region stalls for ms on a busy shared CPU)
                idx = (T64.unsqueeze(-1) > edges).sum(-1)
                t = t + offsets[idx]
            return t.clamp_min(MIN_STEP_S)
        t = a + b * np.asarray(T, float) + c * np.asarray(R, float) + d * np.asarray(K, float)
        if self.bucket_edges:
            t = t + np.asarray(self.bucket_offsets)[self._bucket_index(T)]
        t = np.maximum(t, MIN_STEP_S)
        return float(t) if np.ndim(t) == 0 else t

    def sps(self, T, R, K):
        """Steps per second = 1 / predicted step time."""
        return 1.0 / self.predict(T, R, K)

    def _linear(self, T, R, K) -> np.ndarray:
        return _features(T, R, K) @ (np.asarray(self.coef) * FEATURE_SCALE)

    # ------------------------------------------------------------------------------------------ offline fit
    def fit(self, samples: list[CostSample] | list[tuple[int, int, int, float]]) -> "EngineCostModel":
        rows = np.array([[s.verify_tokens, s.num_requests, s.kv_tokens, s.step_time_s] if isinstance(s, CostSample)
                         else list(s) for s in samples], dtype=float)
        if len(rows) < 4:
            raise ValueError(f"need at least 4 samples to fit 4 coefficients, got {len(rows)}")
        T, R, K, y = rows.T
        X = _features(T, R, K)
        beta = _huber_fit(X, y)
        self.coef = list(beta / FEATURE_SCALE)
        resid = y - X @ beta
        if self.bucket_edges:
            idx = self._bucket_index(T)
            self.bucket_offsets = [float(np.median(resid[idx == i])) if (idx == i).sum() >= 3 else 0.0
                                   for i in range(len(self.bucket_edges) + 1)]
            resid = resid - np.asarray(self.bucket_offsets)[idx]
        self._residual_scale = float(1.4826 * np.median(np.abs(resid))) + 1e-9
        self._rls_P = np.linalg.pinv(X.T @ X + 1e-9 * np.eye(4))
        self._rls_beta = None
        self.num_fit_samples = len(rows)
        return self

    # ------------------------------------------------------------------------------------------ online update
    def update(self, T: int, R: int, K: int, measured_s: float) -> bool:
        """Refine with one measured step; returns False when the sample was rejected as an outlier."""
        predicted = float(self.predict(T, R, K))
        self.last_predicted_s, self.last_measured_s = predicted, float(measured_s)
        resid = measured_s - predicted
        scale = self._residual_scale if self._residual_scale is not None else abs(resid)
        scale = max(scale, MIN_RELATIVE_SCALE * predicted)
        if abs(resid) > self.outlier_k * scale and self._consecutive_rejects < self.max_consecutive_rejects:
            self._consecutive_rejects += 1
            self.num_rejected += 1
            return False
        if abs(resid) > self.outlier_k * scale:
            # too many "outliers" in a row: the engine really changed speed. Forget the old fit quickly.
            self.num_regime_changes += 1
            self._rls_P = np.eye(4) * RLS_RESET_VARIANCE
            scale = abs(resid)
        self._consecutive_rejects = 0
        self.num_updates += 1
        self._residual_scale = 0.95 * scale + 0.05 * abs(resid)

        # RLS on the linear part: target = measured minus the current bucket offset
        x = _features(T, R, K)
        offset = self.bucket_offsets[int(self._bucket_index(T))] if self.bucket_edges else 0.0
        beta = self._rls_beta if self._rls_beta is not None else np.asarray(self.coef) * FEATURE_SCALE
        lam = self.forgetting
        Px = self._rls_P @ x
        gain = Px / (lam + x @ Px)
        err = (measured_s - offset) - x @ beta
        beta = beta + gain * err
        self._rls_P = (self._rls_P - np.outer(gain, Px)) / lam
        trace = np.trace(self._rls_P)
        if trace > MAX_RLS_TRACE:
            self._rls_P *= MAX_RLS_TRACE / trace
        # RLS runs unconstrained (projecting its state would stall convergence from a bad prior); predictions use
        # the estimate projected onto the physical region, where no term makes a step faster
        self._rls_beta = beta
        self.coef = list(np.maximum(beta, 0.0) / FEATURE_SCALE)
        if self.bucket_edges:
            i = int(self._bucket_index(T))
            bucket_resid = measured_s - float(self._linear(T, R, K))
            self.bucket_offsets[i] += self.bucket_rate * (bucket_resid - self.bucket_offsets[i])
        return True

    @property
    def predicted_vs_measured(self) -> tuple[float | None, float | None]:
        """(predicted, measured) seconds of the last update() call, for metrics."""
        return self.last_predicted_s, self.last_measured_s

    # ------------------------------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {
            "version": 1,
            "key": self.key,
            "coef": self.coef,
            "bucket_edges": self.bucket_edges,
            "bucket_offsets": self.bucket_offsets,
            "num_fit_samples": self.num_fit_samples,
        }

    def save(self, path: str | Path) -> None:
        missing = [f for f in KEY_FIELDS if f not in self.key]
        if missing:
            raise ValueError(f"cost model key lacks {missing}; a profile is only reusable on the same stack")
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path, expected_key: dict | None = None, **kwargs) -> "EngineCostModel":
        data = json.loads(Path(path).read_text())
        if data.get("version") != 1:
            raise ValueError(f"{path}: unsupported cost model version {data.get('version')!r}")
        coef = data.get("coef")
        if not isinstance(coef, list) or len(coef) != 4 or not all(math.isfinite(float(c)) for c in coef):
            raise ValueError(f"{path}: coef must be 4 finite numbers, got {coef!r}")
        edges, offsets = data.get("bucket_edges", []), data.get("bucket_offsets", [])
        if edges and len(offsets) != len(edges) + 1:
            raise ValueError(f"{path}: need len(bucket_edges)+1 offsets, got {len(edges)} edges {len(offsets)} offsets")
        key = data.get("key", {})
        if expected_key is not None:
            mismatched = {f: (key.get(f), expected_key.get(f)) for f in KEY_FIELDS if key.get(f) != expected_key.get(f)}
            if mismatched:
                raise ValueError(f"{path}: cost profile was measured on another stack (stored, expected): {mismatched}")
        model = cls(coef=tuple(coef), bucket_edges=edges, key=key, **kwargs)
        if edges:
            model.bucket_offsets = [float(o) for o in offsets]
        model.num_fit_samples = int(data.get("num_fit_samples", 0))
        return model
