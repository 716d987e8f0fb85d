"""make_policy: the one place that turns a --dspark-verify-policy string into a policy object."""

from .base import VerifyLengthPolicy
from .dspark import DSparkPolicy
from .dspark_async import DSparkAsyncPolicy
from .fixed import FixedPolicy
from .oracle import OraclePolicy
from .sps_topk import SpsTopKPolicy
from .threshold import ThresholdPolicy

SPECS = "fixed:<int>=0>, threshold:<float in [0,1]>, dspark, dspark-async, sps-topk, oracle, random[:<int>]"
NEEDS_COST_MODEL = {"dspark": DSparkPolicy, "dspark-async": DSparkAsyncPolicy, "oracle": OraclePolicy}


def make_policy(spec: str, cost_model=None, *, gamma: int) -> VerifyLengthPolicy:
    """Parse e.g. "fixed:7", "threshold:0.6", "dspark", "dspark-async", "sps-topk", "oracle"."""
    name, sep, arg = spec.strip().partition(":")
    name = name.strip().lower()
    if name == "random":
        from .random_len import RandomPolicy

        try:
            return RandomPolicy(gamma, int(arg) if arg.strip() else gamma)
        except ValueError:
            raise ValueError(f"policy {spec!r}: random takes an optional int, e.g. random:4") from None
    if name in ("fixed", "threshold"):
        if not sep or not arg.strip():
            raise ValueError(f"policy {spec!r}: {name} needs an argument, e.g. {name}:{'7' if name == 'fixed' else '0.6'}")
        try:
            value = int(arg) if name == "fixed" else float(arg)
        except ValueError:
            raise ValueError(f"policy {spec!r}: bad {name} argument {arg!r}; expected one of {SPECS}") from None
        if name == "fixed":
            if value < 0:
                raise ValueError(f"policy {spec!r}: fixed length must be >= 0")
            return FixedPolicy(gamma, value)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"policy {spec!r}: threshold must be in [0, 1]")
        return ThresholdPolicy(gamma, value)
    if name not in NEEDS_COST_MODEL and name != "sps-topk":
        raise ValueError(f"unknown verify-length policy {spec!r}; expected one of {SPECS}")
    if sep:
        raise ValueError(f"policy {spec!r}: {name!r} takes no argument; expected one of {SPECS}")
    if name in NEEDS_COST_MODEL or name == "sps-topk":
        if cost_model is None:
            raise ValueError(f"policy {spec!r} needs a cost model (profile the engine or load a cost JSON)")
        if name == "sps-topk":
            return SpsTopKPolicy(gamma, cost_model=cost_model)
        return NEEDS_COST_MODEL[name](gamma, cost_model)
    raise ValueError(f"unknown verify-length policy {spec!r}; expected one of {SPECS}")
