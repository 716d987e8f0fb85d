"""GPU check + timing of the dspark_kernels/ package against its torch references (issue #7).

    .venv/bin/python benchmarks/kernels.py [--out benchmarks/results/kernels.json] [--iters 20] [--quick]

Per kernel: correctness vs the torch reference on the benchmark inputs, then the median of `iters` timed runs
(CUDA events around each run, after warm-up). Targets checked and printed:
  markov sampler  R=128 G=7 V=151936 r=256 bf16: Triton >= 5x faster than the torch loop
  ragged accept   R=256 G=7 V=151936: <= 20 us (greedy; sampling reads a full target row per request, so
                  it is bandwidth-bound at about R*V*4 bytes and reported against the same line)
  ragged verify   FlashInfer CUDA-graph step (stage + replay) within 10% of the eager step (plan + run);
                  stage() also timed on the host (time.perf_counter: us_stage_host), with a cProfile digest;
                  `flashinfer_static`: the bucket planned once (FlashInferStaticVerify), replay vs that run
Host wall-clock per call (us_host_*) is reported beside the event timings: events bracket the launches, so a
launch-bound call shows both numbers close together. `--no-sweep` skips the Markov tile sweep (~20 s).
Exits 0 with a message when no GPU is present. Budget: well under 5 minutes on an H200.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: the dspark_kernels/ package


DEVICE = "cuda"
# (full, --quick) shapes; module-level so a CPU smoke run can shrink them
SHAPES = dict(
    markov=((128, 7, 151936, 256), (32, 7, 151936, 256)),  # R, G, V, rank
    accept=((256, 7, 151936), (64, 7, 151936)),  # R, G, V
    verify=((64, 8, 2048), (16, 8, 2048)),  # slots, width (gamma + 1), max prefix
)


def _shape(name: str, quick: bool):
    return SHAPES[name][1 if quick else 0]


def host_us(fn, iters: int, warmup: int = 2) -> float:
    """Median host wall-clock microseconds of fn() (time.perf_counter right around the call, the device idle
    before it): what the caller's thread pays, which CUDA events hide when the GPU side is short."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def profile_top(fn, calls: int = 10, top: int = 15) -> list[str]:
    """cProfile of `calls` host calls of fn: the `top` entries by cumulative time, per call."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in pstats.Stats(prof).stats.items():
        rows.append((cumtime, tottime, ncalls, f"{Path(file).name}:{line}:{name}"))
    rows.sort(reverse=True)
    return [f"{where}  calls/step={nc / calls:g}  cum_us={ct / calls * 1e6:.0f}  self_us={tt / calls * 1e6:.0f}"
            for ct, tt, nc, where in rows[:top]]


def bench_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over iters runs, each bracketed by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_ms(fn, iters: int, warmup: int = 3) -> float | None:
    """Median milliseconds of one CUDA-graph replay of fn() (captured once, launches and host work gone): the
    device time a serving loop that captures its step pays. None when fn cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # a host sync inside fn, or an uncapturable op
        print(f"graph capture failed: {type(exc).__name__}: {str(exc)[:160]}")
        torch.cuda.synchronize()
        return None
    return bench_ms(graph.replay, iters, warmup=2)


# ---------------------------------------------------------------------------------------- markov sampler


def torch_loop_native_rng(U, w1, w2, anchor, temps, seeds):
    """A plain torch implementation of the vanilla Markov sampler (torch's own RNG): the realistic baseline."""
    del seeds
    R, G, V = U.shape
    greedy = temps < 1e-5
    inv_t = 1.0 / torch.where(greedy, torch.ones_like(temps), temps)
    prev = anchor
    tokens, probs = [], []
    for k in range(G):
        logits = U[:, k].float() + (w1[prev] @ w2.T).float()
        p = torch.softmax(logits * inv_t[:, None], dim=-1)
        sampled = (p / torch.empty_like(p).exponential_()).argmax(-1)
        tok = torch.where(greedy, logits.argmax(-1), sampled)
        probs.append(torch.where(greedy, torch.ones_like(temps), p.gather(1, tok[:, None]).squeeze(1)))
        tokens.append(tok)
        prev = tok
    return torch.stack(tokens, 1), torch.stack(probs, 1)


