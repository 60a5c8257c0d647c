"""A bare Locust loop: what a user writes without llmload (bench/bench_vs_locust.py).

Locust's own HttpUser (requests) and sseclient-py: one streamed chat completion per task,
every SSE event parsed as JSON and its content counted, nothing recorded but three counters:
events and requests finished inside the steady window (and all requests), written as JSON to BARE_OUT when the
test stops. Settings come from the environment (BARE_MODEL, BARE_TOKENS, BARE_WARMUP_S,
BARE_OUT), so the comparison script needs no Locust options of its own.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import sseclient
from locust import HttpUser, events, task

MODEL = os.environ.get("BARE_MODEL", "llmload-sim-tiny")
TOKENS = int(os.environ.get("BARE_TOKENS", "100"))
WARMUP_S = float(os.environ.get("BARE_WARMUP_S", "2"))
OUT = os.environ.get("BARE_OUT", "bare.json")
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello " * 32}],
    "max_tokens": TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
}
COUNTS: dict[str, Any] = {
    "events": 0, "requests": 0, "all_requests": 0, "errors": 0, "started": None, "last": 0.0
}  # fmt: skip


class BareChatUser(HttpUser):
    @task
    def chat(self) -> None:
        now = time.monotonic()
        if COUNTS["started"] is None:
            COUNTS["started"] = now
        steady = now - COUNTS["started"] >= WARMUP_S
        seen = 0
        with self.client.post(
            "/v1/chat/completions", json=BODY, stream=True, catch_response=True
        ) as resp:
            if resp.status_code != 200:
                COUNTS["errors"] += 1
                resp.failure(f"HTTP {resp.status_code}")
                return
            for event in sseclient.SSEClient(resp.iter_content(chunk_size=None)).events():
                if event.data == "[DONE]":
                    continue
                chunk = json.loads(event.data)
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    seen += 1
        COUNTS["all_requests"] += 1
        if steady:
            COUNTS["events"] += seen
            COUNTS["requests"] += 1
            COUNTS["last"] = time.monotonic()


@events.test_stop.add_listener
def _write(**_: Any) -> None:
    started = COUNTS["started"] or 0.0
    window = max(COUNTS["last"] - (started + WARMUP_S), 1e-9)
    with open(OUT, "w") as out:
        json.dump({**COUNTS, "window_s": window}, out)
