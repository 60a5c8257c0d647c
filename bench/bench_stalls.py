"""Benchmark: the worker's own event-loop stalls while its event sink seals parts.

    .venv/bin/python bench/bench_stalls.py [--seconds 25] [--rate 600] [--chunks 100]

Each configuration runs in a fresh Python process, as a Locust worker would start: gevent
monkey-patched, locust imported (a realistic heap for the garbage collector), an EventSink
writing to a local directory with default settings (a part every 10 s). A producer appends
`--rate` requests/s of `--chunks` chunk rows each, allocating per request what the chat
user does; llmload's own LoopMonitor (5 ms probes) measures the loop's lag and records
every stall of 5 ms or more. Configurations:

- `cold`: nothing prepared (before issue 10): the first seal pays for Arrow's kernels,
  the Parquet writer and its zstd codec; the garbage collector scans the whole heap;
- `warm-up`: `warmup.warm_up()` before the first row (what a worker does at start);
- `warm-up + gc.freeze`: the worker's default (`--gc-freeze on`).

Printed per configuration: stalls, the longest, loop-lag p50/p99/max, and how many full
(generation 2) collections ran and their longest pause. Not a test: figures go to
docs/benchmarks.md with the date and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
from gevent import monkey
monkey.patch_all()
import gc, json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
import gevent
import locust  # noqa: F401  (a worker's heap)
import numpy as np
from locustfiles.worker.monitor import LoopMonitor
from locustfiles.sink.eventsink import EventSink, SinkConfig
from locustfiles.sink.warmup import freeze_gc, warm_up

warm, freeze, seconds, rate, chunks, tmp = {warm}, {freeze}, {seconds}, {rate}, {chunks}, {tmp!r}
gen2 = []
_start = [0]
def on_gc(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        _start[0] = time.perf_counter_ns()
    else:
        gen2.append(time.perf_counter_ns() - _start[0])
config = SinkConfig(tmp + "/events", "bench-run", "bench-w", spool_dir=Path(tmp) / "spool")
sink = EventSink(config).start()
if warm:
    warm_up(sink.encode_context)
if freeze:
    freeze_gc()
samples, stalls = [], []
monitor = LoopMonitor(samples.append, stalls.append).start()
gc.callbacks.append(on_gc)

def row(i):
    return {{"request_id": f"{{i:032x}}", "step": 0, "concurrency": 64, "scenario": "D(128,100)",
            "endpoint": "chat", "model": "bench", "stream": True, "prompt_tokens_requested": 128,
            "max_tokens": chunks, "prompt_sha256": "0" * 64, "sent_at_ns": time.time_ns(),
            "headers_ns": 1, "first_event_ns": 2, "first_token_ns": 2, "first_content_ns": 2,
            "last_token_ns": 3, "end_ns": 4, "http_status": 200, "status": "ok",
            "prompt_tokens": 128, "completion_tokens": chunks, "output_tokens": chunks,
            "output_tokens_source": "usage", "events": chunks + 2, "cold": False,
            "coalesced_events": 0, "worker_stall_ns": 0}}

def produce():
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < seconds:
        base = time.perf_counter_ns()
        offsets = [base + k * 1000 for k in range(chunks)]
        sink.append_request(row(n))
        sink.append_chunks(f"{{n:032x}}", offsets, [1] * chunks, [4] * chunks, ["content"] * chunks)
        n += 1
        gevent.sleep(max(0.0, start + n / rate - time.perf_counter()))
    return n

n = gevent.spawn(produce).get()
monitor.stop()
gc.callbacks.remove(on_gc)
report = sink.close(60)
lags = np.concatenate([np.asarray(s["loop_lag_us"]) for s in samples]) / 1000
print(json.dumps({{
    "requests": n, "stalls": len(stalls),
    "stall_max_ms": max((s["length_ns"] for s in stalls), default=0) / 1e6,
    "stall_total_ms": sum(s["length_ns"] for s in stalls) / 1e6,
    "lag_p50_ms": float(np.percentile(lags, 50)), "lag_p99_ms": float(np.percentile(lags, 99)),
    "lag_max_ms": float(lags.max()), "gen2": len(gen2), "gen2_max_ms": max(gen2, default=0) / 1e6,
    "parts": report.parts, "complete": report.complete,
}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--rate", type=float, default=600.0, help="requests/s")
    parser.add_argument("--chunks", type=int, default=100, help="chunk rows per request")
    args = parser.parse_args()
    print(
        f"# bench_stalls  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  {platform.node()}  python "
        f"{platform.python_version()}  {os.cpu_count()} CPUs  command: {' '.join(sys.argv)}"
    )
    print(f"# {args.rate:,.0f} requests/s x {args.chunks} chunk rows for {args.seconds:g} s")
    for name, warm, freeze in (
        ("cold", False, False),
        ("warm-up", True, False),
        ("warm-up + gc.freeze", True, True),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            code = CHILD.format(root=str(ROOT), warm=warm, freeze=freeze, seconds=args.seconds,
                                rate=args.rate, chunks=args.chunks, tmp=tmp)  # fmt: skip
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{name:<22} stalls {r['stalls']:>3} (longest {r['stall_max_ms']:6.1f} ms, total "
            f"{r['stall_total_ms']:7.1f} ms)  lag p50 {r['lag_p50_ms']:.2f} p99 "
            f"{r['lag_p99_ms']:.2f} max {r['lag_max_ms']:6.1f} ms  full GCs {r['gen2']} "
            f"(longest {r['gen2_max_ms']:.1f} ms)  parts {r['parts']} complete {r['complete']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
