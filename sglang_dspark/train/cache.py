"""Target feature cache (our compact analogue of reference §4.3).

<dir>/manifest.json            {"format": "dspark-cache-v1", target, target_layer_ids, hidden_size, ...}
<dir>/shard-00000.safetensors  per sample i: "{i}.input_ids" int32 [S], "{i}.loss_mask" uint8 [S],
                               "{i}.hidden" bf16 [S, m*d] (raw target layer outputs, layer order of
                               target_layer_ids), "{i}.last_hidden" bf16 [S, d] (final-normed, lm_head input);
                               safetensors metadata "ids" = JSON list of the sample ids, in order.
Shards are written whole and renamed into place, so a killed capture loses at most one unflushed shard and a
rerun skips every sample id already stored. No logits are stored: `train targets` adds per-position top-k ids and
log-sum-exp in side files (train/target_stats.py), and fit recomputes the columns it needs with lm_head.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CACHE_FORMAT = "dspark-cache-v1"
SAMPLE_KEYS = ("input_ids", "loss_mask", "hidden", "last_hidden")
TARGET_KEYS = ("topk_ids", "lse")
_SHARD_RE = re.compile(r"shard-(\d{5})\.safetensors$")


def targets_path(shard_file: str) -> str:
    """The target-statistics side file of a shard (written by train/target_stats.py)."""
    return shard_file[: -len(".safetensors")] + ".targets.safetensors"


def is_holdout(sample_id: str, fraction: float) -> bool:
    """Deterministic train / held-out split by sample id (shared by fit and calibrate)."""
    if fraction <= 0:
        return False
    h = int(hashlib.md5(sample_id.encode()).hexdigest()[:8], 16)
    return (h % 100000) < fraction * 100000


def bytes_per_token(hidden_size: int, num_features: int) -> int:
    return (num_features + 1) * hidden_size * 2 + 4 + 1


class CacheWriter:
    def __init__(self, path: str, manifest: dict, shard_samples: int = 256) -> None:
        self.path, self.shard_samples = path, shard_samples
        os.makedirs(path, exist_ok=True)
        mpath = os.path.join(path, "manifest.json")
        if os.path.exists(mpath):
            with open(mpath) as f:
                old = json.load(f)
            for key in ("target_layer_ids", "hidden_size", "max_length"):
                if old.get(key) != manifest.get(key):
                    raise ValueError(f"{path}: existing cache has {key}={old.get(key)!r}, this run wants "
                                     f"{manifest.get(key)!r}; use a fresh directory")
        with open(mpath, "w") as f:
            json.dump({"format": CACHE_FORMAT, **manifest}, f, indent=2)
        self.done = set(CacheReader.stored_ids(path))
        self.next_shard = len(CacheReader.shard_files(path))
        self._buf: dict[str, torch.Tensor] = {}
        self._ids: list[str] = []

    def add(self, sample_id: str, input_ids, loss_mask, hidden: torch.Tensor, last_hidden: torch.Tensor) -> None:
        i = len(self._ids)
        self._buf[f"{i}.input_ids"] = torch.as_tensor(input_ids, dtype=torch.int32).flatten().contiguous()
        self._buf[f"{i}.loss_mask"] = torch.as_tensor(loss_mask, dtype=torch.uint8).flatten().contiguous()
        self._buf[f"{i}.hidden"] = hidden.detach().to("cpu", torch.bfloat16).contiguous()
        self._buf[f"{i}.last_hidden"] = last_hidden.detach().to("cpu", torch.bfloat16).contiguous()
        self._ids.append(sample_id)
        self.done.add(sample_id)
        if len(self._ids) >= self.shard_samples:
            self.flush()

    def flush(self) -> None:
        if not self._ids:
            return
        name = os.path.join(self.path, f"shard-{self.next_shard:05d}.safetensors")
        save_file(self._buf, name + ".tmp", metadata={"ids": json.dumps(self._ids)})
        os.replace(name + ".tmp", name)
        self.next_shard += 1
        self._buf, self._ids = {}, []


class CacheReader:
    def __init__(self, path: str) -> None:
        self.path = path
        with open(os.path.join(path, "manifest.json")) as f:
            self.manifest = json.load(f)
        if self.manifest.get("format") != CACHE_FORMAT:
            raise ValueError(f"{path}: manifest format is not {CACHE_FORMAT}")
        self.entries: list[tuple[str, int, str]] = []  # (shard file, index in shard, sample id)
        for fn in self.shard_files(path):
            for i, sid in enumerate(self._ids_of(fn)):
                self.entries.append((fn, i, sid))
        self._handles: dict[str, object] = {}

    @staticmethod
    def shard_files(path: str) -> list[str]:
        names = sorted(n for n in os.listdir(path) if _SHARD_RE.match(n)) if os.path.isdir(path) else []
        return [os.path.join(path, n) for n in names]

    @staticmethod
    def _ids_of(fn: str) -> list[str]:
        with safe_open(fn, framework="pt") as f:
            return json.loads(f.metadata()["ids"])

    @classmethod
    def stored_ids(cls, path: str) -> list[str]:
        return [sid for fn in cls.shard_files(path) for sid in cls._ids_of(fn)]

    def __len__(self) -> int:
        return len(self.entries)

    def sample_id(self, idx: int) -> str:
        return self.entries[idx][2]

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return self.read(idx)

    def read(self, idx: int, keys: tuple[str, ...] = SAMPLE_KEYS + TARGET_KEYS) -> dict[str, torch.Tensor]:
        """Sample `idx` with only `keys` loaded (target keys only when the side file exists)."""
        fn, i, sid = self.entries[idx]
        if fn not in self._handles:
            self._handles[fn] = safe_open(fn, framework="pt")
        f = self._handles[fn]
        out = {k: f.get_tensor(f"{i}.{k}") for k in keys if k in SAMPLE_KEYS}
        out["id"] = sid
        side = self._targets_handle(fn) if any(k in TARGET_KEYS for k in keys) else None
        if side is not None:  # target statistics (train/target_stats.py), when computed
            out.update({k: side.get_tensor(f"{i}.{k}") for k in keys if k in TARGET_KEYS})
        return out

    def _targets_handle(self, fn: str):
        key = fn + ":targets"
        if key not in self._handles:
            side = targets_path(fn)
            self._handles[key] = safe_open(side, framework="pt") if os.path.exists(side) else None
        return self._handles[key]

    @property
    def has_targets(self) -> bool:
        """Every shard has its target statistics file."""
        return bool(self.entries) and all(self._targets_handle(fn) is not None for fn in self.shard_files(self.path))

    def split(self, holdout_fraction: float) -> tuple[list[int], list[int]]:
        train, held = [], []
        for idx, (_, _, sid) in enumerate(self.entries):
            (held if is_holdout(sid, holdout_fraction) else train).append(idx)
        return train, held
