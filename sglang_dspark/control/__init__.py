"""Verify-length control: cost model, calibration monitor and policies (pure torch/numpy, no SGLang)."""

from .base import BatchContext, StepOutcome, VerifyLengthPolicy, survival
from .calibration import CalibrationMonitor, fit_sts_grid
from .cost_model import CostSample, EngineCostModel
from .dspark import DSparkPolicy, algorithm1
from .draft_cost import DraftCostModel
from .draft_skip import BatchProbeGate, probe_due
from .dspark_async import DSparkAsyncPolicy
from .factory import make_policy
from .fixed import FixedPolicy
from .oracle import OraclePolicy
from .plain_decode import PlainDecodeGate
from .sla import SlaResult, apply_sla, unmet_floors
from .sps_topk import SpsTopKPolicy
from .threshold import ThresholdPolicy

__all__ = [
    "BatchContext",
    "CalibrationMonitor",
    "CostSample",
    "DSparkAsyncPolicy",
    "DSparkPolicy",
    "DraftCostModel",
    "EngineCostModel",
    "FixedPolicy",
    "OraclePolicy",
    "PlainDecodeGate",
    "SlaResult",
    "SpsTopKPolicy",
    "StepOutcome",
    "ThresholdPolicy",
    "VerifyLengthPolicy",
    "algorithm1",
    "apply_sla",
    "fit_sts_grid",
    "make_policy",
    "BatchProbeGate",
    "probe_due",
    "survival",
    "unmet_floors",
]