def torch_loop_greedy(U, w1, w2, anchor):
    """The torch loop for an all-greedy batch (the server's default drafts): argmax only, no softmax or noise."""
    prev, tokens = anchor, []
    for k in range(U.shape[1]):
        prev = (U[:, k].float() + (w1[prev] @ w2.T).float()).argmax(-1)
        tokens.append(prev)
    return torch.stack(tokens, 1)


MARKOV_SWEEP = (  # step-kernel configurations timed after the default one (markov_launch_config overrides)
    dict(block_r=64, block_v=64, num_warps=4, num_stages=3),
    dict(block_r=64, block_v=128, num_warps=8),
    dict(block_r=128, block_v=64, num_warps=8),
    dict(block_r=128, block_v=128, num_warps=8),
    dict(block_r=32, block_v=128, num_warps=4),
    dict(block_r=64, block_v=64, num_warps=4, programs_v=264),
)


def run_markov(args, results):
    from dspark_kernels import markov_sample_reference, markov_sample_triton
    from dspark_kernels.markov_sampler import markov_launch_config

    R, G, V, rank = _shape("markov", args.quick)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    U = (torch.randn(R, G, V, device=DEVICE, generator=gen) * 3).bfloat16()
    w1 = (torch.randn(V, rank, device=DEVICE, generator=gen) * 0.05).bfloat16()
    w2 = (torch.randn(V, rank, device=DEVICE, generator=gen) * 0.05).bfloat16()
    anchor = torch.randint(0, V, (R,), device=DEVICE, generator=gen)
    temps = torch.where(torch.arange(R, device=DEVICE) % 4 == 0, 0.0, 1.0)
    seeds = torch.randint(0, 2**62, (R,), device=DEVICE, generator=gen)
    a = (U, w1, w2, anchor, temps, seeds)

    got = markov_sample_triton(*a, return_logits=True)
    ref = markov_sample_reference(*a, return_logits=True)
    token_match = (got.tokens == ref.tokens).float().mean().item()
    rows = (got.tokens == ref.tokens).all(1)
    prob_err = (got.token_probs[rows] - ref.token_probs[rows]).abs().max().item() if rows.any() else float("nan")
    logit_err = (got.logits - ref.logits).abs().max().item()
    del got, ref

    t_triton = bench_ms(lambda: markov_sample_triton(*a), args.iters)
    t_triton_logits = bench_ms(lambda: markov_sample_triton(*a, return_logits=True), args.iters)
    # host time of one call (2*G launches + allocations): if it nears the event time the sampler is launch-bound
    us_host = host_us(lambda: markov_sample_triton(*a, return_logits=True), args.iters)
    t_native = bench_ms(lambda: torch_loop_native_rng(*a), args.iters)
    t_ref = bench_ms(lambda: markov_sample_reference(*a, return_logits=True), max(3, args.iters // 4))
    speedup = t_native / t_triton_logits
    g_triton = graph_ms(lambda: markov_sample_triton(*a, return_logits=True), args.iters)
    g_native = graph_ms(lambda: torch_loop_native_rng(*a), args.iters)
    graph_speedup = g_native / g_triton if g_triton and g_native else None
    cfg = markov_launch_config(R, V, rank, torch.device(DEVICE))
    results["markov_sampler"] = dict(
        shape=dict(R=R, G=G, V=V, rank=rank, dtype="bf16"),
        token_match=token_match, max_prob_err=prob_err, max_logit_err=logit_err,
        ms_triton=t_triton, ms_triton_with_logits=t_triton_logits, us_host_per_call_with_logits=us_host,
        ms_torch_loop_native_rng=t_native, ms_torch_reference_same_rng=t_ref, speedup_vs_torch_loop=speedup,
        ms_graph_triton_with_logits=g_triton, ms_graph_torch_loop=g_native, graph_speedup=graph_speedup,
        default_config=cfg, target="speedup >= 5x (eager or both graph-captured)",
        ok=bool(max(speedup, graph_speedup or 0) >= 5.0 and token_match >= 0.98),
    )
    # an all-greedy batch with the host-side hint: the Gumbel draws are compiled out
    z = torch.zeros_like(temps)
    g = (U, w1, w2, anchor, z, seeds)
    greedy_ref = torch_loop_greedy(U, w1, w2, anchor)
    greedy_got = markov_sample_triton(*g, return_logits=True, all_greedy=True)
    t_greedy = bench_ms(lambda: markov_sample_triton(*g, return_logits=True, all_greedy=True), args.iters)
    t_greedy_unhinted = bench_ms(lambda: markov_sample_triton(*g, return_logits=True, all_greedy=False), args.iters)
    t_greedy_torch = bench_ms(lambda: torch_loop_greedy(U, w1, w2, anchor), args.iters)
    results["markov_sampler"]["all_greedy"] = dict(
        token_match=(greedy_got.tokens == greedy_ref).float().mean().item(),
        ms_triton_with_logits=t_greedy, ms_triton_with_logits_no_hint=t_greedy_unhinted,
        ms_torch_loop_greedy=t_greedy_torch, speedup_vs_torch_loop=t_greedy_torch / t_greedy)
    del greedy_got
    if args.no_sweep:
        return
    # tile sweep of the step kernel (with logits): times, and whether its tokens equal the default config's
    want = markov_sample_triton(*a).tokens
    sweep = {}
    for kw in MARKOV_SWEEP:
        name = ",".join(f"{k}={v}" for k, v in kw.items())
        try:
            same = bool(torch.equal(markov_sample_triton(*a, **kw).tokens, want))
            sweep[name] = dict(ms_with_logits=bench_ms(lambda: markov_sample_triton(*a, return_logits=True, **kw),
                                                       max(5, args.iters // 2)), same_tokens=same)
        except Exception as exc:  # e.g. a tile that does not fit in shared memory
            sweep[name] = dict(error=f"{type(exc).__name__}: {str(exc)[:200]}")
    timed = {k: v["ms_with_logits"] for k, v in sweep.items() if "ms_with_logits" in v}
    results["markov_sampler"]["sweep"] = sweep
    if timed:
        best = min(timed, key=timed.get)
        results["markov_sampler"].update(sweep_best=best, sweep_best_ms_with_logits=timed[best],
                                         sweep_best_speedup=t_native / timed[best])


# ----------------------------------------------------------------------------------------- ragged accept


def run_accept(args, results):
    from dspark_kernels import ragged_accept_reference, ragged_accept_triton

    R, G, V = _shape("accept", args.quick)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    n = torch.randint(0, G + 1, (R,), device=DEVICE, generator=gen)
    indptr = torch.zeros(R + 1, dtype=torch.int64, device=DEVICE)
    indptr[1:] = torch.cumsum(n + 1, 0)
    rows = int(indptr[-1])
    target_probs = torch.softmax(torch.randn(rows, V, device=DEVICE, generator=gen) * 4, -1)
    target_argmax = target_probs.argmax(-1)
    draft_logits = torch.randn(R, G, V, device=DEVICE, generator=gen) * 4
    draft_lse = torch.logsumexp(draft_logits, -1)
    # drafts: the target argmax of their row most of the time (high acceptance, like a good drafter)
    row_of = (indptr[:-1, None] + torch.arange(G, device=DEVICE)[None, :]).clamp(max=rows - 1)
    drafts = torch.where(torch.rand(R, G, device=DEVICE, generator=gen) < 0.8, target_argmax[row_of],
                         torch.randint(0, V, (R, G), device=DEVICE, generator=gen))
    seeds = torch.randint(0, 2**62, (R,), device=DEVICE, generator=gen)
    out = {}
    for mode, temps in (("greedy", torch.zeros(R, device=DEVICE)), ("sampling", torch.ones(R, device=DEVICE))):
        kw = dict(target_argmax=target_argmax) if mode == "greedy" else dict(
            target_argmax=target_argmax, target_probs=target_probs, draft_logits=draft_logits, draft_lse=draft_lse)
        base = (drafts, n, indptr, temps, seeds)
        a_k, o_k = ragged_accept_triton(*base, **kw)
        a_r, o_r = ragged_accept_reference(*base, **kw)
        match = ((a_k == a_r) & (o_k == o_r).all(1)).float().mean().item()
        t_k = bench_ms(lambda: ragged_accept_triton(*base, **kw), args.iters * 5)
        us_host = host_us(lambda: ragged_accept_triton(*base, **kw), args.iters * 5)
        t_r = bench_ms(lambda: ragged_accept_reference(*base, **kw), args.iters)
        t_g = graph_ms(lambda: ragged_accept_triton(*base, **kw), args.iters * 5)
        out[mode] = dict(request_match=match, us_triton=t_k * 1e3, us_host_per_call=us_host,
                         us_graph_replay=None if t_g is None else t_g * 1e3,
                         us_torch_reference=t_r * 1e3, mean_accept=a_k.float().mean().item(),
                         ok=bool(min(t_k, t_g or t_k) * 1e3 <= 20.0 and match >= 0.98))
    results["ragged_accept"] = dict(shape=dict(R=R, G=G, V=V), target="<= 20 us", **out)


# ----------------------------------------------------------------------------------------- ragged verify


def run_verify(args, results):
    from dspark_kernels import (HAS_FLASHINFER, FlashInferRaggedVerify, kv_indptr_from_lens,
                         ragged_verify_attention_reference, ragged_verify_attention_triton)
    from dspark_kernels.flashinfer_verify import FLASHINFER_IMPORT_ERROR

    H, Hkv, hd, ps = 32, 8, 128, 16  # Qwen3-8B attention
    slots, width, max_prefix = _shape("verify", args.quick)
    num_tokens = slots * width
    gen = torch.Generator().manual_seed(2)

    def layout(live, max_prefix):
        n = torch.randint(1, width + 1, (live,), generator=gen, dtype=torch.int32)
        lens = torch.randint(16, max_prefix, (live,), generator=gen, dtype=torch.int32) + n
        qo = torch.zeros(live + 1, dtype=torch.int32)
        qo[1:] = torch.cumsum(n, 0)
        kvp = kv_indptr_from_lens(lens, ps)
        return qo, kvp, lens

    num_pages = slots * (max_prefix + width) // ps + slots + 8
    k = (torch.randn(num_pages, ps, Hkv, hd, device=DEVICE) * 0.5).bfloat16()
    v = (torch.randn(num_pages, ps, Hkv, hd, device=DEVICE) * 0.5).bfloat16()
    qo, kvp, lens = layout(slots - slots // 8, max_prefix)  # a live step below the bucket
    pages = torch.randperm(num_pages, generator=gen)[: int(kvp[-1])].to(torch.int32).to(DEVICE)
    q = torch.randn(int(qo[-1]), H, hd, device=DEVICE).bfloat16()
    dev = (q, k, v, qo.to(DEVICE), kvp.to(DEVICE), pages, lens.to(DEVICE))
    ref = ragged_verify_attention_reference(*dev)
    got = ragged_verify_attention_triton(*dev, max_qo_len=width)
    entry = dict(shape=dict(slots=slots, tokens=num_tokens, live_tokens=int(qo[-1]), H=H, Hkv=Hkv, hd=hd,
                            page_size=ps, max_prefix=max_prefix),
                 triton_max_err=(got.float() - ref.float()).abs().max().item(),
                 us_triton=bench_ms(lambda: ragged_verify_attention_triton(*dev, max_qo_len=width), args.iters) * 1e3)
    t_tg = graph_ms(lambda: ragged_verify_attention_triton(*dev, max_qo_len=width), args.iters)
    entry["us_triton_graph_replay"] = None if t_tg is None else t_tg * 1e3
    if not HAS_FLASHINFER:
        entry["flashinfer"] = f"skipped: flashinfer not importable ({FLASHINFER_IMPORT_ERROR})"
        results["ragged_verify"] = entry
        return
    fiv = FlashInferRaggedVerify(num_tokens, slots, max_pages=num_pages, num_qo_heads=H, num_kv_heads=Hkv,
                                 head_dim=hd, page_size=ps, dtype=torch.bfloat16)
    qo_c, kvp_c, lens_c = layout(slots, max_prefix)  # capture layout: any layout works (sink slot pads)
    pages_c = torch.randperm(num_pages, generator=gen)[: int(kvp_c[-1])].to(torch.int32).to(DEVICE)
    t0 = time.perf_counter()
    fiv.stage(qo_c, kvp_c, pages_c, lens_c)
    fiv.capture_graph(k, v)
    capture_s = time.perf_counter() - t0

    def eager_step():
        fiv.stage(qo, kvp, pages, lens)
        return fiv.run_eager(q, k, v)

    def graph_step():
        fiv.stage(qo, kvp, pages, lens)
        return fiv.replay(q)

    graph_out = graph_step().clone()
    eager_out = eager_step().clone()
    t_eager = bench_ms(eager_step, args.iters)
    t_graph = bench_ms(graph_step, args.iters)
    fiv.stage(qo, kvp, pages, lens)
    t_run = bench_ms(lambda: fiv.run_eager(q, k, v), args.iters)
    t_replay = bench_ms(lambda: fiv.replay(q), args.iters)
    t_plan = bench_ms(lambda: fiv.stage(qo, kvp, pages, lens), args.iters)
    us_stage_host = host_us(lambda: fiv.stage(qo, kvp, pages, lens), args.iters)
    dev_ptrs = (qo.to(DEVICE), kvp.to(DEVICE), pages, lens.to(DEVICE))  # indptrs on the device: one D2H copy
    us_stage_host_dev = host_us(lambda: fiv.stage(*dev_ptrs), args.iters)
    entry["stage_profile"] = profile_top(lambda: fiv.stage(qo, kvp, pages, lens))
    entry.update(
        flashinfer_graph_max_err=(graph_out.float() - ref.float()).abs().max().item(),
        flashinfer_eager_max_err=(eager_out.float() - ref.float()).abs().max().item(),
        capture_s=capture_s, us_eager_step_plan_run=t_eager * 1e3, us_graph_step_plan_replay=t_graph * 1e3,
        us_run_only=t_run * 1e3, us_replay_only=t_replay * 1e3, us_plan_only=t_plan * 1e3,
        us_stage_host=us_stage_host, us_stage_host_device_indptrs=us_stage_host_dev,
        graph_over_eager=t_graph / t_eager, target="graph step within 10% of eager step (or faster)",
        ok=bool(t_graph <= 1.10 * t_eager),
    )
    try:  # new path: its failure must not drop the rows above
        entry["flashinfer_static"] = run_verify_static(args, (q, k, v, qo, kvp, pages, lens), ref, slots, width,
                                                       num_pages, t_run)
    except Exception as exc:
        entry["flashinfer_static"] = f"error: {type(exc).__name__}: {exc}"
    results["ragged_verify"] = entry


def run_verify_static(args, live, ref, slots, width, num_pages, us_eager_run_ms):
    """FlashInferStaticVerify: planned once, per step only stage() (no plan) + replay."""
    from dspark_kernels.flashinfer_static_verify import FlashInferStaticVerify

    q, k, v, qo, kvp, pages, lens = live
    fsv = FlashInferStaticVerify(slots, width, max_pages=num_pages, num_qo_heads=q.shape[1],
                                 num_kv_heads=k.shape[2], head_dim=q.shape[2], page_size=k.shape[1],
                                 dtype=q.dtype)
    fsv.stage(qo, kvp, pages, lens)
    fsv.capture_graph(k, v)
    out = fsv.replay(q).clone()
    eager_out = fsv.run_eager(q, k, v).clone()

    def step():
        fsv.stage(qo, kvp, pages, lens)
        return fsv.replay(q)

    t_replay = bench_ms(lambda: fsv.replay(q), args.iters)
    t_step = bench_ms(step, args.iters)
    t_run = bench_ms(lambda: fsv.run_eager(q, k, v), args.iters)
    return dict(
        max_err=(out.float() - ref.float()).abs().max().item(),
        eager_max_err=(eager_out.float() - ref.float()).abs().max().item(),
        plans=fsv.plans, us_replay_only=t_replay * 1e3, us_step_stage_replay=t_step * 1e3,
        us_run_eager_fa2=t_run * 1e3, us_stage_host=host_us(lambda: fsv.stage(qo, kvp, pages, lens), args.iters),
        replay_over_eager_plan_run=t_replay / us_eager_run_ms,
        target="replay within 10% of the per-step-planned eager run, one plan per bucket",
        ok=bool(fsv.plans == 1 and t_replay <= 1.10 * us_eager_run_ms
                and (out.float() - ref.float()).abs().max().item() < 5e-2),
    )


# ------------------------------------------------------------------------ 8B-class verify step (denominator)


def run_verify_step_proxy(args, results):
    """Lower bound on one verify forward of a Qwen3-8B-shaped target over R*(1+G) tokens: its GEMMs only
    (36 layers of qkv / o / gate_up / down + lm_head, one layer's weights reused), no attention, no norms.
    Dividing the Markov sampler's time by this overstates the sampler's share, so the ratio is conservative."""
    R, G = _shape("markov", args.quick)[:2]
    T, d, kv, ff, V, L = R * (1 + G), 4096, 1024, 12288, 151936, 36
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    w = {n: (torch.randn(o, i, device=DEVICE, generator=gen) * 0.02).bfloat16()
         for n, (o, i) in dict(qkv=(d + 2 * kv, d), o=(d, d), gate_up=(2 * ff, d), down=(d, ff), head=(V, d)).items()}
    x = torch.randn(T, d, device=DEVICE, generator=gen).bfloat16()

    def step():
        h = x
        for _ in range(L):
            h = h + (h @ w["qkv"].T)[:, :d] @ w["o"].T
            gu = h @ w["gate_up"].T
            h = h + (torch.nn.functional.silu(gu[:, :ff]) * gu[:, ff:]) @ w["down"].T
        return h @ w["head"].T

    ms = bench_ms(step, max(5, args.iters // 2))
    entry = dict(shape=dict(tokens=T, layers=L, hidden=d, ffn=ff, vocab=V), ms_gemm_only=ms)
    mk = results.get("markov_sampler")
    if mk:
        share = mk["ms_triton_with_logits"] / ms
        entry.update(markov_share_of_verify=share, target="markov sampler <= 2% of an 8B verify step",
                     ok=bool(share <= 0.02))
    results["verify_step_8b_proxy"] = entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "kernels.json"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="smaller shapes (smoke test)")
    parser.add_argument("--only", choices=["markov", "accept", "verify", "verify8b"], action="append")
    parser.add_argument("--no-sweep", action="store_true", help="skip the Markov step-kernel tile sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py: no CUDA device; nothing to measure (kernels are tested on CPU by "
              "tests/unit/test_kernels_*.py under TRITON_INTERPRET=1).")
        return 0
    from dspark_kernels import HAS_TRITON

    if not HAS_TRITON:
        print("benchmarks/kernels.py: triton is not importable; nothing to measure.")
        return 0
    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    import triton

    results["triton"] = triton.__version__
    started = time.perf_counter()
    for name, fn in (("markov", run_markov), ("accept", run_accept), ("verify", run_verify),
                     ("verify8b", run_verify_step_proxy)):
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            fn(args, results)
        except Exception as exc:  # report and keep going: one broken kernel must not hide the others
            results[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
        torch.cuda.empty_cache()
    results["wall_s"] = time.perf_counter() - started

    print(f"\n{'kernel':<16} {'metric':<32} {'value':>14}")
    for kernel in ("markov_sampler", "ragged_accept", "ragged_verify", "verify_step_8b_proxy"):
        for key, value in _flatten(results.get(kernel, {})):
            if isinstance(value, list):  # profiles: printed below the table
                continue
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            print(f"{kernel:<16} {key:<32} {shown:>14}")
    for line in results.get("ragged_verify", {}).get("stage_profile", []):
        print(f"stage() profile: {line}")
    for key in ("markov_error", "accept_error", "verify_error", "verify8b_error"):
        if key in results:
            print(f"ERROR {key}: {results[key]}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


def _flatten(d: dict, prefix: str = ""):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


if __name__ == "__main__":
    sys.exit(main())
