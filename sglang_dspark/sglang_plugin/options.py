"""Our server flags (`--dspark-*`), shown in SGLang's own `--help`, carried to every SGLang process.

SGLang's ServerArgs is a closed dataclass, so our values do not ride on it: the launcher process parses them with
SGLang's parser (we add an argument group) and exports them as one JSON env var, which the scheduler processes
SGLang spawns inherit. `DSparkOptions.current()` reads them back anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields

ENV_VAR = "SGLANG_DSPARK_OPTIONS"
ALGORITHM_NAME = "DSPARK_EXT"


@dataclass
class DSparkOptions:
    gamma: int | None = None  # None: the drafter checkpoint's block_size
    controller: str = "dspark"
    sts_path: str | None = None  # None: sts.json next to the drafter, if any
    online_calibration: bool = False
    min_user_tps: float | None = None
    cost_model_path: str | None = None
    profile_cost_model: bool = True
    draft_skip: bool = True
    plain_decode_fast_path: bool = True  # a step verifying nothing anywhere runs SGLang's plain decode forward
    streak_peek: bool = True  # steps of a plain streak still look up retrieval chains (control.plain_decode)
    record_verify_lens: bool = False  # opt-in per-step verify lengths in meta_info
    draft_dtype: str | None = None  # None: same as the target
    chain_verify_attention: bool = True  # torch_native: verify attends only the chain's rows (verify_attention.py)
    full_draft_vocab: bool = False  # ignore draft_vocab.safetensors next to the drafter (A/B measurements)
    # Temperature drafts are sampled at for requests at T > 0 (capped at the request's own); None: the request's.
    # 0 (greedy drafts) is the default: verification stays exact for any draft distribution, and this drafter's
    # greedy drafts are accepted far more often at T = 1 than its T = 1 samples (BENCHMARKS.md, "Draft temperature").
    draft_temperature: float | None = 0.0
    # bf16 on a CPU without native bf16 dot products: small-M kernel, fp32 weight copies where wider (cpu_gemm.py)
    cpu_gemm: str = "auto"
    cpu_gemm_rows: int = 512  # the widest row count crossovers are measured at (a power of two, 64 to 4096)
    # Structured-output requests with point-mass drafts: "copy" drafts them from their grammar (forced tokens,
    # jump-forward text) and their prompt / output only, without a drafter pass; "model" runs the drafter for them too
    grammar_drafts: str = "copy"
    # Retrieval drafts beside the drafter's: "prompt" (the request's own prompt / output), "corpus" (recent outputs
    # of all requests), "both" or "off"; the controller picks one source per request and step
    retrieval: str = "both"
    # The n-gram table of the target's own answers that "corpus" draws on beside recent outputs: "auto" = the
    # drafter's ngram_table.npz where it ships one, "off", or a path
    ngram_table: str = "auto"
    model_drafts: bool = True  # False: retrieval drafts only, no drafter pass (A/B measurements)

    @classmethod
    def current(cls) -> "DSparkOptions":
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return cls()
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{ENV_VAR} has unknown keys {sorted(unknown)}")
        return cls(**data)

    def export(self) -> None:
        os.environ[ENV_VAR] = json.dumps(asdict(self))


def add_dspark_args(parser: argparse.ArgumentParser) -> None:
    if any(a.dest == "dspark_controller" for a in parser._actions):
        return
    g = parser.add_argument_group(
        "DSpark (sglang_dspark)",
        f"Options of the {ALGORITHM_NAME} speculative algorithm "
        f"(--speculative-algorithm {ALGORITHM_NAME} --speculative-draft-model-path DRAFTER).",
    )
    d = DSparkOptions()
    g.add_argument("--dspark-gamma", type=int, default=d.gamma,
                   help="Draft block length gamma (default: the drafter's block_size).")
    g.add_argument("--dspark-controller", type=str, default=d.controller,
                   help="Verify-length policy: dspark, dspark-async, sps-topk, fixed:G, threshold:C.")
    g.add_argument("--dspark-sts-path", type=str, default=d.sts_path,
                   help="Sequential temperature scaling JSON (default: sts.json next to the drafter).")
    g.add_argument("--dspark-online-calibration", action="store_true",
                   help="Refit the confidence temperatures from live outcomes when ECE drifts.")
    g.add_argument("--dspark-min-user-tps", type=float, default=d.min_user_tps,
                   help="SLA floor: keep each request's expected tokens/s above this when capacity allows.")
    g.add_argument("--dspark-cost-model-path", type=str, default=d.cost_model_path,
                   help="Engine cost model JSON to load instead of profiling at start.")
    g.add_argument("--dspark-no-profile", dest="dspark_profile_cost_model", action="store_false",
                   help="Do not profile the engine cost model at start (use a cached or default one).")
    g.add_argument("--dspark-grammar-drafts", choices=("copy", "model"), default=d.grammar_drafts,
                   help="Drafts of structured-output requests (greedy drafts): 'copy' = from the grammar (forced "
                        "tokens, jump-forward text) and the request's prompt / output only, no drafter pass for them; "
                        "'model' = the drafter too, its tokens checked against the grammar.")
    g.add_argument("--dspark-retrieval", choices=("off", "prompt", "corpus", "both"), default=d.retrieval,
                   help="Retrieval drafts beside the drafter's: 'prompt' = continuations copied from the request's own "
                        "prompt and output, 'corpus' = from recent outputs of all requests (SGLang's n-gram trie) "
                        "and the n-gram table of the target's own answers (--dspark-ngram-table), "
                        "'both' (default) or 'off'. Per request and step the controller verifies the source with the "
                        "better calibrated survival curve; a request whose retrieval chain is confident enough skips "
                        "the drafter pass. Per request: custom_params dspark_retrieval.")
    g.add_argument("--dspark-ngram-table", default=d.ngram_table, metavar="auto|off|PATH",
                   help="Static n-gram table of the target's own greedy answers, drawn on by the 'corpus' retrieval "
                        "source beside recent outputs: 'auto' (default) = the drafter's ngram_table.npz where it "
                        "ships one, 'off', or a file made by `python -m sglang_dspark.eval.retrieval_prior "
                        "--conversations ... --ngram-table`. A malformed file stops the server at start-up.")
    g.add_argument("--dspark-no-model-drafts", dest="dspark_model_drafts", action="store_false",
                   help="Retrieval drafts only: never run the drafter (A/B measurements).")
    g.add_argument("--dspark-no-draft-skip", dest="dspark_draft_skip", action="store_false",
                   help="Always draft, even when the controller expects to verify nothing.")
    g.add_argument("--dspark-no-fast-path", dest="dspark_plain_decode_fast_path", action="store_false",
                   help="Run steps that verify nothing through the ragged verify path too (for A/B measurements).")
    g.add_argument("--dspark-no-streak-peek", dest="dspark_streak_peek", action="store_false",
                   help="While plans keep verifying nothing, skip the retrieval lookups too (A/B measurements); by "
                        "default such steps still look up retrieval chains and verify a confident one.")
    g.add_argument("--dspark-sglang-verify-attention", dest="dspark_chain_verify_attention", action="store_false",
                   help="Run verify forwards through SGLang's own torch_native EXTEND attention (A/B measurements).")
    g.add_argument("--dspark-full-draft-vocab", action="store_true",
                   help="Draft over the full vocabulary even when the drafter ships draft_vocab.safetensors.")
    g.add_argument("--dspark-draft-temperature", type=_draft_temperature, default=d.draft_temperature,
                   help="Temperature drafts are sampled at for requests at T > 0, capped at the request's own: a "
                        "number >= 0 (0 = the drafter's argmax, the default) or 'request' (the request's temperature). "
                        "Lossless either way; it only changes how often drafts are accepted.")
    g.add_argument("--dspark-record-verify-lens", action="store_true",
                   help="Return the per-step verify lengths of each request in meta_info.")
    g.add_argument("--dspark-cpu-gemm", choices=("auto", "on", "off"), default=d.cpu_gemm,
                   help="bf16 models on a CPU: narrow GEMMs run our small-M bf16 kernel, wider ones from the "
                        "row count measured per shape where that is faster: an fp32 copy of the weights on CPUs "
                        "without native bf16 (the AVX2 kernel, or torch's bf16 GEMM where it cannot be built), "
                        "torch's bf16 GEMM on CPUs with AVX512-BF16 (the vdpbf16ps kernel). auto (default): on "
                        "CPUs without AVX512-BF16 / AMX and on CPUs with AVX512-BF16. Applies with or without "
                        "speculation.")
    g.add_argument("--dspark-cpu-gemm-rows", type=_cpu_gemm_rows, default=d.cpu_gemm_rows,
                   help="The widest row count (a power of two, 64 to 4096; default 512) at which each GEMM shape's "
                        "crossover is measured at first start on a CPU (cached per CPU afterwards). Wider counts "
                        "price prefill chunks too, where fp32 copies run the embedded model's GEMMs ~1.5-2.5x faster "
                        "on an AVX2 CPU, at a longer first start.")


def _draft_temperature(value: str) -> float | None:
    """The flag takes what custom_params.dspark_draft_temperature takes (one validator for both)."""
    from sglang_dspark.sglang_plugin.request_params import DRAFT_TEMPERATURE_KEY, REQUEST, validate_draft_temperature

    if value == REQUEST:
        return None
    try:
        t = float(value)
        validate_draft_temperature({DRAFT_TEMPERATURE_KEY: t})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0 or {REQUEST!r}, got {value!r}") from None
    return t


def _cpu_gemm_rows(value: str) -> int:
    try:
        rows = int(value)
    except ValueError:
        rows = 0
    if rows < 64 or rows > 4096 or rows & (rows - 1):
        raise argparse.ArgumentTypeError(f"expected a power of two from 64 to 4096, got {value!r}")
    return rows


def options_from_namespace(ns: argparse.Namespace) -> DSparkOptions:
    values = {}
    for f in fields(DSparkOptions):
        key = f"dspark_{f.name}"
        if hasattr(ns, key):
            values[f.name] = getattr(ns, key)
    return DSparkOptions(**values)


def add_launcher_args(parser: argparse.ArgumentParser) -> None:
    """Flags only `python -m sglang_dspark.launch_server` acts on (SGLang's own launcher ignores them)."""
    if any(a.dest == "no_dspark" for a in parser._actions):
        return
    g = parser.add_argument_group("sglang_dspark launcher")
    g.add_argument("--no-dspark", action="store_true",
                   help="Serve without speculative decoding (same as --speculative-algorithm NONE).")
