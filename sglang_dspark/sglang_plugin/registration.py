"""Register DSPARK_EXT with SGLang's speculative-algorithm registry (the name DSPARK is SGLang's own)."""

from __future__ import annotations

import json
import os

from sglang_dspark.sglang_plugin.options import ALGORITHM_NAME, DSparkOptions

DEFAULT_GAMMA = 7


def _drafter_block_size(path: str | None) -> int | None:
    if not path:
        return None
    try:
        with open(os.path.join(path, "config.json")) as f:
            return int(json.load(f)["block_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return None  # the worker reports a broken checkpoint with the precise reason


def resolve_gamma(server_args) -> int:
    opts = DSparkOptions.current()
    block = _drafter_block_size(getattr(server_args, "speculative_draft_model_path", None))
    gamma = opts.gamma or block or DEFAULT_GAMMA
    if gamma < 1:
        raise ValueError(f"--dspark-gamma must be >= 1, got {gamma}")
    if block is not None and gamma > block:
        raise ValueError(f"--dspark-gamma {gamma} exceeds the drafter's block_size {block}")
    return gamma


def validate_server_args(server_args) -> None:
    """Refuse configurations the worker does not implement, with the reason, before any model loads."""
    sa = server_args
    if not getattr(sa, "speculative_draft_model_path", None):
        raise ValueError(f"{ALGORITHM_NAME} needs --speculative-draft-model-path (a DSpark drafter directory)")
    unsupported = {
        "pipeline parallelism (--pp-size > 1)": (getattr(sa, "pp_size", 1) or 1) > 1,
        # plain DP replicas need nothing from each other; dp-attention splits one batch's attention across DP
        # ranks, whose ragged verify layouts the worker does not exchange
        "--enable-dp-attention": bool(getattr(sa, "enable_dp_attention", False)),
        "--enable-mixed-chunk": bool(getattr(sa, "enable_mixed_chunk", False)),
        "LoRA": bool(getattr(sa, "enable_lora", False)),
        # the decode side gets no draft state from the prefill side for a custom algorithm (0.5.23's
        # build_disagg_draft_input returns None) and would run without speculation
        "PD disaggregation": str(getattr(sa, "disaggregation_mode", "null") or "null") != "null",
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ValueError(f"{ALGORITHM_NAME} does not support: {', '.join(bad)}")
    from sglang_dspark.control import EngineCostModel, make_policy

    make_policy(DSparkOptions.current().controller, EngineCostModel(), gamma=1)  # fails early on a bad spec


def register_algorithm() -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

    if get_spec(ALGORITHM_NAME) is not None:
        return

    class DSparkExtAlgo(CustomSpecAlgo):
        # 0.5.23's CustomSpecAlgo lacks these three, but the scheduler calls them unconditionally.
        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        def handle_server_args(self, server_args) -> None:
            gamma = resolve_gamma(server_args)
            # num_steps/num_draft_tokens size SGLang's per-step KV reserve and the output stride.
            server_args.speculative_num_steps = gamma
            server_args.speculative_eagle_topk = 1
            server_args.speculative_num_draft_tokens = gamma + 1
            # The verify pass is a ragged EXTEND; decode CUDA graphs would try to capture TARGET_VERIFY shapes.
            server_args.disable_overlap_schedule = True
            server_args.cuda_graph_backend_decode = "disabled"

    def factory(server_args):
        from sglang_dspark.sglang_plugin.worker import DSparkExtWorker

        return DSparkExtWorker

    SpeculativeAlgorithm.register(ALGORITHM_NAME, supports_overlap=False, validate_server_args=validate_server_args,
                                  spec_class=DSparkExtAlgo)(factory)
