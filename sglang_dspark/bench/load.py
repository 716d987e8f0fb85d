"""Closed-loop load generator: C concurrent streaming chat clients (real `openai` client) over a prompt list."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm


@dataclass
class RequestResult:
    dataset: str
    output_tokens: int
    ttft_s: float
    latency_s: float
    dspark: dict | None = None
    index: int = -1  # position in the prompt list

    @property
    def decode_tok_s(self) -> float:
        decode_time = self.latency_s - self.ttft_s
        return (self.output_tokens - 1) / decode_time if decode_time > 0 and self.output_tokens > 1 else 0.0


@dataclass
class LoadResult:
    concurrency: int
    wall_s: float
    requests: list[RequestResult] = field(default_factory=list)

    def summary(self) -> dict:
        toks = sum(r.output_tokens for r in self.requests)
        per_user = sorted(r.decode_tok_s for r in self.requests)
        p10 = per_user[max(0, int(0.1 * (len(per_user) - 1)))] if per_user else 0.0
        out = {
            "concurrency": self.concurrency,
            "num_requests": len(self.requests),
            "output_tokens": toks,
            "wall_s": round(self.wall_s, 3),
            "aggregate_tok_s": round(toks / self.wall_s, 3) if self.wall_s > 0 else 0.0,
            "per_user_tok_s_median": round(statistics.median(per_user), 3) if per_user else 0.0,
            "per_user_tok_s_p10": round(p10, 3),
            "ttft_s_median": round(statistics.median(r.ttft_s for r in self.requests), 4) if self.requests else 0.0,
        }
        stats = [r.dspark for r in self.requests if r.dspark]
        if stats:
            steps = sum(s.get("verify_steps", 0) for s in stats)
            out["tau"] = round(sum(s.get("accepted", 0) + s.get("verify_steps", 0) for s in stats) / steps, 4) if steps else None
            out["mean_verify_len"] = round(sum(s.get("verified", 0) for s in stats) / steps, 4) if steps else None
            out["wasted_verify_tokens"] = sum(s.get("verified", 0) - s.get("accepted", 0) for s in stats)
            by_source: dict[str, dict[str, int]] = {}
            for s in stats:
                for source, counts in (s.get("by_source") or {}).items():
                    agg = by_source.setdefault(source, {"steps": 0, "verified": 0, "accepted": 0})
                    for k in agg:
                        agg[k] += int(counts.get(k, 0))
            if by_source:
                out["by_source"] = by_source
        return out


async def _one(client, model: str, dataset: str, prompt: str, max_tokens: int, temperature: float,
               seed: int | None, fields: dict | None = None) -> RequestResult:
    """fields: extra request fields of this prompt (e.g. response_format)."""
    t0 = time.perf_counter()
    ttft = None
    usage_tokens = None
    dspark = None
    extra = {"ignore_eos": True}
    if seed is not None:
        extra["sampling_seed"] = seed
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=temperature, stream=True, stream_options={"include_usage": True}, extra_body=extra,
        **(fields or {}),
    )
    chunks = 0
    async for chunk in stream:
        if chunk.choices and ttft is None and (chunk.choices[0].delta.content or ""):
            ttft = time.perf_counter() - t0
        if chunk.choices:
            chunks += 1
        if chunk.usage is not None:
            usage_tokens = chunk.usage.completion_tokens
        extra_fields = getattr(chunk, "model_extra", None) or {}
        if "dspark" in extra_fields and extra_fields["dspark"]:
            dspark = extra_fields["dspark"]
    latency = time.perf_counter() - t0
    return RequestResult(dataset, usage_tokens if usage_tokens is not None else chunks, ttft or latency, latency, dspark)


async def run_load(base_url: str, prompts: list[tuple], concurrency: int, max_tokens: int,
                   temperature: float = 0.0, model: str = "default", seed: int | None = 0,
                   progress: bool = True) -> LoadResult:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="none", timeout=3600, max_retries=0)
    queue: asyncio.Queue = asyncio.Queue()
    for i, item in enumerate(prompts):
        queue.put_nowait((i, item))
    results: list[RequestResult] = []
    bar = tqdm(total=len(prompts), desc=f"c={concurrency}", disable=not progress, leave=False)

    async def worker():
        while True:
            try:
                i, (dataset, prompt, *fields) = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            r = await _one(client, model, dataset, prompt, max_tokens, temperature,
                           None if seed is None else seed + i, fields[0] if fields else None)
            r.index = i
            results.append(r)
            bar.update(1)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    bar.close()
    await client.close()
    return LoadResult(concurrency, wall, results)


def run_load_sync(*args, **kwargs) -> LoadResult:
    return asyncio.run(run_load(*args, **kwargs))
