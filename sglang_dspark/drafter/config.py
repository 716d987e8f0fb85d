"""DSpark drafter config: the DeepSpec `config.json` format (reference §2.2), parsed and validated.

Our extension of the format: an optional boolean key `qk_norm`. DeepSpec only ships Qwen3 drafters, whose
attention always has per-head q/k RMSNorm. Qwen2 / Llama targets have no q/k norm (and Qwen2 has q/k/v biases,
expressed with the inherited `attention_bias` key), so a drafter shaped like such a target writes
`"qk_norm": false`. When the key is absent it defaults to True for `model_type` qwen3 (and unknown types) and
False for qwen2 / llama, so released DeepSpec checkpoints load unchanged.

`attention_bias=True` means q/k/v projections carry a bias and o_proj does not (the Qwen2 convention).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

ARCHITECTURE = "Qwen3DSparkModel"
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
_NO_QK_NORM_TYPES = ("qwen2", "llama", "mistral")


class DrafterConfigError(ValueError):
    """A drafter config.json is missing a key or holds a value we cannot build a model from."""


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """z-lab rule: `num_features` layer ids round-evenly spaced from 1 to L_t-3 (36 -> [1, 9, 17, 25, 33]).

    Tiny targets (L_t < 5) collapse the range; duplicates are dropped so the list stays strictly increasing.
    """
    if num_target_layers < 2:
        raise DrafterConfigError(f"num_target_layers={num_target_layers}: need at least 2 target layers")
    if num_features == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    span = end - start
    ids = [int(round(start + i * span / (num_features - 1))) for i in range(num_features)]
    return sorted(set(ids))


@dataclass
class DSparkConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_hidden_layers: int
    num_target_layers: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_anchors: int = 512
    markov_rank: int = 0
    markov_head_type: str | None = None
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    attention_bias: bool = False
    qk_norm: bool = True
    model_type: str = "qwen3"
    max_position_embeddings: int = 40960
    architectures: list[str] = field(default_factory=lambda: [ARCHITECTURE])
    # Every other key of the file (bos/eos ids, dtype, ...), kept so that to_json() round-trips.
    extra: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def confidence_in_features(self) -> int:
        return self.hidden_size + (self.markov_rank if self.confidence_uses_markov else 0)

    @property
    def confidence_uses_markov(self) -> bool:
        return self.enable_confidence_head and self.confidence_head_with_markov and self.markov_rank > 0

    # ------------------------------------------------------------------ validation
    def validate(self) -> "DSparkConfig":
        def need(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise DrafterConfigError(f"config key '{key}': {msg}")

        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "vocab_size", "num_hidden_layers", "num_target_layers", "block_size", "num_anchors"):
            v = getattr(self, key)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, key, f"must be a positive int, got {v!r}")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
             f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}")
        need(self.head_dim % 2 == 0, "head_dim", f"must be even for RoPE, got {self.head_dim}")
        need(isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0, "rms_norm_eps",
             f"must be > 0, got {self.rms_norm_eps!r}")
        need(isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0, "rope_theta",
             f"must be > 0, got {self.rope_theta!r}")
        need(isinstance(self.mask_token_id, int) and 0 <= self.mask_token_id < self.vocab_size, "mask_token_id",
             f"must be in [0, vocab_size={self.vocab_size}), got {self.mask_token_id!r}")
        ids = self.target_layer_ids
        need(isinstance(ids, list) and len(ids) > 0 and all(isinstance(i, int) for i in ids), "target_layer_ids",
             f"must be a non-empty list of ints, got {ids!r}")
        need(all(a < b for a, b in zip(ids, ids[1:])), "target_layer_ids", f"must be strictly increasing, got {ids}")
        need(all(i == -1 or 0 <= i < self.num_target_layers for i in ids), "target_layer_ids",
             f"each id must be -1 or in [0, num_target_layers={self.num_target_layers}), got {ids}")
        need(isinstance(self.markov_rank, int) and self.markov_rank >= 0, "markov_rank",
             f"must be an int >= 0, got {self.markov_rank!r}")
        if self.markov_rank > 0:
            need(self.markov_head_type in MARKOV_HEAD_TYPES, "markov_head_type",
                 f"must be one of {MARKOV_HEAD_TYPES} when markov_rank > 0, got {self.markov_head_type!r}")
        need(isinstance(self.architectures, list) and len(self.architectures) > 0
             and self.architectures[0] == ARCHITECTURE, "architectures",
             f"expected ['{ARCHITECTURE}'], got {self.architectures!r}")
        return self

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DSparkConfig":
        if not isinstance(d, dict):
            raise DrafterConfigError("config must be a JSON object")
        d = dict(d)

        def take(key: str, default: Any = ...) -> Any:
            if key in d:
                return d.pop(key)
            if default is ...:
                raise DrafterConfigError(f"config key '{key}' is missing")
            return default

        hidden = take("hidden_size")
        heads = take("num_attention_heads")
        rope_params = take("rope_parameters", None)
        rope_scaling = take("rope_scaling", None)
        legacy_theta = take("rope_theta", None)
        if isinstance(rope_params, dict) and "rope_theta" in rope_params:
            theta = rope_params["rope_theta"]
            rope_type = rope_params.get("rope_type", "default")
        elif legacy_theta is not None:
            theta = legacy_theta
            rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
        else:
            raise DrafterConfigError("config key 'rope_parameters.rope_theta' (or 'rope_theta') is missing")
        if rope_type not in ("default", None):
            raise DrafterConfigError(f"config key 'rope_parameters.rope_type': only 'default' RoPE is supported, "
                                     f"got {rope_type!r}")
        model_type = take("model_type", "qwen3")
        markov_rank = take("markov_rank")
        enable_conf = take("enable_confidence_head")
        head_dim = take("head_dim", None)
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=take("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=take("num_key_value_heads", heads),
            head_dim=head_dim if head_dim is not None else (hidden // heads if isinstance(hidden, int)
                                                             and isinstance(heads, int) and heads else 0),
            rms_norm_eps=take("rms_norm_eps"),
            rope_theta=theta,
            vocab_size=take("vocab_size"),
            num_hidden_layers=take("num_hidden_layers"),
            num_target_layers=take("num_target_layers"),
            block_size=take("block_size"),
            mask_token_id=take("mask_token_id"),
            target_layer_ids=take("target_layer_ids"),
            num_anchors=take("num_anchors"),
            markov_rank=markov_rank,
            markov_head_type=take("markov_head_type", None),
            enable_confidence_head=bool(enable_conf),
            confidence_head_with_markov=bool(take("confidence_head_with_markov", False)),
            attention_bias=bool(take("attention_bias", False)),
            qk_norm=bool(take("qk_norm", model_type not in _NO_QK_NORM_TYPES)),
            model_type=model_type,
            max_position_embeddings=take("max_position_embeddings", 40960),
            architectures=take("architectures"),
        )
        for derived in ("layer_types", "tie_word_embeddings"):
            d.pop(derived, None)
        cfg.extra = d
        return cfg.validate()

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "DSparkConfig":
        """Read `path` (a config.json, or a directory holding one)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path) as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise DrafterConfigError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(d, dict):
            raise DrafterConfigError(f"{path}: config must be a JSON object")
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        theta = d.pop("rope_theta")
        d["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
        d["layer_types"] = ["full_attention"] * self.num_hidden_layers
        d["tie_word_embeddings"] = False
        d["hidden_act"] = "silu"
        if self.markov_rank == 0:
            d.pop("markov_head_type")
        if not self.enable_confidence_head:
            d.pop("confidence_head_with_markov")
        out = dict(extra)
        out.update(d)
        return out

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    # ------------------------------------------------------------------ from a target
    @classmethod
    def for_target(
        cls,
        target_hf_config: dict[str, Any],
        num_layers: int = 5,
        block_size: int = 7,
        markov_rank: int = 256,
        intermediate_size: int | None = None,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        tokenizer_size: int | None = None,
        markov_head_type: str = "vanilla",
        enable_confidence_head: bool = True,
        confidence_head_with_markov: bool = True,
        num_anchors: int = 512,
        num_target_features: int | None = None,
        qk_norm: bool | None = None,
    ) -> "DSparkConfig":
        """Draft config shaped like one target layer (reference §1.1).

        mask_token_id: explicit value wins; else the first unused padded embedding row `tokenizer_size` when the
        target's vocab_size exceeds the tokenizer size (Qwen3: 151669); else DrafterConfigError.
        target_layer_ids: default is the z-lab rule with `num_target_features` (default num_layers) entries.
        """
        t = copy.deepcopy(target_hf_config)
        if "text_config" in t and "hidden_size" not in t:  # multimodal wrappers nest the LM config
            t = dict(t["text_config"])
        try:
            num_target_layers = t["num_hidden_layers"]
            vocab = t["vocab_size"]
        except KeyError as e:
            raise DrafterConfigError(f"target config key '{e.args[0]}' is missing") from e
        if mask_token_id is None:
            if tokenizer_size is not None and vocab > tokenizer_size:
                mask_token_id = tokenizer_size
            else:
                raise DrafterConfigError(
                    f"config key 'mask_token_id': target vocab_size={vocab} has no unused padded row beyond "
                    f"tokenizer size {tokenizer_size}; pass mask_token_id explicitly")
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(num_target_layers, num_target_features or num_layers)
        model_type = t.get("model_type", "qwen3")
        if qk_norm is None:
            qk_norm = model_type not in _NO_QK_NORM_TYPES
        attention_bias = bool(t.get("attention_bias", model_type == "qwen2"))
        drop = {"architectures", "num_hidden_layers", "block_size", "mask_token_id", "target_layer_ids",
                "num_anchors", "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "layer_types", "tie_word_embeddings", "auto_map",
                "use_sliding_window", "sliding_window", "max_window_layers", "attention_bias", "qk_norm",
                "num_target_layers", "intermediate_size"}
        d = {k: v for k, v in t.items() if k not in drop}
        d.update(
            architectures=[ARCHITECTURE],
            num_hidden_layers=num_layers,
            num_target_layers=num_target_layers,
            intermediate_size=intermediate_size or t["intermediate_size"],
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=list(target_layer_ids),
            num_anchors=num_anchors,
            markov_rank=markov_rank,
            enable_confidence_head=enable_confidence_head,
            confidence_head_with_markov=confidence_head_with_markov if enable_confidence_head else False,
            attention_bias=attention_bias,
            qk_norm=qk_norm,
        )
        if markov_rank > 0:
            d["markov_head_type"] = markov_head_type
        return cls.from_dict(d)
