"""Start-up cost profiling load: once the server answers, drive a short mixed-concurrency workload so the
DSPARK_EXT worker measures its verify cost curve before real traffic arrives (<= ~60 s, with a progress bar)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in two sentences.",
    "List three prime numbers greater than 100.",
    "def fibonacci(n):",
    "Summarize the rules of chess briefly.",
    "What is 12 times 13? Show the steps.",
]
# One long prompt in every level: KV length must vary apart from the request count, or the fit cannot tell the
# per-KV-token cost from the per-request one (and extrapolates either wildly to long contexts).
LONG_PROMPT = "Here is a log of a long conversation about systems programming. " * 40 + "Summarize it."
LEVELS = [(1, 2), (2, 4), (4, 8), (8, 8)]  # (concurrency, requests)
MAX_TOKENS = 24
# Logged when the load starts and when its last request has returned: benchmarks wait for the second line, since a
# level that starts near the end of the budget runs on past it (bench/serve.py, wait_for_cost_model).
STARTED_LINE = "DSpark cost profile load: started"
DONE_LINE = "DSpark cost profile load: done"
REQUEST_TIMEOUT_S = 300.0


def _post(url: str, payload: dict, timeout: float) -> None:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()


def _wait_healthy(base: str, deadline: float) -> bool:
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(1.0)
    return False


def run_profile_load(base: str, budget_s: float = 60.0, startup_timeout_s: float = 900.0) -> None:
    if not _wait_healthy(base, time.time() + startup_timeout_s):
        return
    end = time.time() + budget_s
    total = sum(n for _, n in LEVELS)
    tqdm.write(STARTED_LINE)
    bar = tqdm(total=total, desc="DSpark cost profile", unit="req")
    try:
        for conc, n in LEVELS:
            if time.time() > end:
                break
            payloads = [{"text": LONG_PROMPT if i % 3 == 1 else PROMPTS[i % len(PROMPTS)],
                         "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}}
                        for i in range(n)]
            with ThreadPoolExecutor(conc) as pool:
                # requests run to the end (the budget is checked between levels): one abandoned by a client timeout
                # would keep the server busy after DONE_LINE
                for _ in pool.map(lambda p: _post(base + "/generate", p, REQUEST_TIMEOUT_S), payloads):
                    bar.update(1)
    except Exception as e:  # profiling is best-effort; the worker keeps refining online
        tqdm.write(f"DSpark cost profile load stopped early: {e}")
    finally:
        bar.close()
        tqdm.write(DONE_LINE)


def start_in_background(host: str, port: int, budget_s: float = 60.0) -> threading.Thread:
    host = "127.0.0.1" if host in ("0.0.0.0", "", None) else host
    t = threading.Thread(target=run_profile_load, args=(f"http://{host}:{port}", budget_s), daemon=True,
                         name="dspark-cost-profile")
    t.start()
    return t
