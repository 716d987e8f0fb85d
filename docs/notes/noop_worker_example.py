"""Reference: a minimal speculative worker registered as a plugin algorithm (DSX_NOOP) on SGLang 0.5.23.

Status: RAN on the CPU engine (torch_native, overlap off) against a tiny random Qwen2, 4 concurrent requests,
40 tokens each: greedy output token-for-token identical to the same server without speculation, with random
per-request verify lengths in [0, gamma] every step; no KV leak reported by the scheduler's idle leak check;
meta_info got spec_verify_ct / spec_cap_length (from cap_lens) and a custom per-step list (from customized_info).
Written by a helper as an experiment (2026-11-29); NOT production code: the drafter repeats the anchor token,
verify lengths are random, and the per-request Python loops are slow. See worker-plan.md for the real design.

How it was run (scratch layout): this file's two halves were a package `dsx_noop` (load() below) with a
dist-info folder on PYTHONPATH holding entry_points.txt `[sglang.srt.plugins] dsx_noop = dsx_noop:load`, then
  SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 PYTHONPATH=patches/sgl_kernel:<that dir> DSX_GAMMA=4 \
  python -m sglang.launch_server --model-path TINY --device cpu --attention-backend torch_native --dtype float32 \
    --max-total-tokens 8192 --skip-server-warmup --host 127.0.0.1 --port 30172 --speculative-algorithm DSX_NOOP
"""
from __future__ import annotations

import logging
import os
import random
from typing import Optional

import torch

from sglang.srt.layers.logits_processor import LogitsMetadata
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType

logger = logging.getLogger(__name__)
CAPTURE_LAYERS = [0, 2]


class DsxDraftState(SpecInput):
    """Per-request state riding on batch.spec_info between steps (anchor = last emitted token)."""

    def __init__(self, anchors: torch.Tensor):
        super().__init__(SpecInputType.DFLASH_DRAFT)
        self.anchors = anchors

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu=None, **kw) -> None:
        self.anchors = self.anchors[new_indices]

    def merge_batch(self, other: "DsxDraftState") -> None:
        self.anchors = torch.cat([self.anchors, other.anchors])


def _filtered_probs(logits: torch.Tensor, rows: torch.Tensor, si) -> torch.Tensor:
    """The distribution SGLang's pytorch sampler would draw from, per token row."""
    logits = logits.float()
    if si.acc_additive_penalties is not None:
        logits = logits + si.acc_additive_penalties[rows]
    if si.acc_scaling_penalties is not None:
        from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
        apply_scaling_penalties(logits, si.acc_scaling_penalties[rows])
    if si.logit_bias is not None:
        logits = logits + si.logit_bias[rows]
    probs = torch.softmax(logits / si.temperatures[rows], dim=-1)
    srt, idx = probs.sort(dim=-1, descending=True)
    csum = srt.cumsum(-1)
    rank = torch.arange(srt.shape[-1]).view(1, -1)
    srt[rank >= si.top_ks[rows].view(-1, 1)] = 0.0
    srt[(csum - srt) > si.top_ps[rows].view(-1, 1)] = 0.0
    if si.need_min_p_sampling:
        srt[srt < (srt[:, :1] * si.min_ps[rows].view(-1, 1))] = 0.0
    srt = srt / srt.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, idx, srt)


class DsxNoopWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        self.device = self.model_runner.device
        self.gamma = get_spec().speculative_num_steps
        self.stride = get_spec().speculative_num_draft_tokens
        model = self.model_runner.model
        # Qwen2 has only set_eagle3_layers_to_capture; Llama/Qwen3 also set_dflash_layers_to_capture.
        setter = getattr(model, "set_dflash_layers_to_capture", None) or model.set_eagle3_layers_to_capture
        setter(CAPTURE_LAYERS)
        # Keep final hidden states of every token next to the aux captures (FULL mode).
        model.logits_processor.keep_last_hidden_states = True
        self.rng = random.Random(0)
        self.stats = {"steps": 0, "verified": 0, "accepted": 0}
        logger.info("DsxNoopWorker up: gamma=%d stride=%d pid=%d", self.gamma, self.stride, os.getpid())

    # ------------------------------------------------------------------ prefill
    def _prefill(self, batch: ScheduleBatch) -> GenerationBatchResult:
        res = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        out = res.logits_output
        n_tok = int(sum(batch.extend_lens))
        aux = out.hidden_states
        assert aux is not None and aux.shape[0] == n_tok, (None if aux is None else aux.shape, n_tok)
        assert aux.shape[1] == len(CAPTURE_LAYERS) * self.model_runner.model_config.hidden_size
        assert out.last_hidden_states is not None and out.last_hidden_states.shape[0] == n_tok
        logger.info("dsx prefill: bs=%d tokens=%d aux=%s prefix=%s", len(batch.reqs), n_tok,
                    tuple(aux.shape), list(batch.prefix_lens))
        out.hidden_states = None  # don't hand the scheduler our capture
        out.last_hidden_states = None
        bs = len(batch.reqs)
        return GenerationBatchResult(
            logits_output=out,
            next_token_ids=res.next_token_ids,
            accept_lens=torch.ones(bs, dtype=torch.int32),
            new_seq_lens=batch.seq_lens,
            next_draft_input=DsxDraftState(res.next_token_ids.clone()),
            speculative_num_draft_tokens=self.stride,
            can_run_cuda_graph=res.can_run_cuda_graph,
        )

    # ------------------------------------------------------------------ decode
    def _decode(self, batch: ScheduleBatch) -> GenerationBatchResult:
        bs = len(batch.reqs)
        state: DsxDraftState = batch.spec_info
        anchors = state.anchors.tolist()
        for req, a in zip(batch.reqs, anchors):
            assert req.output_ids[-1] == a, (req.output_ids[-1], a)
        seq_lens = batch.seq_lens_cpu.tolist()
        for req, L in zip(batch.reqs, seq_lens):
            assert req.kv.kv_committed_len == L, (req.kv.kv_committed_len, L)
            assert req.kv.kv_allocated_len >= L + 1 + self.gamma, (req.kv.kv_allocated_len, L)
        drafts = [[a] * self.gamma for a in anchors]  # dumb drafter
        verify_lens = [self.rng.randint(0, self.gamma) for _ in range(bs)]
        ext = [1 + l for l in verify_lens]

        input_ids, locs = [], []
        r2t = self.req_to_token_pool.req_to_token
        pool_idx = batch.req_pool_indices.tolist()
        for r in range(bs):
            input_ids += [anchors[r]] + drafts[r][: verify_lens[r]]
            locs.append(r2t[pool_idx[r], seq_lens[r] : seq_lens[r] + ext[r]])
        # Rewrite the batch as a ragged EXTEND (scheduler's _forward_isolation restores every field afterwards).
        batch.forward_mode = ForwardMode.EXTEND
        batch.input_ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        batch.out_cache_loc = torch.cat(locs).to(torch.int64)
        batch.prefix_lens = list(seq_lens)
        batch.extend_lens = list(ext)
        batch.extend_num_tokens = sum(ext)
        batch.extend_logprob_start_lens = list(ext)
        new_lens = [L + e for L, e in zip(seq_lens, ext)]
        batch.seq_lens = torch.tensor(new_lens, dtype=torch.int64, device=self.device)
        batch.seq_lens_cpu = torch.tensor(new_lens, dtype=torch.int64)
        batch.seq_lens_sum = sum(new_lens)
        batch.return_logprob = False
        batch.spec_info = None
        res = self.target_worker.forward_batch_generation(
            batch, is_verify=True, capture_hidden_mode=CaptureHiddenMode.FULL
        )
        out = res.logits_output
        T = sum(ext)
        assert out.hidden_states.shape[0] == T and out.last_hidden_states.shape[0] == T
        model = self.model_runner.model
        logits = model.logits_processor._get_logits(
            out.last_hidden_states, model.lm_head, LogitsMetadata(forward_mode=ForwardMode.DECODE)
        )
        last_rows = torch.tensor([sum(ext[: r + 1]) - 1 for r in range(bs)])
        assert torch.allclose(logits[last_rows].float(), out.next_token_logits.float(), atol=1e-4), "logits mismatch"

        rows = torch.repeat_interleave(torch.arange(bs), torch.tensor(ext))
        probs = _filtered_probs(logits, rows, batch.sampling_info)
        out_tokens = torch.zeros(bs, self.stride, dtype=torch.int64)
        accept_lens = torch.zeros(bs, dtype=torch.int32)
        start = 0
        for r in range(bs):
            p = probs[start : start + ext[r]]
            a = 0
            while a < verify_lens[r]:
                d = drafts[r][a]
                if torch.rand(()) < p[a, d]:  # q(d)=1 for a one-hot drafter
                    out_tokens[r, a] = d
                    a += 1
                else:
                    break
            resid = p[a].clone()
            if a < verify_lens[r]:
                resid[drafts[r][a]] = 0.0  # residual max(p - q, 0) for one-hot q
            bonus = int(torch.multinomial(resid / resid.sum(), 1))
            out_tokens[r, a] = bonus
            accept_lens[r] = a + 1
            start += ext[r]
        self.stats["steps"] += 1
        self.stats["verified"] += sum(verify_lens)
        self.stats["accepted"] += int(accept_lens.sum()) - bs
        if self.stats["steps"] % 20 == 1:
            logger.info("dsx decode: bs=%d verify_lens=%s accept_lens=%s stats=%s", bs, verify_lens,
                        accept_lens.tolist(), self.stats)
        new_seq_lens = torch.tensor(seq_lens, dtype=torch.int64) + accept_lens.to(torch.int64)
        bonus = out_tokens[torch.arange(bs), accept_lens.long() - 1]
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(
                next_token_logits=None, customized_info={"dsx_verify_lens": verify_lens}),
            next_token_ids=out_tokens.flatten(),
            cap_lens=torch.tensor(verify_lens, dtype=torch.int32),
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=DsxDraftState(bonus),
            speculative_num_draft_tokens=self.stride,
            can_run_cuda_graph=False,
        )

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, *,
                                 pp_proxy_tensors=None) -> GenerationBatchResult:
        if batch.forward_mode.is_extend():
            result = self._prefill(batch)
        elif batch.forward_mode.is_decode():
            result = self._decode(batch)
        else:  # idle
            raise NotImplementedError(f"forward mode {batch.forward_mode}")
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        logger.info("dsx finished rid=%s natural_stop=%s", rid, natural_stop)


# ---------------------------------------------------------------- registration (plugin entry point)
def load() -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DsxAlgo(CustomSpecAlgo):
        # The three methods 0.5.23's CustomSpecAlgo lacks but the scheduler calls.
        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True,
                              needs_confidence_relay=False):
            from sglang.srt.managers.overlap_utils import FutureMap
            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens,
                             needs_confidence_relay)

        def handle_server_args(self, server_args) -> None:
            gamma = int(os.environ.get("DSX_GAMMA", "4"))
            server_args.speculative_num_steps = gamma
            server_args.speculative_eagle_topk = 1
            server_args.speculative_num_draft_tokens = gamma + 1
            if server_args.device == "cpu":
                server_args.disable_overlap_schedule = True
            server_args._dsx_note = "non-field write is ignored"

    def _factory(server_args):
        return DsxNoopWorker

    SpeculativeAlgorithm.register("DSX_NOOP", supports_overlap=False, spec_class=DsxAlgo)(_factory)
    logger.info("dsx_noop: registered DSX_NOOP in pid %d", os.getpid())
