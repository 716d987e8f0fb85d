"""Where does a speculative server's step time go, next to SGLang without speculation under the same load?

Starts `none-sync` (SGLang, no speculation, synchronous scheduler) and a DSPARK_EXT server (`--sleep-on-idle` both),
warms both, then sends the same closed-loop load to each in turn, alternating the order every round. Per round:

  --mode pyspy  py-spy samples the scheduler process (raw collapsed stacks OUT/spy_<server>_<round>.txt); report
                with `python benchmarks/plain_step_pyspy_report.py OUT/prof_<C>.json` (ms of samples per token)
  --mode cpu    /proc CPU counters of every process of each server, and of each scheduler thread, per output token

    python benchmarks/plain_step_profile.py --mode pyspy --concurrency 4 --requests 12 --max-tokens 128 --rounds 4
    python benchmarks/plain_step_profile.py --mode cpu -- --dspark-controller fixed:1   # flags after -- go to dspark

py-spy comes with the dev venv and needs ptrace rights. Results: OUT/prof_<C>.json or OUT/cpu_<C>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_dspark.bench.load import run_load_sync  # noqa: E402
from sglang_dspark.bench.prompts import eval_mix  # noqa: E402
from sglang_dspark.bench.server import ServerProcess  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
# the dev venv's py-spy, whether or not the venv is on PATH
PY_SPY = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")


def _stat_fields(path: str) -> tuple[str, list[str]]:
    text = open(path).read()
    close = text.rfind(")")
    return text[text.find("(") + 1:close], text[close + 2:].split()


def cpu_seconds(srv: ServerProcess) -> dict[str, float]:
    """CPU seconds so far of every process the server started (same `getsid`, by command), and of each scheduler thread."""
    sid, out = os.getsid(srv.proc.pid), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            _, f = _stat_fields(f"/proc/{pid}/stat")
            if int(f[3]) != sid:
                continue
            name = open(f"/proc/{pid}/cmdline").read().split("\0")[0][:40]
            out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / HZ
            if "scheduler" in name:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    comm, tf = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
                    key = f"T:{comm}" + ("/main" if tid == pid else "")
                    out[key] = out.get(key, 0.0) + (int(tf[11]) + int(tf[12])) / HZ
        except OSError:
            pass
    return out


def scheduler_pid(srv: ServerProcess) -> int:
    found = subprocess.run(["pgrep", "-f", "sglang::scheduler", "-s", str(os.getsid(srv.proc.pid))],
                           capture_output=True, text=True).stdout.split()
    return int(found[0])


def measure(srv: ServerProcess, name: str, rnd: int, prompts, args) -> dict:
    spy, before = None, None
    if args.mode == "pyspy":
        spy = subprocess.Popen([PY_SPY, "record", "-p", str(scheduler_pid(srv)), "-r", "50", "--nonblocking",
                                "-f", "raw", "-o", f"{args.out}/spy_{name}_{rnd}.txt", "-d", "3600"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    else:
        before, client0 = cpu_seconds(srv), sum(os.times()[:2])
    r = run_load_sync(srv.base_url, prompts, args.concurrency, args.max_tokens, progress=False)
    toks = sum(x.output_tokens for x in r.requests)
    row = {"tok_s": toks / r.wall_s, "tokens": toks, "wall": r.wall_s}
    if spy is not None:
        spy.send_signal(2)
        spy.wait()
    else:
        after = cpu_seconds(srv)
        per = {k: round(1000 * (v - before.get(k, 0.0)) / toks, 3) for k, v in after.items() if v > before.get(k, 0.0)}
        per["client"] = round(1000 * (sum(os.times()[:2]) - client0) / toks, 3)
        row["cpu_ms_per_tok"] = per
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("pyspy", "cpu"), default="cpu")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=12, help="requests per server per round")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default="runs/profile")
    p.add_argument("dspark_flags", nargs="*", help="extra flags for the DSPARK_EXT server (after --)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prompts = eval_mix(20)
    servers = {
        "none-sync": ServerProcess(["--no-dspark", "--disable-overlap-schedule", "--sleep-on-idle"],
                                   log_path=f"{args.out}/none-sync.log"),
        "dspark": ServerProcess(["--sleep-on-idle", *args.dspark_flags], log_path=f"{args.out}/dspark.log"),
    }
    try:
        for srv in servers.values():
            srv.start()
        for srv in servers.values():  # warm the greedy path
            for _ in range(3):
                run_load_sync(srv.base_url, prompts[:8], 4, 32, progress=False)
        results: dict[str, list[dict]] = {k: [] for k in servers}
        for rnd in range(args.rounds):
            order = list(servers) if rnd % 2 == 0 else list(servers)[::-1]
            batch = [prompts[(rnd * args.requests + i) % len(prompts)] for i in range(args.requests)]
            for name in order:
                row = measure(servers[name], name, rnd, batch, args)
                results[name].append(row)
                print(name, rnd, json.dumps(row), flush=True)
        path = f"{args.out}/{'prof' if args.mode == 'pyspy' else 'cpu'}_{args.concurrency}.json"
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print("wrote", path)
    finally:
        for srv in servers.values():
            srv.stop()


if __name__ == "__main__":
    main()
