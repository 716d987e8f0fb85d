"""DSpark draft model, checkpoint format and STS calibration. Pure torch + safetensors (never imports sglang)."""

from .checkpoint import DrafterCheckpointError, load_drafter, save_drafter
from .config import DrafterConfigError, DSparkConfig, default_target_layer_ids
from .draft_vocab import DraftVocabError, build_draft_vocab, load_draft_vocab, save_draft_vocab
from .model import DSparkDraftModel, Proposal, block_labels, sample_anchors
from .sts import StsFileError, apply_sts, auroc, ece, fit_sts, fit_sts_affine, load_sts, load_sts_biases, save_sts

__all__ = [
    "DSparkConfig", "DrafterConfigError", "default_target_layer_ids",
    "DSparkDraftModel", "Proposal", "sample_anchors", "block_labels",
    "load_drafter", "save_drafter", "DrafterCheckpointError",
    "build_draft_vocab", "load_draft_vocab", "save_draft_vocab", "DraftVocabError",
    "fit_sts", "fit_sts_affine", "load_sts_biases", "apply_sts", "ece", "auroc", "save_sts", "load_sts", "StsFileError",
]
