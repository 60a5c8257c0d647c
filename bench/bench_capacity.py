"""One client process's capacity, measured against a server that outpaces it.

Against `llmload sim` on a 2-core machine the simulator's own core saturates first, so
`bench_chat.py`'s events/s at saturation are the pair's (docs/benchmarks.md, issue 25, fourth
cut). Here the server is `bench/fast_sse_server.py` (about 3 µs per event), pinned to one
core, and each client in turn gets the other: llmload's worker (`locustfiles/chat.py`, local
runner, events logged as in a real run) with its SSE reader in C and then in Python
(`LLMLOAD_SSE=python`), and the bare Locust loop (`bench/bare_locustfile.py`: HttpUser +
sseclient-py, nothing recorded), `--rounds` times, alternating. Per client: events/s in the
steady window (llmload: chunk arrivals between the step's warm-up end and its end; bare: its
own window count) and CPU per request (the process's user+system time over the requests it
finished).

    .venv/bin/python bench/bench_capacity.py [--rounds 2] [--concurrency 128] [--duration 20]
        [--tokens 100] [--clients native,python,bare]

Simulated server: these figures describe the clients.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_chat import steady_rate, worker_command  # noqa: E402  (bench/: the script's folder)
from bench_vs_locust import run_bare_at  # noqa: E402

CORES = sorted(os.sched_getaffinity(0))


def _pin(core: int):  # type: ignore[no-untyped-def]
    return (lambda: os.sched_setaffinity(0, {core})) if len(CORES) > 1 else None


@contextmanager
def fast_server(work: Path, tokens: int, seconds: float, per_write: int) -> Iterator[str]:
    port_file = work / "port"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "fast_sse_server.py"), "--port-file",
         str(port_file), "--tokens", str(tokens), "--max-seconds", str(seconds),
         "--events-per-write", str(per_write)],
        stdout=subprocess.DEVNULL, preexec_fn=_pin(CORES[0]),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("fast_sse_server.py did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.terminate()
        proc.wait(10)


def run_llmload(
    args: argparse.Namespace, impl: str, work: Path
) -> tuple[float, float, float, float]:
    """(events/s, CPU ms per request, share of events that shared a read, the kernel's share
    of the CPU time) of one worker."""
    import pyarrow.parquet as pq

    with fast_server(work, args.tokens, args.duration + 120, args.events_per_write) as url:
        cmd = worker_command(url, work, args)
        env = {**os.environ, "LLMLOAD_SSE": impl}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, preexec_fn=_pin(CORES[-1]))  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        output = proc.stdout.read() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"locust failed:\n{output[-3000:]}")
    run = next(p for p in (work / "runs").iterdir() if p.is_dir())
    requests = pq.read_table(run / "requests").to_pandas()
    chunks = pq.read_table(run / "chunks").to_pandas()
    manifest = json.loads((run / "manifest.json").read_text())
    assert [w["sse_reader"] for w in manifest["workers"]] == [impl], manifest["workers"]
    step = manifest["steps"][0]
    lo = step["spawned_at_ns"] + int(step["warmup_s"] * 1e9)
    hi = step["ended_at_ns"]
    rate = steady_rate(requests, chunks, lo, hi)
    cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000 / max(len(requests), 1)
    shared = requests["coalesced_events"].sum() / max(requests["events"].sum(), 1)
    system = usage.ru_stime / max(usage.ru_utime + usage.ru_stime, 1e-9)
    return rate, cpu_ms, float(shared), system


def run_bare(args: argparse.Namespace, work: Path) -> tuple[float, float]:
    """(events/s, CPU ms per request) of the bare Locust loop."""
    with fast_server(work, args.tokens, args.duration + 120, args.events_per_write) as url:
        return run_bare_at(url, "fast-sse", args, work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--clients", default="native,python,bare")
    parser.add_argument(
        "--events-per-write", type=int, default=1,
        help="the server's events per send (fast_sse_server.py): above 1 where its one send per "
        "event would saturate its core first (long responses)",
    )  # fmt: skip
    args = parser.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC {platform.node()} "
          f"Python {platform.python_version()}, {os.cpu_count()} cores; server: "
          f"bench/fast_sse_server.py (simulated: client figures only)")  # fmt: skip
    print(f"# command: {' '.join(sys.argv)}")
    print("| round | client | events/s | CPU per request | CPU per event | kernel share | "
          "events sharing a read |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for round_ in range(1, args.rounds + 1):
        for client in clients:
            with tempfile.TemporaryDirectory(prefix="llmload-bench-capacity-") as tmp:
                time.sleep(1)
                if client == "bare":
                    rate, cpu = run_bare(args, Path(tmp))
                    shared = system = "n/a"
                else:
                    rate, cpu, frac, sys_share = run_llmload(args, client, Path(tmp))
                    shared, system = f"{frac:.0%}", f"{sys_share:.0%}"
            per_event = cpu * 1000 / args.tokens
            label = {"native": "llmload (C reader)", "python": "llmload (Python reader)"}
            print(f"| {round_} | {label.get(client, 'bare Locust')} | {rate:,.0f} | {cpu:.3f} ms | "
                  f"{per_event:.2f} µs | {system} | {shared} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
