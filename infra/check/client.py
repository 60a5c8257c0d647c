"""Plain blocking HTTP for `llmload check` (urllib3 in a normal process: no gevent, no locust).

Streams are read with the same SSE reader and event rules as the load workers
(`locustfiles/request/sse.py`, `locustfiles/request/stream.py`), so the check judges a stream as a run would.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ReadTimeoutError,
)

from locustfiles.request.record import RequestRecord
from locustfiles.request.sse import events
from locustfiles.request.stream import StreamFailure, StreamState


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


def _transport_error(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {str(exc)[:160]}"
    if isinstance(exc, NewConnectionError | ConnectTimeoutError | ConnectionRefusedError):
        return f"connect: {text}"
    if isinstance(exc, ReadTimeoutError | TimeoutError):
        return f"timeout: {text}"
    return f"transport: {text}"


class Target:
    """The server under check: base URL, auth header, one keep-alive pool."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.pool = urllib3.PoolManager(num_pools=4, maxsize=2, retries=False)

    def url(self, path: str) -> str:
        return path if "://" in path else self.base + path

    def _headers(self, body: bool) -> dict[str, str]:
        hdrs = {**self.headers, "X-Request-Id": "check-" + uuid.uuid4().hex}
        if body:
            hdrs["Content-Type"] = "application/json"
        return hdrs

    def get(self, path: str, timeout: float | None = None) -> Answer:
        return self._exchange("GET", path, None, timeout)

    def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Answer:
        return self._exchange("POST", path, body, timeout)

    def get_text(
        self, url: str, timeout: float | None = None
    ) -> tuple[int | None, str, str | None]:
        """(status, body text, transport error) of a GET (Prometheus /metrics)."""
        try:
            resp = self.pool.request(
                "GET", self.url(url), headers=self.headers, timeout=timeout or self.timeout
            )
        except (HTTPError, OSError) as exc:
            return None, "", _transport_error(exc)
        return resp.status, resp.data.decode("utf-8", "replace"), None

    def _exchange(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> Answer:
        data = json.dumps(body).encode() if body is not None else None
        t0 = time.perf_counter()
        try:
            resp = self.pool.request(
                method,
                self.url(path),
                body=data,
                headers=self._headers(data is not None),
                timeout=timeout or self.timeout,
                redirect=False,
            )
        except (HTTPError, OSError) as exc:
            return Answer(None, error=_transport_error(exc), elapsed_s=time.perf_counter() - t0)
        elapsed = time.perf_counter() - t0
        try:
            parsed = json.loads(resp.data) if resp.data else None
        except ValueError:
            parsed = None
        headers = {k.lower(): v for k, v in resp.headers.items()}
        return Answer(resp.status, parsed, headers, elapsed_s=elapsed)

    def stream(
        self,
        path: str,
        body: dict[str, Any],
        chat: bool,
        cancel_after_tokens: int | None = None,
        on_cancel_point: Any = None,
    ) -> StreamAnswer:
        """POST a streaming request and read it to the end (or cancel after some tokens).

        `on_cancel_point()` is called once the tokens are in, before the disconnect (the
        caller looks at the server's gauges while the request is still running).
        """
        record = RequestRecord(
            request_id=uuid.uuid4().hex, step=0, concurrency=1, cold=False, scenario="check",
            endpoint="chat" if chat else "completions", model=body.get("model"), stream=True,
            prompt_tokens_requested=None, max_tokens=body.get("max_tokens"), prompt_sha256="",
        )  # fmt: skip
        answer = StreamAnswer(None, record)
        state = StreamState(record, chat, None)
        resp: Any = None
        t0 = time.perf_counter_ns()
        try:
            resp = self.pool.urlopen(
                "POST", self.url(path), body=json.dumps(body).encode(),
                headers=self._headers(True), timeout=self.timeout, redirect=False,
                preload_content=False, decode_content=False,
            )  # fmt: skip
            answer.status = record.http_status = resp.status
            record.headers_ns = time.perf_counter_ns() - t0
            if resp.status != 200:
                raw = resp.read(4096)
                try:
                    answer.body = json.loads(raw)
                except ValueError:
                    answer.body = None
                answer.error_kind, answer.detail = "http", f"HTTP {resp.status}"
                return answer
            for datas, arrived in events(resp):
                for data in datas:
                    state.on_event(data, arrived - t0)
                if cancel_after_tokens is not None and answer.tokens >= cancel_after_tokens:
                    if on_cancel_point is not None:
                        on_cancel_point()
                    answer.cancelled = True
                    return answer
            record.end_ns = time.perf_counter_ns() - t0
            state.on_end()
        except StreamFailure as exc:
            answer.error_kind, answer.detail = exc.kind, exc.detail
        except (HTTPError, OSError) as exc:
            kind = _transport_error(exc).split(":", 1)[0]
            truncated = answer.status == 200 and kind != "timeout"
            answer.error_kind = "stream_truncated" if truncated else kind
            answer.detail = _transport_error(exc)
        finally:
            if record.end_ns is None:
                record.end_ns = time.perf_counter_ns() - t0
            answer.done, answer.finish_reason = state.done, state.finish_reason
            if resp is not None:
                if answer.cancelled or answer.error_kind is not None:
                    resp.close()  # disconnect: the server should free the sequence
                resp.release_conn()
        return answer
