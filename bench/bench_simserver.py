"""Benchmark of the simulated engine: sustained SSE events/s and concurrent streams.

Starts `python -m infra.simserver --profile tiny` pinned to one core and drives it from this
process (pinned to another core when there is one) with a raw asyncio keep-alive client that
only counts events, so the client is not the bottleneck.

    .venv/bin/python bench/bench_simserver.py [--connections 256] [--duration 5]
        [--streams 5000] [--hold 3] [--json FILE]

Phase 1 (throughput): `--connections` keep-alive connections each send streaming chat
requests (100 tokens, ignore_eos) back to back for `--duration` seconds after a warm-up;
events/s are counted on the client and on the server (/metrics), with the server's CPU use.
Phase 2 (concurrency): `--streams` connections each open one long stream; once the server
runs all of them (its running gauge) and the client has every stream's headers, they are
held open for `--hold` seconds (events/s measured), then all closed by the client: the
server must cancel every one and free every slot and KV token (checked in /metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERN = b"data: "
END = b"\r\n0\r\n\r\n"


def request_bytes(port: int, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": "llmload-sim-tiny",
            "messages": [{"role": "user", "content": "benchmark prompt of eight words here"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class Counter:
    def __init__(self) -> None:
        self.events = 0
        self.responses = 0
        self.open_streams = 0
        self.peak_open = 0
        self.errors = 0


class StreamClient(asyncio.Protocol):
    """Sends a request, counts `data: ` events until the chunked body ends, repeats."""

    def __init__(
        self, request: bytes, counter: Counter, repeat: bool, done: asyncio.Future[int]
    ) -> None:
        self.request = request
        self.counter = counter
        self.repeat = repeat
        self.done = done
        self.tail = b""
        self.events_in_response = 0
        self.transport: asyncio.Transport | None = None
        self.stop = False
        self.seen_headers = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        joined = self.tail + data
        n = joined.count(PATTERN)
        self.counter.events += n
        self.events_in_response += n
        if not self.seen_headers:
            self.seen_headers = True
            self.counter.open_streams += 1
            self.counter.peak_open = max(self.counter.peak_open, self.counter.open_streams)
        if joined.endswith(END):
            self.counter.responses += 1
            self.counter.open_streams -= 1
            self.seen_headers = False
            self.tail = b""
            if self.repeat and not self.stop:
                assert self.transport is not None
                self.transport.write(self.request)
            else:
                if not self.done.done():
                    self.done.set_result(self.events_in_response)
                assert self.transport is not None
                self.transport.close()
            self.events_in_response = 0
        else:
            self.tail = joined[-5:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.counter.errors += 1
            self.done.set_result(-1)


async def http_get(port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def metric(port: int, name: str) -> float:
    text = await http_get(port, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def phase_throughput(port: int, pid: int, connections: int, duration: float) -> dict:
    loop = asyncio.get_running_loop()
    counter = Counter()
    request = request_bytes(port, 100)
    clients = []
    for _ in range(connections):
        done: asyncio.Future[int] = loop.create_future()
        _, proto = await loop.create_connection(
            functools.partial(StreamClient, request, counter, True, done), "127.0.0.1", port
        )
        clients.append(proto)
    await asyncio.sleep(1.0)  # warm-up
    ev0, rq0, cpu0, t0 = counter.events, counter.responses, cpu_seconds(pid), time.monotonic()
    srv0 = await metric(port, "llmload_sim_sse_events_total")
    lag0 = await metric(port, "llmload_sim_engine_lag_seconds_total")
    await asyncio.sleep(duration)
    ev1, rq1, cpu1, t1 = counter.events, counter.responses, cpu_seconds(pid), time.monotonic()
    srv1 = await metric(port, "llmload_sim_sse_events_total")
    lag1 = await metric(port, "llmload_sim_engine_lag_seconds_total")
    for c in clients:
        c.stop = True
    await asyncio.wait([c.done for c in clients], timeout=30)
    elapsed = t1 - t0
    return {
        "connections": connections,
        "seconds": round(elapsed, 2),
        "client_events_per_s": round((ev1 - ev0) / elapsed),
        "server_events_per_s": round((srv1 - srv0) / elapsed),
        "requests_per_s": round((rq1 - rq0) / elapsed, 1),
        "server_cpu_percent": round(100 * (cpu1 - cpu0) / elapsed, 1),
        "engine_lag_s_per_s": round((lag1 - lag0) / elapsed, 3),
        "errors": counter.errors,
    }


async def phase_concurrency(port: int, pid: int, streams: int, hold: float) -> dict:
    """Open `streams` long streams, hold them all open for `hold` seconds, then cancel them
    all and check that the server freed every slot."""
    loop = asyncio.get_running_loop()
    counter = Counter()
    request = request_bytes(port, 3000)  # 5,000 x (3,000 + prompt) fits tiny's KV
    cancelled0 = await metric(port, "llmload_sim_requests_cancelled_total")
    t0 = time.monotonic()
    clients = []
    for i in range(0, streams, 500):
        batch = []
        for _ in range(min(500, streams - i)):
            done: asyncio.Future[int] = loop.create_future()
            batch.append(
                loop.create_connection(
                    functools.partial(StreamClient, request, counter, False, done),
                    "127.0.0.1",
                    port,
                )
            )
        clients += [proto for _, proto in await asyncio.gather(*batch)]
    running = 0.0
    while time.monotonic() - t0 < 120:
        running = await metric(port, "llmload_sim_requests_running")
        if running >= streams and counter.open_streams >= streams:
            break
        await asyncio.sleep(0.1)
    opened = time.monotonic() - t0
    ev0, cpu0, t1 = counter.events, cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(hold)
    ev1, cpu1, t2 = counter.events, cpu_seconds(pid), time.monotonic()
    running_end = await metric(port, "llmload_sim_requests_running")
    errors_before_close = counter.errors
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    freed_after = None
    while time.monotonic() - t2 < 30:
        now_running = await metric(port, "llmload_sim_requests_running")
        kv = await metric(port, "llmload_sim_kv_cache_reserved_tokens")
        if now_running == 0 and kv == 0:
            freed_after = round(time.monotonic() - t2, 3)
            break
        await asyncio.sleep(0.05)
    cancelled = await metric(port, "llmload_sim_requests_cancelled_total") - cancelled0
    return {
        "streams": streams,
        "seconds_to_open_all": round(opened, 2),
        "running_at_start_of_hold": int(running),
        "running_at_end_of_hold": int(running_end),
        "open_streams_client": counter.open_streams,
        "hold_seconds": round(t2 - t1, 2),
        "events_per_s_while_held": round((ev1 - ev0) / (t2 - t1)),
        "server_cpu_percent": round(100 * (cpu1 - cpu0) / (t2 - t1), 1),
        "cancelled_on_close": int(cancelled),
        "seconds_until_all_freed": freed_after,
        "errors_before_close": errors_before_close,
    }


def machine() -> dict:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds all streams stay open")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, args.streams * 2 + 1000))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    cores = sorted(os.sched_getaffinity(0))
    server_core = cores[0]
    client_cores = set(cores[1:]) or {server_core}

    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        cmd = [sys.executable, "-m", "infra.simserver", "--profile", "tiny", "--port", "0",
               "--port-file", str(port_file)]  # fmt: skip
        server = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            preexec_fn=lambda: os.sched_setaffinity(0, {server_core}),
        )
        try:
            deadline = time.monotonic() + 20
            while not port_file.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the simulator did not start")
                time.sleep(0.05)
            port = int(port_file.read_text())
            os.sched_setaffinity(0, client_cores)
            throughput = asyncio.run(
                phase_throughput(port, server.pid, args.connections, args.duration)
            )
            concurrency = asyncio.run(phase_concurrency(port, server.pid, args.streams, args.hold))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    result = {
        "benchmark": "simserver",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "server": shlex.join(cmd[1:]),
        "server_core": server_core,
        "client_cores": sorted(client_cores),
        "machine": machine(),
        "throughput": throughput,
        "concurrency": concurrency,
        "server_exit_status": server.returncode,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
