"""One small blocking exchange outside the load: probes and `llmload check`.

    reply = exchange(pool, "GET", url, headers=h, timeout=5.0)
    reply.status, reply.json(), reply.headers["server"], reply.failure

Never the hot path (that is `client.execute`). Transport failures are data on the reply
(`error`, and its class from `errors.transport_kind`), never raised; redirects are not
followed and nothing is retried. `timeout` bounds the whole exchange after the connection,
headers and body: a server that answers and then sends keep-alive bytes forever, or stops,
is a timeout ("HTTP 200, but the response did not end within 30 s").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import urllib3

from locustfiles.request.errors import TIMEOUT, TRANSPORT_ERRORS, transport_kind

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class HttpStatusError(Exception):
    """A reply with a status other than 2xx (`Reply.raise_for_status`)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status = status


@dataclass(frozen=True)
class Reply:
    """What came back: status None when no response was read whole (then `error`)."""

    status: int | None
    data: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    error: BaseException | None = None
    failure: str | None = None  # the error's class: connect | timeout | transport
    elapsed_s: float = 0.0

    def raise_for_status(self) -> Reply:
        """This reply, if it came with a 2xx status; else HttpStatusError (or the transport
        error that left no reply)."""
        if self.error is not None:
            raise self.error
        assert self.status is not None
        if not 200 <= self.status < 300:
            text = " ".join(self.data[:200].decode("utf-8", "replace").split())
            raise HttpStatusError(self.status, text)
        return self

    def json(self) -> Any:
        """The body parsed as JSON; None when empty or not JSON."""
        try:
            return json.loads(self.data) if self.data else None
        except ValueError:
            return None


def exchange(
    pool: urllib3.PoolManager,
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Reply:
    """Send one request (a JSON body if given) and read its whole response."""
    data = _dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})} if data else dict(headers or {})
    t0 = time.perf_counter()
    resp: Any = None
    try:
        resp = pool.urlopen(method, url, body=data, headers=hdrs, timeout=timeout,
                            retries=False, redirect=False, preload_content=False)  # fmt: skip
        content = _read_within(resp, t0 + timeout)
        if content is None:
            raise TimeoutError(
                f"HTTP {resp.status}, but the response did not end within {timeout:.3g} s"
            )
    except TRANSPORT_ERRORS as exc:
        if resp is not None:
            resp.close()
        kind = transport_kind(exc, responded=resp is not None)
        return Reply(None, error=exc, failure=kind, elapsed_s=time.perf_counter() - t0)
    resp.release_conn()
    found = {k.lower(): v for k, v in resp.headers.items()}
    return Reply(resp.status, content, found, elapsed_s=time.perf_counter() - t0)


def _read_within(resp: Any, deadline: float) -> bytes | None:
    """The whole body, read by pieces until `deadline` (perf_counter); None past it."""
    sock = getattr(getattr(resp, "_connection", None), "sock", None)
    parts: list[bytes] = []
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        if sock is not None:
            sock.settimeout(left)
        try:
            piece = resp.read1(65536)
        except TRANSPORT_ERRORS as exc:
            if transport_kind(exc, responded=True) == TIMEOUT:
                return None
            raise
        if not piece:
            return b"".join(parts)
        parts.append(piece)
