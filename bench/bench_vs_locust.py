"""llmload's worker against a bare Locust loop, back to back, on the same simulated engine.

Each pair runs `bench/bench_chat.py` (one llmload worker process, event logging on) and then
`bench/bare_locustfile.py` (Locust's HttpUser + sseclient-py, nothing recorded) at the same
concurrency, duration and output length, each client pinned to one core and the simulator
to the other. Per client: SSE events/s in the steady window and CPU per request (the Locust
process's own user+system time over the requests it finished).

    .venv/bin/python bench/bench_vs_locust.py [--pairs 2] [--concurrency 128] [--duration 20]
        [--tokens 100] [--sim-args ...]

Simulated engine: these figures describe the clients, not inference performance.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.chat import BIN, start_sim  # noqa: E402

FAST_SIM = ["--decode-base-ms", "0.1", "--decode-per-seq-us", "0", "--decode-per-kv-token-ns", "0"]


def run_llmload(args: argparse.Namespace) -> tuple[float, float]:
    """(events/s, CPU ms per request) of one bench_chat.py run."""
    cmd = [sys.executable, str(ROOT / "bench" / "bench_chat.py"), "--concurrency",
           str(args.concurrency), "--duration", str(args.duration), "--tokens", str(args.tokens),
           "--reference", "off", "--sim-args", *args.sim_args]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, timeout=args.duration + 300
    )
    rate = re.search(r"steady-window output events/s: ([\d,]+)", out.stdout)
    cpu = re.search(r"-> ([\d.]+) ms per request", out.stdout)
    if rate is None or cpu is None:
        raise SystemExit(f"bench_chat.py printed no figures:\n{out.stdout[-2000:]}")
    return float(rate.group(1).replace(",", "")), float(cpu.group(1))


def run_bare(args: argparse.Namespace, work: Path) -> tuple[float, float]:
    """(events/s, CPU ms per request) of the bare Locust loop against the simulator."""
    cores = sorted(os.sched_getaffinity(0))
    sim_args = ["--output-len", str(args.tokens), *args.sim_args]
    with start_sim(work / "sim", *sim_args) as sim:
        if len(cores) > 1:
            os.sched_setaffinity(sim.proc.pid, {cores[0]})
        return run_bare_at(sim.url, "llmload-sim-tiny", args, work)


def run_bare_at(url: str, model: str, args: argparse.Namespace, work: Path) -> tuple[float, float]:
    """(events/s, CPU ms per request) of the bare Locust loop against `url`, on the last core
    (`args`: concurrency, duration, tokens)."""
    cores = sorted(os.sched_getaffinity(0))
    out_file = work / "bare.json"
    env = {**os.environ, "BARE_TOKENS": str(args.tokens), "BARE_OUT": str(out_file),
           "BARE_MODEL": model, "BARE_WARMUP_S": "2"}  # fmt: skip
    users = str(args.concurrency)
    cmd = [str(BIN / "locust"), "-f", str(ROOT / "bench" / "bare_locustfile.py"), "--headless",
           "--only-summary", "--host", url, "-u", users, "-r", users,
           "-t", f"{args.duration + 2:g}s", "--stop-timeout", "5"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {cores[-1]})) if len(cores) > 1 else None)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    if not out_file.exists():
        err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        raise SystemExit(f"the bare Locust loop wrote no counts (status {status}):\n{err}")
    counts = json.loads(out_file.read_text())
    cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000 / max(counts["all_requests"], 1)
    return counts["events"] / counts["window_s"], cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--sim-args", nargs=argparse.REMAINDER, default=FAST_SIM)
    args = parser.parse_args()
    print(f"# {datetime.date.today()} {platform.node()} Python {platform.python_version()}, "
          f"{os.cpu_count()} cores; simulated engine (client figures only)")  # fmt: skip
    print(f"# concurrency {args.concurrency}, {args.tokens} tokens, {args.duration:g} s, "
          f"sim {' '.join(args.sim_args)}")  # fmt: skip
    print(
        "| pair | llmload events/s | llmload CPU/request | bare Locust events/s | bare CPU/request | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for pair in range(1, args.pairs + 1):
        ours = run_llmload(args)
        with tempfile.TemporaryDirectory(prefix="llmload-bench-bare-") as tmp:
            time.sleep(1)
            bare = run_bare(args, Path(tmp))
        print(f"| {pair} | {ours[0]:,.0f} | {ours[1]:.3f} ms | {bare[0]:,.0f} | {bare[1]:.3f} ms | "
              f"{ours[0] / bare[0]:.2f}x |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
