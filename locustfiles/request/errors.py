"""Transport failures, classified once for every request llmload sends.

    kind = transport_kind(exc, responded)    # "connect" | "timeout" | "transport" | None
    text = describe(exc)                     # "NewConnectionError: ..." (one line, short)
    why = root_cause(exc)                    # "ConnectionRefusedError: [Errno 111] ..."

The classes (urllib3 2, on which every client here runs, and the socket's own errors):

- `connect`: no connection was made (refused, DNS, connect timeout), or the connection
  broke before any response (a reset while sending or waiting for the status line);
- `timeout`: a read timed out (waiting for the headers, or a socket read with a timeout);
- `transport`: any other I/O failure: the connection broke mid-response, bad chunked
  framing, TLS;
- None: not a transport failure (a bug in llmload: its callers record it as such).

Each caller names the class its own way: the load's error kinds (`client.py`), a probe's
outcome (`run/probe.py`), `llmload check`'s answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from analysis.kernel.schema import SHAPE_KINDS

if TYPE_CHECKING:
    from locustfiles.request.record import RequestRecord

CONNECT: Final = "connect"
TIMEOUT: Final = "timeout"
TRANSPORT: Final = "transport"

# exceptions an exchange can raise on the wire (everything else is a bug)
TRANSPORT_ERRORS: Final = (HTTPError, OSError)


def refused_status(status: int | None) -> bool:
    """Whether a response's status means the server refused the request as such (4xx, not
    408 or 429): the same request sent again gets the same answer."""
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def no_completion(record: RequestRecord) -> bool:
    """A 200 that carried no completion at all: a page, an empty or unreadable body
    (SHAPE_KINDS, no output). Like a refusal, the same request gets the same answer."""
    return (
        record.http_status == 200
        and record.error_kind in SHAPE_KINDS
        and record.first_token_ns is None
    )


def transport_kind(exc: BaseException, responded: bool = False) -> str | None:
    """The class of a failure while sending or reading; `responded`: headers were in."""
    if isinstance(exc, NewConnectionError | ConnectTimeoutError) or (
        not responded and isinstance(exc, ConnectionRefusedError | ProtocolError)
    ):
        return CONNECT
    if isinstance(exc, ReadTimeoutError | TimeoutError):
        return TIMEOUT
    if isinstance(exc, TRANSPORT_ERRORS):
        return TRANSPORT
    return None


def describe(exc: BaseException) -> str:
    """The exception in one short line: its class name and the start of its message."""
    return f"{type(exc).__name__}: {str(exc)[:160]}"


def root_cause(exc: BaseException) -> str:
    """The innermost cause of a failure, short: 'ConnectionRefusedError: [Errno 111] ...'."""
    inner: BaseException = exc
    while True:
        nxt = inner.__cause__ or inner.__context__
        reason = getattr(inner, "reason", None)
        if isinstance(reason, BaseException) and reason is not inner:
            nxt = reason
        if nxt is None or nxt is inner:
            break
        inner = nxt
    text = str(inner).split(": ", 1)[-1] if str(inner) else ""
    name = type(inner).__name__
    return f"{name}: {text}"[:160] if text and text != name else name
