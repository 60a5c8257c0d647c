"""A minimal asyncio streaming client: the reference llmload's timings are held against.

    .venv/bin/python bench/ref_client.py --url http://127.0.0.1:PORT --concurrency 64 \
        --duration 20 --tokens 50 --out ref.jsonl

`--concurrency` tasks, each on one keep-alive connection opened before its first request,
send chat completions back to back for `--duration` seconds (bounded: it stops by itself)
and write one JSON line per request: its id (X-Request-Id), wall-clock send, TTFT and E2E in
seconds, timed from just before the request's bytes are written (`perf_counter_ns`) to the
read that brought the first content token and the read that ended the body. Nothing else
runs in the process: no parsing beyond finding the first content token, no recording, so the
distance between its times and the server's is the floor a Python client on this machine has.
bench/bench_chat.py `--reference` runs it against the same simulator after llmload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

_CONTENT = b'"content":"'


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
               body: bytes) -> dict[str, object]:  # fmt: skip
    rid = uuid.uuid4().hex
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Request-Id: {rid}\r\n\r\n"
    ).encode()
    sent_wall = time.time_ns()
    t0 = time.perf_counter_ns()
    writer.write(head + body)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"HTTP status {status!r}")
    chunked, length = False, None
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        if name.lower() == "content-length":
            length = int(value)
    first = None
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            now = time.perf_counter_ns()
            if first is None and _has_content(data):
                first = now
            if size == 0:
                break
    else:
        data = await reader.readexactly(length or 0)
        first = time.perf_counter_ns()
    end = time.perf_counter_ns()
    return {
        "request_id": rid,
        "sent_at_ns": sent_wall,
        "ttft_s": (first - t0) / 1e9 if first is not None else None,
        "e2e_s": (end - t0) / 1e9,
    }


def _has_content(data: bytes) -> bool:
    at = data.find(_CONTENT)
    return at >= 0 and data[at + len(_CONTENT) : at + len(_CONTENT) + 1] != b'"'


async def _user(url: str, body: bytes, deadline: float, out: list[dict[str, object]]) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    try:
        first = True
        while time.monotonic() < deadline:
            row = await _one(reader, writer, f"{host}:{port}", body)
            row["first_on_connection"], first = first, False
            out.append(row)
    finally:
        writer.close()


async def _main(args: argparse.Namespace) -> list[dict[str, object]]:
    body = json.dumps(
        {
            "model": args.model,
            "messages": [{"role": "user", "content": "hello " * 32}],
            "max_tokens": args.tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ).encode()
    out: list[dict[str, object]] = []
    deadline = time.monotonic() + args.duration
    await asyncio.gather(*(_user(args.url, body, deadline, out) for _ in range(args.concurrency)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="sim")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = asyncio.run(_main(args))
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} requests in {args.duration:g} s")


if __name__ == "__main__":
    main()
