"""DSPARK_EXT speculative worker (SGLang 0.5.23 V2 worker schema, overlap off).

One decode step for R running requests:
  draft   : our drafter proposes gamma tokens per request from its slot-indexed context pool (one backbone pass,
            then the sequential Markov head) with per-position confidences; beside it, retrieval chains (the
            request's own prompt / output, recent outputs of all requests) with calibrated confidences of their own;
            a request whose retrieval chain beats what the drafter usually offers is left out of the draft pass;
  plan    : per request, the proposal with the better survival curve (drafter block or retrieval chain); then a
            controller picks l_r in [0, gamma] from calibrated confidences and the engine cost model;
  verify  : ONE ragged target EXTEND forward over sum_r(1 + l_r) tokens, capturing the drafter's target layers;
  accept  : greedy prefix match, or rejection sampling against SGLang's processed target distribution;
  commit  : accepted tokens + bonus go back to the scheduler, which appends them and moves the KV length;
            the drafter context of every verified slot is (re)written (deferred to the next draft, see
            context_pool.py); rejected slots lie past the committed length and get overwritten next step.
A drafter failure (exception or non-finite output) makes that step a plain decode step (all l_r = 0).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch
from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessorOutput
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

from sglang_dspark.control import (BatchContext, BatchProbeGate, CalibrationMonitor, DraftCostModel, PlainDecodeGate,
                                   StepOutcome, make_policy, survival, unmet_floors)
from sglang_dspark.control.draft_skip import draft_mask
from sglang_dspark.control.draft_value import PRICED_DRAFTING_POLICIES, drafting_pays, step_prices
from sglang_dspark.control.plain_decode import PlainStreak, is_gated, peek_worthy
from sglang_dspark.control.source_choice import choose_retrieval, proposal_value, skip_drafting
from sglang_dspark.metrics.prometheus import DSparkMetrics, scheduler_labels
from sglang_dspark.sglang_plugin import cpu_gemm
from sglang_dspark.sglang_plugin.context_pool import DraftContextPool
from sglang_dspark.sglang_plugin.cost_profile import CostModelManager, cost_key, verify_attention_kind
from sglang_dspark.sglang_plugin.drafter_setup import load_drafter_for_target
from sglang_dspark.sglang_plugin.grammar import (CopySources, GrammarDrafts, batch_grammars, mask_verify_rows,
                                                 walk_drafts)
from sglang_dspark.sglang_plugin.options import DSparkOptions
from sglang_dspark.sglang_plugin.rank_sync import RankSync
from sglang_dspark.sglang_plugin.request_params import draft_temperature_caps, request_floors, verify_caps
from sglang_dspark.sglang_plugin.retrieval_drafts import RetrievalDrafter, RetrievalProposal, token_context
from sglang_dspark.sglang_plugin.state import DSparkDraftState
from sglang_dspark.sglang_plugin.target_sampling import (apply_custom_processors, custom_processor_rows,
                                                         processed_logits, sample_plain, samples_plain_itself)
from sglang_dspark.sglang_plugin.stats import SOURCE_DRAFTER, StepStats, StepTrace, WorkerCounters
from sglang_dspark.sglang_plugin.step_profile import StepProfiler, install_module_sections, section
from sglang_dspark.sglang_plugin.verify_attention import install_chain_verify, verify_attention
from sglang_dspark.sglang_plugin.verify_batch import (rewrite_as_plain_decode, rewrite_as_verify_extend,
                                                      skip_sampled_logits)
from sglang_dspark.verify import accept_greedy
from sglang_dspark.verify.result import AcceptResult, assemble_result

try:  # dspark_kernels/ ships with this package; Triton may be missing (CPU-only installs without it)
    from dspark_kernels._rng import HAS_TRITON as _HAS_TRITON
except ImportError:
    _HAS_TRITON = False
from sglang_dspark.verify.support import DraftDistribution, accept_rejection_packed, target_support

logger = logging.getLogger(__name__)




# Price of a verify token, in accepted tokens, when choosing a request's proposal (control/source_choice.py). 0: each
# proposal is valued by its whole expected accepted length and the verify-length policy alone trades tokens against
# the cost model. (A cost-model price kept chains whose cells had not learnt yet from ever being verified, and
# measured 0.94x none at c = 8-16: BENCHMARKS.md.)
SOURCE_TOKEN_PRICE = 0.0

# the retrieval ECE gauges are recomputed at most this often: over three sources and seven positions they cost ~1 ms,
# over 1% of a 2-core c = 1 step, and a scrape reads them every few seconds at most
RETRIEVAL_ECE_REFRESH_S = 1.0


class DrafterFailure(RuntimeError):
    pass


class DSparkExtWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        self.device = self.model_runner.device
        self.options = DSparkOptions.current()
        spec = get_spec()
        self.gamma = int(spec.speculative_num_steps)
        self.stride = int(spec.speculative_num_draft_tokens)
        model = self.model_runner.model
        self.drafter, sts = load_drafter_for_target(server_args.speculative_draft_model_path, model,
                                                     self.model_runner.model_config, self.options, self.device)
        if self.drafter.block_size < self.gamma:
            raise ValueError(f"DSPARK_EXT: gamma {self.gamma} exceeds the drafter's block_size "
                             f"{self.drafter.block_size}")
        ids = list(self.drafter.config.target_layer_ids)
        setter = getattr(model, "set_dflash_layers_to_capture", None) or getattr(
            model, "set_eagle3_layers_to_capture", None)
        if setter is None:
            raise ValueError(f"DSPARK_EXT: target model {type(model).__name__} cannot capture aux hidden states")
        setter(ids)
        model.logits_processor.keep_last_hidden_states = True
        self.num_features = len(ids)

        g = self.gamma
        self.calibration = CalibrationMonitor(
            g, online=self.options.online_calibration,
            temperatures=(sts.temperatures or [1.0] * self.drafter.block_size)[:g],
            temperatures_sampled=None if sts.temperatures_sampled is None else sts.temperatures_sampled[:g],
            biases=None if sts.biases is None else sts.biases[:g],
            biases_sampled=None if sts.biases_sampled is None else sts.biases_sampled[:g])
        sa = server_args
        tp_size = int(getattr(sa, "tp_size", 1) or 1)
        self.sync = RankSync.from_sglang(tp_size)  # under TP rank 0 decides; the others adopt (rank_sync.py)
        attention = verify_attention_kind(getattr(sa, "attention_backend", None), self.options.chain_verify_attention)
        self.costs = CostModelManager(cost_key(sa.model_path, self.model_runner.model_config.dtype, self.device,
                                               attention, cpu_gemm.engine_cost_tag(), tp_size=tp_size),
                                      self.options.cost_model_path, self.options.profile_cost_model,
                                      writes_files=self.sync.authoritative)
        self.cost_model = self.costs.model
        self.policy = make_policy(self.options.controller, self.cost_model, gamma=self.gamma)
        self.draft_cost = DraftCostModel()
        self.probe_gate = BatchProbeGate()
        # dspark / dspark-async keep drafting for a request only while its verification saves more than its draft
        # pass (control/draft_value.py); the other policies keep the plain rule "verified something" (A/B baselines)
        self.prices_drafting = self.options.controller.split(":")[0] in PRICED_DRAFTING_POLICIES
        self.profile_policy = make_policy(f"random:{self.gamma}", None, gamma=self.gamma)
        # cost-aware controllers may also choose plain decoding for the whole batch (see is_gated)
        gated = self.options.plain_decode_fast_path and is_gated(self.options.controller)
        self.plain_gate = PlainDecodeGate() if gated else None
        # no plan while plans keep verifying nothing (the gate or the policy choosing plain decoding)
        self.plain_streak = PlainStreak() if self.options.plain_decode_fast_path else None
        self._batch_rids: set = set()
        self.counters = WorkerCounters()
        self.context_pool: DraftContextPool | None = None
        trace_path = os.environ.get("SGLANG_DSPARK_TRACE_PATH")
        self.trace = StepTrace(trace_path) if trace_path and self.sync.authoritative else None
        self.step_index = 0
        self._proposal = None  # the last draft pass's Proposal, for grammar walks (_draft_scores)
        self._hf_tokenizer = None  # loaded on the first grammar step (_tokenizer)
        self._chain_verify_checked = False
        # with --dspark-retrieval off a request may still ask for prompt lookup (custom_params dspark_retrieval)
        self.retrieval = RetrievalDrafter(self.gamma, self.options.retrieval, server_args.speculative_draft_model_path,
                                          self.options.ngram_table)
        # smoothed expected accepted drafts of a drafted request (calibrated survival sum): the bar a retrieval chain
        # must clear for its request to skip the draft pass (None until the drafter has drafted once)
        self.drafter_expected: float | None = None
        self.profiler = StepProfiler.from_env()
        self.metrics = _create_metrics(server_args, self.gamma, self.options.controller)
        self._retrieval_ece_due = 0.0  # time.monotonic() of the next retrieval ECE refresh
        # Fault injection for tests: the first N decode steps get non-finite drafter output.
        self.inject_nan_steps = int(os.environ.get("SGLANG_DSPARK_INJECT_NAN_STEPS", "0"))
        logger.info("DSPARK_EXT worker: gamma=%d controller=%s drafter layers=%d target_layer_ids=%s",
                    self.gamma, self.options.controller, self.drafter.config.num_hidden_layers, ids)

    # ------------------------------------------------------------------ lifecycle
    def alloc_memory_pool(self, *args, **kwargs):
        out = super().alloc_memory_pool(*args, **kwargs)
        allocator = self.token_to_kv_pool_allocator
        num_slots = allocator.size + max(getattr(allocator, "page_size", 1), 1) + 1
        self.context_pool = DraftContextPool(self.drafter, num_slots, self.device, self.drafter.fc.weight.dtype)
        logger.info("DSPARK_EXT drafter context pool: %d slots, %.1f MB", num_slots, self.context_pool.bytes / 2**20)
        return out

    # ------------------------------------------------------------------ per step
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, *, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend():
            result = self._prefill(batch)
        elif batch.forward_mode.is_decode():
            if self.profiler is not None:
                if self.profiler.step == 0:  # the attention backend exists only once the server is up
                    install_module_sections(self.model_runner)
                self.profiler.before_step()
            result = self._decode(batch)
            if self.profiler is not None:
                self.profiler.after_step()
        else:
            raise NotImplementedError(f"DSPARK_EXT: forward mode {batch.forward_mode} is not supported")
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    def _prefill(self, batch) -> GenerationBatchResult:
        res = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        out = res.logits_output
        prefix = torch.tensor(batch.prefix_lens, dtype=torch.int64)
        ext = torch.tensor(batch.extend_lens, dtype=torch.int64)
        rows = torch.repeat_interleave(torch.arange(len(ext)), ext)
        starts = torch.cumsum(ext, 0) - ext
        positions = prefix[rows] + torch.arange(int(ext.sum())) - starts[rows]
        self.context_pool.write(batch.out_cache_loc, positions.to(self.device), self._features(out))
        out.hidden_states = None
        out.last_hidden_states = None
        bs = len(batch.reqs)
        if out.customized_info is None:
            out.customized_info = StepStats.prefill_customized_info(bs, self.options.record_verify_lens)
        return GenerationBatchResult(
            logits_output=out, next_token_ids=res.next_token_ids,
            accept_lens=torch.ones(bs, dtype=torch.int32), new_seq_lens=batch.seq_lens,
            next_draft_input=DSparkDraftState(res.next_token_ids.clone()),
            speculative_num_draft_tokens=self.stride, can_run_cuda_graph=res.can_run_cuda_graph,
        )

    def _features(self, out) -> torch.Tensor:
        feats = out.hidden_states
        d = self.drafter.config.hidden_size
        if feats is None or feats.shape[-1] != self.num_features * d:
            raise RuntimeError(f"DSPARK_EXT: expected captured features of width {self.num_features * d}, got "
                               f"{None if feats is None else tuple(feats.shape)}")
        return feats

    def _draft(self, batch, anchors, committed, draft_temps, active: torch.Tensor, all_greedy: bool | None):
        """Draft for the requests in `active` (indices); the others get empty proposals. `all_greedy`: known on
        the host that every draft temperature is 0 (saves device syncs on a GPU), or None."""
        t0 = time.perf_counter()
        bs, G = len(anchors), self.gamma
        tokens = torch.zeros(bs, G, dtype=torch.int64, device=self.device)
        conf = torch.full((bs, G), -30.0, dtype=torch.float32, device=self.device)  # sigmoid -> ~0: verify none
        q = None
        self._proposal = None
        if len(active):
            a = active.to(self.device)
            k, v, valid = self.context_pool.gather(self.req_to_token_pool.req_to_token,
                                                   batch.req_pool_indices[a], committed[a])
            prop = self.drafter.propose(anchors[a], committed[a], k, v, valid, draft_temps[a], all_greedy=all_greedy)
            sub_logits = prop.logits[:, :G]
            if self.inject_nan_steps > 0:
                self.inject_nan_steps -= 1
                sub_logits = torch.full_like(sub_logits, float("nan"))
            # one reduction instead of an elementwise isfinite over [R, G, V]: any NaN / inf makes the sum non-finite
            if not (torch.isfinite(sub_logits.sum()) and torch.isfinite(prop.conf_logits).all()):
                raise DrafterFailure("non-finite drafter output")
            tokens[a] = prop.tokens[:, :G]
            conf[a] = prop.conf_logits[:, :G]
            self._proposal = (prop, {int(r): n for n, r in enumerate(a.tolist())})
            if not all_greedy and bool((draft_temps[a] > 0).any()):  # only sampled drafts need q
                rows = torch.full((bs,), -1, dtype=torch.int64, device=self.device)
                rows[a] = torch.arange(len(a), device=self.device)
                q = DraftDistribution(prop.logits[:, :G], draft_temps, rows, prop.vocab)
        return tokens, q, conf, time.perf_counter() - t0

    def _retrieve(self, batch, caps: torch.Tensor | None, grammar_rows) -> RetrievalProposal | None:
        """Retrieval chains for the requests that may speculate and have no grammar (the walk copies for those)."""
        self.retrieval.observe_batch(batch.reqs)
        eligible = torch.ones(len(batch.reqs), dtype=torch.bool)
        if caps is not None:
            eligible &= caps != 0
        for i, _ in grammar_rows:
            eligible[i] = False
        processor_rows = custom_processor_rows(batch.sampling_info, len(batch.reqs))
        if processor_rows is not None:
            eligible &= ~processor_rows.cpu()
        if not bool(eligible.any()):
            return None
        try:
            return self.retrieval.propose(batch.reqs, eligible)
        except Exception:  # retrieval is an extra: its failure leaves the drafter's proposals
            logger.exception("DSPARK_EXT retrieval drafts failed; drafter only for this step")
            return None

    def _choose_sources(self, retrieval: RetrievalProposal | None, active: torch.Tensor, bs: int, conf: torch.Tensor,
                        stats: StepStats) -> torch.Tensor | None:
        """Bool[R] requests that verify their retrieval chain this step (control/source_choice.py: the proposal
        worth more at this step's verify-token price). Records the source per request in stats and refreshes the
        drafter's smoothed worth, the bar for draft skipping."""
        drafted = _mask(active, bs)
        price = SOURCE_TOKEN_PRICE
        conf_cpu = conf.detach().float().cpu()
        if bool(drafted.any()):
            mean = float(proposal_value(conf_cpu[drafted], price).mean())
            self.drafter_expected = mean if self.drafter_expected is None else 0.9 * self.drafter_expected + 0.1 * mean
        stats.sources = [SOURCE_DRAFTER if d else -1 for d in drafted.tolist()]
        if retrieval is None:
            return None
        used = choose_retrieval(conf_cpu, drafted, retrieval.probs, retrieval.has(), price, retrieval.unexplored)
        if not bool(used.any()):
            return None
        for i in torch.nonzero(used).view(-1).tolist():
            stats.sources[i] = retrieval.candidates[i].source
        return used

    def _verify_backend(self):
        """The target's attention backend, switched (once) to chain-only verify attention where we have one."""
        backend = self.model_runner.attn_backend
        if not self._chain_verify_checked:
            self._chain_verify_checked = True
            if self.options.chain_verify_attention and install_chain_verify(backend):
                logger.info("DSPARK_EXT: verify forwards use chain-only SDPA attention (torch_native backend)")
        return backend

    def _draft_active(self, state: DSparkDraftState, caps: torch.Tensor | None, batch,
                      draft_temps: torch.Tensor, retrieval: RetrievalProposal | None = None) -> torch.Tensor:
        """Requests to draft for: skip those the controller recently gave nothing, re-probing every few steps, those
        that asked for no speculation (caps: verify_caps, custom_params dspark_max_verify = 0), and, with
        --dspark-grammar-drafts copy, structured-output requests with point-mass drafts (their grammar and their
        prompt / output draft for them: grammar.walk_drafts), and those whose retrieval chain is expected to accept at
        least as many drafts as the drafter's block usually does (no drafter pass at all with --dspark-no-model-drafts)."""
        if not self.options.model_drafts:
            return torch.zeros(0, dtype=torch.int64)
        bs = len(state.zero_streak)
        chain_worthier = None
        if retrieval is not None:
            chain_worthier = skip_drafting(retrieval.probs, retrieval.has(), self.drafter_expected, SOURCE_TOKEN_PRICE)
        copied = None
        if self.options.grammar_drafts == "copy":
            copied = torch.tensor([getattr(r, "grammar", None) is not None for r in batch.reqs], dtype=torch.bool)
            copied &= (draft_temps == 0).cpu()
        probe = self.probe_gate.active(state.zero_streak, self.step_index) if self.options.draft_skip else None
        no_speculation = None if caps is None else caps == 0
        active = draft_mask(bs, probe=probe, chain_worthier=chain_worthier, no_speculation=no_speculation,
                            grammar_copied=copied)
        return torch.nonzero(active).view(-1)

    def _decode(self, batch) -> GenerationBatchResult:
        bs = len(batch.reqs)
        state: DSparkDraftState = batch.spec_info
        anchors = state.anchors.to(self.device)
        committed = batch.seq_lens_cpu.to(torch.int64)
        committed_dev = committed.to(self.device)
        si = batch.sampling_info
        greedy = (si.top_ks.view(-1) == 1).to(self.device)
        temps = si.temperatures.view(-1).to(self.device)
        caps_host = draft_temperature_caps(batch.reqs, self.options.draft_temperature)
        all_greedy = True if bool((caps_host == 0).all()) else None  # the default: greedy drafts at every T
        caps = caps_host.to(self.device, temps.dtype)
        capped = torch.minimum(temps, caps)
        draft_temps = torch.where(greedy, torch.zeros_like(temps), capped)
        sampled = ~greedy  # the target samples: STS has a separate set for this acceptance rule
        stats = StepStats(bs)

        fallback = None
        grammar_rows = batch_grammars(batch.reqs)
        fast_path = self.options.plain_decode_fast_path and not self.costs.profiling
        rids = {r.rid for r in batch.reqs}
        joined, self._batch_rids = not rids <= self._batch_rids, rids
        unplanned = (fast_path and self.plain_streak is not None and not grammar_rows
                     and self.plain_streak.skip(self.step_index, joined))
        caps = verify_caps(batch.reqs)
        retrieval, looked, peeked = None, False, False
        if unplanned and self.options.streak_peek:  # a chain being copied is worth planning for, streak or not
            retrieval, looked = self._retrieve(batch, caps, grammar_rows), True
            peeked = retrieval is not None and peek_worthy(retrieval.probs, retrieval.has())
            unplanned = not peeked
        if self.sync.flag(unplanned):  # plans kept verifying nothing: no drafts or plan this step
            if not looked:
                self.retrieval.observe_batch(batch.reqs)
            stats.drafted, stats.unplanned = [0] * bs, True
            return self._plain_decode(batch, state, anchors, committed, torch.zeros(bs, dtype=torch.int64), stats,
                                      None, None, None)
        if not looked:
            retrieval = self._retrieve(batch, caps, grammar_rows)
        # a peek verifies retrieval chains only: the streak says the drafter's blocks are not worth a draft pass now
        active = (torch.zeros(0, dtype=torch.int64) if peeked
                  else self._draft_active(state, caps, batch, draft_temps, retrieval))
        stats.drafted = [0] * bs
        for i in active.tolist():
            stats.drafted[i] = 1
        if self.sync.flag(fast_path and len(active) == 0 and not grammar_rows and retrieval is None):  # nothing
            # drafted or forced (on rank 0: every TP rank takes the same path)
            if self.plain_streak is not None:
                self.plain_streak.observe(self.step_index, 0)
            return self._plain_decode(batch, state, anchors, committed, torch.zeros(bs, dtype=torch.int64), stats,
                                      None, None, None)
        prof = self.profiler is not None
        try:
            with section("dspark.draft", prof):
                drafts, draft_dist, conf_logits, stats.draft_s = self._draft(batch, anchors, committed_dev,
                                                                               draft_temps, active, all_greedy)
        except Exception as e:  # a broken drafter must never take the request down with it
            fallback = "nan" if isinstance(e, DrafterFailure) else "exception"
            if fallback == "exception":
                logger.exception("DSPARK_EXT drafter failed; plain decoding for this step")
            drafts = torch.zeros(bs, self.gamma, dtype=torch.int64, device=self.device)
            draft_dist, conf_logits = None, None

        grammar = None
        if grammar_rows:
            drafts, conf_logits, grammar = self._walk_grammars(batch, drafts, conf_logits, active, draft_temps,
                                                               fallback is None)
            stats.grammar_requests, stats.grammar_forced = len(grammar_rows), grammar.forced
            stats.grammar_replaced, stats.grammar_copied = grammar.replaced, grammar.jump + grammar.lookup
        if fallback is None:
            if self.sync.authoritative:  # under TP only rank 0's models learn: they alone decide
                self.draft_cost.update(len(active), stats.draft_s)
            conf = self.calibration.calibrate(conf_logits, sampled=sampled)
            used = self._choose_sources(retrieval, active, bs, conf, stats)
            if used is not None:
                drafts = torch.where(used.view(-1, 1).to(drafts.device), retrieval.tokens.to(drafts.device), drafts)
                conf = torch.where(used.view(-1, 1).to(conf.device), retrieval.probs.to(conf.device, conf.dtype), conf)
                if draft_dist is not None:  # retrieval drafts are point masses
                    draft_dist = DraftDistribution(draft_dist.logits, torch.where(
                        used.to(draft_dist.temperature.device), torch.zeros_like(draft_dist.temperature),
                        draft_dist.temperature), draft_dist.rows, draft_dist.vocab)
            plain_s = (self.plain_gate.plain_step_s(bs, self.cost_model, int(committed.sum()))
                       if self.plain_gate is not None and not self.costs.profiling else None)
            ctx = BatchContext(num_requests=bs, kv_lens=committed, step_index=self.step_index,
                               temperatures=draft_temps, last_step_time_s=self.counters.last_step_s,
                               min_user_tps=request_floors(batch.reqs, self.options.min_user_tps),
                               plain_step_s=plain_s,
                               verify_scale=1.0 if self.plain_gate is None else self.plain_gate.kappa)
            policy = self.profile_policy if self.costs.profiling else self.policy
            verify_lens = policy.choose(conf.cpu(), ctx).to(torch.int64).clamp(0, self.gamma)
            proposed = _mask(active, bs)  # drafted for, or drafted by their grammar / prompt (walk_drafts)
            if grammar is not None:
                proposed |= grammar.proposed(bs)
            if used is not None:
                proposed |= used
            verify_lens = torch.where(proposed, verify_lens, torch.zeros_like(verify_lens))
            verify_lens = self._restrict(batch, verify_lens, caps, grammar)
            if used is not None:  # never past a retrieval chain's end, whatever the policy (fixed:G baselines)
                chain = (retrieval.probs > 0).sum(1).to(verify_lens.dtype)
                verify_lens = torch.where(used, torch.minimum(verify_lens, chain), verify_lens)
            if self.plain_gate is not None and not self.costs.profiling:
                verify_lens = self.plain_gate.choose(verify_lens, conf, self.cost_model, int(committed.sum()))
            if ctx.min_user_tps is not None:  # whatever the policy: say when a floor is out of reach this step
                unmet, _ = unmet_floors(verify_lens, survival(conf.cpu()), ctx.min_user_tps, int(committed.sum()),
                                        self.cost_model)
                stats.sla_floored = int((ctx.min_user_tps > 0).sum())  # NaN (no floor) compares False
                stats.sla_unsatisfied = int(unmet.sum())
        else:
            verify_lens = torch.zeros(bs, dtype=torch.int64)
            used = None
        if self.sync.enabled:  # every TP rank verifies rank 0's drafts over rank 0's lengths
            verify_lens, drafts = self.sync.ints(verify_lens, drafts)
        # the drafter's own value: a step that verified a retrieval chain says nothing about drafting that request
        drafter_lens = verify_lens if used is None else torch.where(used, torch.zeros_like(verify_lens), verify_lens)

        useful, savings = self._drafting_useful(state, drafter_lens, None if fallback else conf, active,
                                                int(committed.sum()))
        if fallback is None:
            self.probe_gate.observe(self.step_index, len(active), int(useful.sum()))
        if self.plain_streak is not None:
            if peeked:
                self.plain_streak.observe_peek(int(verify_lens.sum()))
            else:
                self.plain_streak.observe(self.step_index, int(verify_lens.sum()))
        stats.peeked = peeked
        # (while profiling the verify cost curve, l = 0 steps are verify samples too: T = R anchors the fit)
        if self.sync.flag(fast_path and int(verify_lens.sum()) == 0):
            return self._plain_decode(batch, state, anchors, committed, verify_lens, stats, fallback, conf_logits,
                                      None if fallback else conf, (useful, savings))

        want_logprob = bool(batch.return_logprob)
        t0 = time.perf_counter()
        r2t = self.req_to_token_pool.req_to_token
        slots, positions, rows = rewrite_as_verify_extend(batch, r2t, anchors, drafts, verify_lens.to(self.device),
                                                          committed)
        model = self.model_runner.model
        with verify_attention(self._verify_backend()), skip_sampled_logits(model.logits_processor,
                                                                            self.drafter.config.vocab_size), \
                section("dspark.verify_forward", prof):
            res = self.target_worker.forward_batch_generation(batch, is_verify=True,
                                                              capture_hidden_mode=CaptureHiddenMode.FULL)
        out = res.logits_output
        with section("dspark.verify_logits", prof):
            logits = model.logits_processor._get_logits(out.last_hidden_states, model.lm_head,
                                                        LogitsMetadata(forward_mode=ForwardMode.DECODE))
        processed = processed_logits(logits, si, rows)
        if grammar is not None:
            mask_verify_rows(processed, verify_lens, grammar)
        if getattr(si, "has_custom_logit_processor", False):
            apply_custom_processors(processed, verify_lens, si)
        with section("dspark.accept", prof):
            accept = self._accept(processed, rows, verify_lens, drafts, draft_dist, si)
            if self.sync.enabled:  # sampled acceptance draws per rank: rank 0's outcome is the one committed
                a, b, o, n = self.sync.ints(accept.accept_lens, accept.bonus_tokens, accept.output_tokens,
                                            accept.num_output)
                accept = dataclasses.replace(accept, accept_lens=a, bonus_tokens=b, output_tokens=o, num_output=n)
        with section("dspark.context_write", prof):
            self.context_pool.defer(slots, positions, self._features(out))
        if torch.device(self.device).type == "cuda":  # time the GPU work, not the launch
            torch.cuda.synchronize()
        stats.verify_s = time.perf_counter() - t0
        if self.sync.authoritative:
            self.costs.record(int(len(slots)), bs, int(committed.sum()), stats.verify_s)
        if self.plain_gate is not None and not self.costs.profiling and self.sync.authoritative:  # before
            # policy.observe refines the model
            self.plain_gate.observe_verify(stats.verify_s,
                                           float(self.cost_model.predict(int(len(slots)), bs, int(committed.sum()))))

        accept_lens = accept.accept_lens.to(torch.int64).cpu()
        out_tokens = accept.output_tokens.clamp_min(0).to(torch.int64).cpu()
        next_tokens = torch.zeros(bs, self.stride, dtype=torch.int64)
        next_tokens[:, : self.gamma + 1] = out_tokens
        commit = (accept_lens + 1).to(torch.int32)
        new_seq_lens = committed + commit.to(torch.int64)
        bonus = accept.bonus_tokens.to(torch.int64)

        stats.finish(verify_lens, accept_lens, fallback)
        if self.metrics is not None and time.monotonic() >= self._retrieval_ece_due:  # only the gauges read it
            self._retrieval_ece_due = time.monotonic() + RETRIEVAL_ECE_REFRESH_S
            stats.retrieval_ece, stats.retrieval_ece_floor = self.retrieval.ece()
            stats.retrieval_ece_served, stats.retrieval_ece_served_floor, stats.retrieval_predictions = \
                self.retrieval.served_ece()
        # customized_info is per committed token, so it needs the accept lengths finish() just recorded
        logits_output = LogitsProcessorOutput(next_token_logits=None, customized_info=stats.customized_info(
            record_verify_lens=self.options.record_verify_lens))
        if want_logprob:
            packed_to_dense = _dense_index(verify_lens, self.stride - 1).to(logits.device)
            self._attach_logprobs(batch, logits_output, logits, packed_to_dense, next_tokens)
        self.counters.add(stats)
        if self.metrics is not None:  # before policy.observe: the cost model predicts this step unrefined
            self._observe_metrics(stats, committed, None if fallback else conf)
        if used is not None:
            self.retrieval.observe(retrieval, used, verify_lens, accept_lens)
        if fallback is None and self.sync.authoritative:
            self.calibration.record(conf_logits.cpu(), drafter_lens, accept_lens, sampled=sampled.cpu())
            self.calibration.maybe_refit()
            self.policy.observe(StepOutcome(verify_lens=verify_lens, accept_lens=accept_lens,
                                            step_time_s=stats.verify_s, kv_lens=committed))
        if self.trace is not None and fallback is None:
            self.trace.write(committed, conf, conf_logits, verify_lens, accept_lens, stats)
        self.step_index += 1
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_tokens.flatten().to(self.device), accept_lens=commit.to(self.device),
            cap_lens=verify_lens.to(torch.int32).to(self.device), new_seq_lens=new_seq_lens.to(self.device),
            next_draft_input=_next_state(bonus.to(self.device), state, None if fallback else (useful, savings)),
            speculative_num_draft_tokens=self.stride, can_run_cuda_graph=False,
        )

    def _plain_decode(self, batch, state, anchors, committed, verify_lens, stats, fallback, conf_logits, conf,
                      drafting=None):
        """Nothing to verify anywhere in the batch: SGLang's plain decode step, plus the drafter's context capture."""
        want_logprob = bool(batch.return_logprob)
        t0 = time.perf_counter()
        bs = len(anchors)
        slots, positions = rewrite_as_plain_decode(batch, self.req_to_token_pool.req_to_token, anchors, committed)
        own_sampling = samples_plain_itself(batch.sampling_info, batch.reqs)
        with section("dspark.plain_forward", self.profiler is not None):
            # is_verify: logits only, no SGLang sampling (we draw the token below when own_sampling)
            res = self.target_worker.forward_batch_generation(batch, is_verify=own_sampling,
                                                              capture_hidden_mode=CaptureHiddenMode.FULL)
        self.context_pool.defer(slots, positions, self._features(res.logits_output))
        if own_sampling:
            with section("dspark.plain_sample", self.profiler is not None):
                tokens = sample_plain(res.logits_output.next_token_logits, batch.sampling_info)
        else:
            tokens = res.next_token_ids.to(torch.int64)
        if self.sync.enabled:
            tokens, = self.sync.ints(tokens)
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()
        stats.verify_s = time.perf_counter() - t0
        kv = int(committed.sum())
        if self.plain_gate is not None and not self.costs.profiling and self.sync.authoritative:
            self.plain_gate.observe_plain(stats.verify_s, float(self.cost_model.predict(bs, bs, kv)))
        accept_lens = torch.zeros(bs, dtype=torch.int64)
        stats.finish(verify_lens, accept_lens, fallback)
        stats.plain_decode = True
        self.counters.add(stats)
        if self.metrics is not None:
            self._observe_metrics(stats, committed, conf)
        # A plain decode step is not a verify step: it must not refine the verify cost model (the gate above keeps
        # its own ratio), and l = 0 everywhere teaches the calibration nothing.
        if self.trace is not None and fallback is None and conf_logits is not None:
            self.trace.write(committed, conf, conf_logits, verify_lens, accept_lens, stats)
        self.step_index += 1
        next_tokens = torch.zeros(bs, self.stride, dtype=torch.int64, device=self.device)
        next_tokens[:, 0] = tokens.to(self.device)
        one = torch.ones(bs, dtype=torch.int32, device=self.device)
        logits_output = LogitsProcessorOutput(next_token_logits=None, customized_info=stats.customized_info(
            record_verify_lens=self.options.record_verify_lens))
        if want_logprob:
            first_of_chain = torch.arange(bs, device=self.device) * self.stride
            self._attach_logprobs(batch, logits_output, res.logits_output.next_token_logits, first_of_chain,
                                  next_tokens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_tokens.flatten(), accept_lens=one,
            cap_lens=torch.zeros(bs, dtype=torch.int32, device=self.device),
            new_seq_lens=(committed + 1).to(self.device),
            next_draft_input=_next_state(tokens.to(self.device), state,
                                         None if fallback else (drafting or (verify_lens > 0, state.savings))),
            speculative_num_draft_tokens=self.stride, can_run_cuda_graph=res.can_run_cuda_graph,
        )

    def _attach_logprobs(self, batch, logits_output, row_logits, dense_rows, next_tokens) -> None:
        """Logprobs of the committed tokens in SGLang's speculative layout ([bs, stride] rows, token (b, j) scored by
        the target logits that produced it), so return_logprob / top_logprobs_num / token_ids_logprob work with
        speculation on. row_logits [T, V] are the raw target logits of the T verified positions, dense_rows [T]
        their flat index b * stride + j."""
        from sglang.srt.layers.logprob_processor import compute_spec_logprobs

        bs = len(batch.reqs)
        dense = torch.zeros(bs * self.stride, row_logits.shape[-1], dtype=torch.float32, device=row_logits.device)
        dense[dense_rows] = row_logits.float()
        logits_output.next_token_logits = dense
        batch.return_logprob = True  # the rewrite cleared it for the target forward; the scheduler restores it
        compute_spec_logprobs(batch, logits_output, next_tokens.flatten().to(dense.device), chain_stride=self.stride)
        logits_output.next_token_logits = None

    def _observe_metrics(self, stats: StepStats, committed: torch.Tensor, conf) -> None:
        bs, verified = stats.batch_size, sum(stats.verify_lens)
        if self.plain_gate is not None:
            stats.gate_rho, stats.gate_kappa = self.plain_gate.rho, self.plain_gate.kappa
        predicted = float(self.cost_model.predict(bs + verified, bs, int(committed.sum())))
        self.metrics.observe_step(stats, budget_tokens=verified, capacity_tokens=bs * self.gamma, running=bs,
                                  predicted_s=predicted, measured_s=stats.verify_s,
                                  ece_per_position=self.calibration.ece().tolist(), conf=conf)

    def _drafting_useful(self, state: DSparkDraftState, verify_lens: torch.Tensor, conf, active: torch.Tensor,
                         kv: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(Bool[R] requests whose drafting pays, so the probe schedule drafts them again next step; their smoothed
        savings Float64[R] for the next step's state)."""
        lens = verify_lens.cpu()
        if not self.prices_drafting or conf is None or len(active) == 0:
            return lens > 0, state.savings
        bs = lens.numel()
        plain_s, verify_s = step_prices(self.cost_model, self.plain_gate, bs, int(lens.sum()), kv)
        return drafting_pays(state.savings, lens, conf.cpu().float(), _mask(active, bs), plain_s, verify_s,
                             self.draft_cost(len(active)) / len(active))

    def _restrict(self, batch, verify_lens: torch.Tensor, caps: torch.Tensor | None,
                  grammar: GrammarDrafts | None) -> torch.Tensor:
        """Per-request caps: custom_params dspark_max_verify (verify_caps), the drafts a request's grammar lets
        through (walk_drafts), and none for a request with a custom logit processor, whose distribution we
        reproduce on its bonus row only (apply_custom_processors). Batch-mates keep their lengths."""
        if caps is not None:
            verify_lens = torch.where(caps >= 0, torch.minimum(verify_lens, caps), verify_lens)
        if grammar is not None:
            verify_lens = torch.minimum(verify_lens, grammar.limits)
        processor_rows = custom_processor_rows(batch.sampling_info, len(verify_lens))
        if processor_rows is not None:
            verify_lens = torch.where(processor_rows, torch.zeros_like(verify_lens), verify_lens)
        return verify_lens

    def _walk_grammars(self, batch, drafts, conf_logits, active, draft_temps, drafted_ok: bool):
        """Walk each grammar request's matcher along its draft (grammar.walk_drafts): forced tokens become certain
        drafts, forbidden greedy drafts are replaced by the drafter's best allowed token. Runs on the host."""
        bs = len(batch.reqs)
        drafts_cpu = drafts.cpu().clone()
        conf_cpu = (torch.full((bs, self.gamma), -30.0) if conf_logits is None else conf_logits.float().cpu().clone())
        drafted = _mask(active, bs) if drafted_ok else torch.zeros(bs, dtype=torch.bool)
        greedy_drafts = (draft_temps == 0).cpu()
        contexts = [token_context(r) if getattr(r, "grammar", None) is not None else None for r in batch.reqs]
        plan = walk_drafts(batch.reqs, drafts_cpu, conf_cpu, drafted, greedy_drafts,
                           batch.sampling_info.vocab_size, self._draft_scores if drafted_ok else None,
                           CopySources(contexts, self._tokenizer()))
        drafts = drafts_cpu.to(self.device)
        if conf_logits is not None:
            conf_logits = conf_cpu.to(conf_logits.device, conf_logits.dtype)
        return drafts, conf_logits, plan

    def _tokenizer(self):
        """The target's tokenizer (jump-forward strings of grammars), loaded on first use; None if it fails."""
        if self._hf_tokenizer is None:
            try:
                from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

                sa = self.server_args
                self._hf_tokenizer = get_tokenizer(sa.tokenizer_path or sa.model_path,
                                                   trust_remote_code=getattr(sa, "trust_remote_code", False))
            except Exception:
                logger.exception("DSPARK_EXT: no tokenizer for grammar jump-forward drafts")
                self._hf_tokenizer = False
        return self._hf_tokenizer or None

    def _draft_scores(self, row: int, position: int):
        """The drafter's logits at (batch row, draft position) and the token ids of their columns (None: all)."""
        prop, index = self._proposal
        return prop.logits[index[row], position], prop.vocab

    def _accept(self, processed, rows, verify_lens, drafts, draft_dist, si):
        """processed: target logits of the packed verify rows; draft_dist: None (greedy drafts only) or the
        DraftDistribution of the sampled drafts (_draft)."""
        if bool((si.top_ks.view(-1) == 1).all()):
            return greedy_accept(drafts, verify_lens, processed.argmax(-1), _dense_index(verify_lens, self.gamma))
        support = target_support(processed, si.temperatures.view(-1)[rows], si.top_ks.view(-1)[rows],
                                 si.top_ps.view(-1)[rows], si.min_ps.view(-1)[rows] if si.need_min_p_sampling else None)
        return accept_rejection_packed(drafts, verify_lens.to(drafts.device), support, draft_dist)

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self.counters.requests_finished += 1
        self.retrieval.forget(rid)


def greedy_accept(drafts, verify_lens, packed_argmax, dense_index, backend: str = "auto") -> AcceptResult:
    """Greedy acceptance over the packed verify rows. On CUDA (backend "auto") one Triton launch
    (dspark_kernels/ragged_accept.py, 19 us at 256 x 7 inside a CUDA graph on an H200); elsewhere the torch path."""
    bs, gamma = drafts.shape
    lens = verify_lens.to(torch.int64).to(drafts.device)
    use_kernel = backend == "triton" or (backend == "auto" and drafts.device.type == "cuda" and _HAS_TRITON)
    if use_kernel:
        from dspark_kernels import ragged_accept_triton

        indptr = torch.zeros(bs + 1, dtype=torch.int64, device=drafts.device)
        indptr[1:] = torch.cumsum(lens + 1, 0)
        zeros = torch.zeros(bs, device=drafts.device)
        accept_lens, out = ragged_accept_triton(drafts, lens, indptr, zeros, zeros.long(),
                                                target_argmax=packed_argmax.to(drafts.device))
        accept_lens = accept_lens.to(torch.int64)
        return assemble_result(drafts, accept_lens, out.gather(1, accept_lens.unsqueeze(1)).squeeze(1).long())
    target_tokens = torch.zeros(bs, gamma + 1, dtype=torch.int64, device=drafts.device)
    target_tokens.view(-1)[dense_index.to(drafts.device)] = packed_argmax.to(drafts.device)
    return accept_greedy(drafts, lens, target_tokens)


def _mask(indices: torch.Tensor, n: int) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[indices.cpu()] = True
    return m


def _next_state(anchors: torch.Tensor, state: DSparkDraftState, drafting) -> DSparkDraftState:
    """drafting: (useful Bool[R], savings Float64[R]) from _drafting_useful, or None (a drafter fallback step: the
    probe schedule stays where it was). A useful request's probe back-off restarts."""
    if drafting is None:
        return DSparkDraftState(anchors, state.zero_streak, state.savings)
    useful, savings = drafting
    streak = torch.where(useful.cpu(), torch.zeros_like(state.zero_streak), state.zero_streak + 1)
    return DSparkDraftState(anchors, streak, savings)


def _create_metrics(server_args, gamma: int, controller: str) -> DSparkMetrics | None:
    """Prometheus metrics when --enable-metrics is on, on the rank SGLang's scheduler metrics report from."""
    from sglang.srt.runtime_context import get_observability, get_parallel

    obs, par = get_observability(), get_parallel()
    enabled = obs.enable_metrics and (par.attn_tp_rank == 0 or obs.enable_metrics_for_all_schedulers)
    metrics = DSparkMetrics.create(scheduler_labels(server_args, par, obs.extra_metric_labels), enabled=enabled)
    if metrics is not None:
        metrics.set_info(controller, gamma, server_args.speculative_draft_model_path)
    return metrics


def _dense_index(verify_lens: torch.Tensor, gamma: int) -> torch.Tensor:
    """Flat indices into [R, gamma+1] of the packed verify rows (request-major, chain order)."""
    col = torch.arange(gamma + 1).view(1, -1)
    take = col < (verify_lens.cpu() + 1).view(-1, 1)
    flat = torch.arange(verify_lens.numel() * (gamma + 1)).view(-1, gamma + 1)
    return flat[take]
