"""Plain blocking HTTP for `llmload check` (urllib3 in a plain process: no locust, no patching).

Streams go through the load's own request path (`locustfiles.request.client.execute`: the
same SSE loop, event rules and failure kinds), so the check judges a stream as a run would;
other requests are `locustfiles.request.exchange` exchanges, classified the same way.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import urllib3

from analysis.kernel.schema import TIMEOUT_KINDS
from locustfiles.request.client import Limits, Tap, execute
from locustfiles.request.errors import TRANSPORT, describe
from locustfiles.request.exchange import Reply, exchange
from locustfiles.request.record import RequestRecord

WHOLE = 10
"""A streamed check's whole request may take this many times --timeout (each read and the
first token get --timeout itself): bounded, even for a server that trickles tokens forever."""


@dataclass
class Answer:
    """One exchange: status (None when no response), parsed JSON body, headers, failure."""

    status: int | None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # transport failure ("connect: ...", "timeout: ...")
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def connect_failed(self) -> bool:
        return self.error is not None and self.error.startswith("connect")

    def error_message(self) -> str:
        """The server's error text, if its body carried one (OpenAI `{"error": {...}}`)."""
        err = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(err, dict):
            return str(err.get("message") or err.get("code") or "")[:160]
        if isinstance(self.body, dict) and "detail" in self.body:  # FastAPI-style 422
            return str(self.body["detail"])[:160]
        return str(err or "")[:160]


@dataclass
class StreamAnswer:
    """A streamed request read to its end (or until the client walked away)."""

    status: int | None
    record: RequestRecord
    done: bool = False  # saw [DONE]
    finish_reason: str | None = None
    cancelled: bool = False  # the client disconnected on purpose
    error_kind: str | None = None
    detail: str | None = None
    body: Any = None  # a non-200 answer's JSON body

    @property
    def tokens(self) -> int:
        return sum(self.record.chunk_tokens)

    @property
    def usage_in_stream(self) -> bool:
        return self.record.completion_tokens is not None

    @property
    def ttft_s(self) -> float | None:
        t = self.record.first_token_ns
        return None if t is None else t / 1e9

    @property
    def e2e_s(self) -> float | None:
        t = self.record.end_ns
        return None if t is None else t / 1e9


def _transport_error(reply: Reply) -> str:
    """A failed exchange as `llmload check` says it: "connect: ...", "timeout: ...", ..."""
    assert reply.error is not None
    return f"{reply.failure or TRANSPORT}: {describe(reply.error)}"


def _stream_answer(record: RequestRecord, tap: Tap) -> StreamAnswer:
    """A streamed request's record in the check's words (its kinds: http, connect, timeout,
    transport, and the stream's own: stream_truncated, malformed_event, ...)."""
    answer = StreamAnswer(record.http_status, record)
    if tap.state is not None:
        answer.done, answer.finish_reason = tap.state.done, tap.state.finish_reason
    kind = record.error_kind
    if record.status == "cancelled":
        answer.cancelled = True
    elif record.http_status is not None and record.http_status != 200:
        answer.error_kind, answer.detail = "http", f"HTTP {record.http_status}"
        try:
            answer.body = json.loads(tap.error_body)
        except ValueError:
            answer.body = None
    elif kind is not None:
        if kind in TIMEOUT_KINDS:
            kind = "timeout"
        elif kind == "stream_truncated" and record.http_status is None:
            kind = TRANSPORT  # broke before any response (e.g. TLS)
        answer.error_kind, answer.detail = kind, record.error_detail
    return answer


class Target:
    """The server under check: base URL, auth header, one keep-alive pool."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.pool = urllib3.PoolManager(num_pools=4, maxsize=2, retries=False)

    def url(self, path: str) -> str:
        return path if "://" in path else self.base + path

    def _headers(self) -> dict[str, str]:
        return {**self.headers, "X-Request-Id": "check-" + uuid.uuid4().hex}

    def get(self, path: str, timeout: float | None = None) -> Answer:
        return self._exchange("GET", path, None, timeout)

    def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Answer:
        return self._exchange("POST", path, body, timeout)

    def get_text(
        self, url: str, timeout: float | None = None
    ) -> tuple[int | None, str, str | None]:
        """(status, body text, transport error) of a GET (Prometheus /metrics)."""
        reply = exchange(self.pool, "GET", self.url(url), None, self.headers,
                         timeout or self.timeout)  # fmt: skip
        if reply.error is not None:
            return None, "", _transport_error(reply)
        return reply.status, reply.data.decode("utf-8", "replace"), None

    def _exchange(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> Answer:
        reply = exchange(self.pool, method, self.url(path), body, self._headers(),
                         timeout or self.timeout)  # fmt: skip
        if reply.error is not None:
            return Answer(None, error=_transport_error(reply), elapsed_s=reply.elapsed_s)
        return Answer(reply.status, reply.json(), reply.headers, elapsed_s=reply.elapsed_s)

    def stream(
        self,
        path: str,
        body: dict[str, Any],
        chat: bool | str,  # chat (True), completions (False), or the --endpoint's name
        cancel_after_tokens: int | None = None,
        on_cancel_point: Any = None,
    ) -> StreamAnswer:
        """POST a streaming request and read it to the end (or cancel after some tokens).

        `on_cancel_point()` is called once the tokens are in, before the disconnect (the
        caller looks at the server's gauges while the request is still running). The
        timeout holds for the headers and for every read after them.
        """
        headers = self._headers()
        record = RequestRecord(
            request_id=headers["X-Request-Id"], step=0, concurrency=1, cold=False,
            scenario="check",
            endpoint=chat if isinstance(chat, str) else "chat" if chat else "completions",
            model=body.get("model"), stream=True, prompt_tokens_requested=None,
            max_tokens=body.get("max_tokens", body.get("max_output_tokens")), prompt_sha256="",
        )  # fmt: skip
        limits = Limits(connect_timeout=self.timeout, request_timeout=self.timeout * WHOLE,
                        ttft_timeout=self.timeout, stall_timeout=None,
                        read_timeout=self.timeout)  # fmt: skip
        tap = Tap(on_cancel_point)
        execute(self.pool, self.url(path), body, headers, record, limits,
                cancel_after_tokens=cancel_after_tokens, tap=tap)  # fmt: skip
        return _stream_answer(record, tap)
