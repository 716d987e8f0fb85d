"""Draft pass cost d0 + d1 * (requests drafted), learned online from the worker's timed draft passes.

Why the controller needs it: a request whose drafts get verified this step is drafted again next step (draft
skipping only skips requests kept at l = 0). In steady state, verifying a request therefore costs its share of a
draft pass every step, on top of the verify tokens. Under load (one draft pass per request is ~6 ms against a
~270 ms batch-16 decode step on the CPU engine) that share decides whether verifying a doubtful first draft pays.
"""

from __future__ import annotations

import numpy as np


class DraftCostModel:
    def __init__(self, d0: float = 0.0, d1: float = 0.0, forgetting: float = 0.98, min_samples: int = 8):
        self.d0, self.d1 = float(d0), float(d1)
        self.forgetting = forgetting
        self.min_samples = min_samples
        self.num_samples = 0
        self._xtx = np.zeros((2, 2))
        self._xty = np.zeros(2)

    def __call__(self, num_drafted: int) -> float:
        return self.d0 + self.d1 * num_drafted if num_drafted > 0 else 0.0

    def update(self, num_drafted: int, seconds: float) -> None:
        """One timed draft pass over `num_drafted` requests (0: nothing drafted, nothing learned)."""
        if num_drafted <= 0 or not seconds > 0:
            return
        x = np.array([1.0, float(num_drafted)])
        self._xtx = self.forgetting * self._xtx + np.outer(x, x)
        self._xty = self.forgetting * self._xty + x * seconds
        self.num_samples += 1
        if self.num_samples < self.min_samples:
            return
        if np.linalg.cond(self._xtx) < 1e8:  # batch sizes varied: separate the fixed and per-request parts
            d0, d1 = np.linalg.solve(self._xtx, self._xty)
            if d0 >= 0 and d1 >= 0:
                self.d0, self.d1 = float(d0), float(d1)
                return
        # one batch size so far (or a negative part): all of it per request
        self.d0, self.d1 = 0.0, float(self._xty[1] / self._xtx[1, 1] if self._xtx[1, 1] > 0 else 0.0)

    def to_dict(self) -> dict:
        return {"d0": self.d0, "d1": self.d1, "num_samples": self.num_samples}
