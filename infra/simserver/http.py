"""A small HTTP/1.1 server protocol on asyncio: keep-alive, Content-Length and chunked
request bodies, whole or chunked (streamed) responses. Requests on one connection are
answered in order, one at a time.

Every response carries `X-Llmload-Simulated: true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis.kernel.anchor import wall_and_perf_ns

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
_PAUSE_READING_AT = 4 * 1024 * 1024

REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}

SERVER_HEADERS = b"Server: llmload-sim\r\nX-Llmload-Simulated: true\r\n"
CHUNKED_END = b"0\r\n\r\n"


@dataclass
class Request:
    method: str
    path: str  # target without the query string
    version: str
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes
    keep_alive: bool
    received_ns: int = 0  # time.perf_counter_ns() when the request was complete
    received_unix_ns: int = 0  # time.time_ns() at the same moment
    # the kernel's receive time (unix ns) of the read that began the request: peeked as the
    # connection was accepted (`kernel_arrival_ns`), else from the stamped read (`StampedReads`);
    # 0 unknown (not Linux, or the request's bytes came behind another request's in one read)
    kernel_arrival_unix_ns: int = 0
    query: str = ""


class HttpError(Exception):
    """A malformed request: answered with `status` and the connection is closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def frame_chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer encoding)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise HttpError(400, "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise HttpError(400, f"unsupported protocol {version!r}")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return method, target, version, headers


def _parse_chunked(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at `pos`; None while incomplete."""
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpError(400, "malformed chunk size") from None
        pos = eol + 2
        if size == 0:
            # Skip trailers up to the empty line.
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                if eol == pos:
                    return bytes(body), eol + 2
                pos = eol + 2
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, "request body too large")
        pos += size + 2


Handler = Callable[[Request, "HttpConnection"], None]

SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None
"""Linux: the kernel stamps each received packet (set on the listening socket, inherited by
every accepted one); not exported by Python's socket module."""


def stamp_arrivals(sock: socket.socket) -> None:
    """Ask the kernel to timestamp what `sock` (a listening socket) receives; best effort."""
    if SO_TIMESTAMPNS is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def kernel_arrival_ns(transport: asyncio.BaseTransport) -> int:
    """The kernel's receive time (unix ns) of the first byte already waiting on a just
    accepted connection, peeked without consuming it; 0 when nothing waits yet (the accept
    was prompt), or it cannot be known (no stamps, not Linux). How long a request waited in
    the accept queue is the server's time, not the client's: the truth log keeps it."""
    raw = transport.get_extra_info("socket")
    if SO_TIMESTAMPNS is None or raw is None:
        return 0
    try:
        with socket.socket(fileno=socket.dup(raw.fileno())) as dup:
            _, ancillary, _, _ = dup.recvmsg(
                1, socket.CMSG_SPACE(16), socket.MSG_PEEK | socket.MSG_DONTWAIT
            )
    except OSError:  # BlockingIOError: nothing waiting
        return 0
    return _stamp_of(ancillary)


def _stamp_of(ancillary: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanos = struct.unpack("qq", data[:16])
            return int(seconds * 1_000_000_000 + nanos)
    return 0


class StampedReads:
    """A connection's reads with the kernel's receive time: asyncio's socket transport reads
    with `recv`, which drops the stamp; this takes over its read callback and reads with
    `recvmsg`, the rest as asyncio does (EOF, errors). So every request, not only a
    connection's first, knows when its bytes reached the kernel, and the time they waited for
    a busy server loop to read them is the server's in the truth log.

    It uses two of the CPython selector transport's private names (`_read_ready_cb`,
    `_sock`); where they are missing (another event loop) `install` declines and reads stay
    asyncio's own, without stamps."""

    SPACE = socket.CMSG_SPACE(16)

    def __init__(self, transport: Any, on_data: Callable[[bytes, int], None]) -> None:
        self.transport = transport
        self.sock: socket.socket = transport._sock
        self.on_data = on_data
        self.max_size = int(getattr(transport, "max_size", 256 * 1024))

    @classmethod
    def install(
        cls, transport: asyncio.BaseTransport, on_data: Callable[[bytes, int], None]
    ) -> StampedReads | None:
        if SO_TIMESTAMPNS is None or not isinstance(
            getattr(transport, "_sock", None), socket.socket
        ):
            return None
        if getattr(transport, "_read_ready_cb", False) is None or not hasattr(
            transport, "_read_ready__on_eof"
        ):  # _read_ready_cb: set (not None) by asyncio before connection_made
            return None
        reads = cls(transport, on_data)
        transport._read_ready_cb = reads.ready  # type: ignore[attr-defined]
        return reads

    def ready(self) -> None:
        tr = self.transport
        if tr._conn_lost:
            return
        try:
            data, ancillary, _, _ = self.sock.recvmsg(self.max_size, self.SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # as asyncio's own read
            tr._fatal_error(exc, "Fatal read error on socket transport")
            return
        if not data:
            tr._read_ready__on_eof()
            return
        try:
            self.on_data(data, _stamp_of(ancillary))
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            tr._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")


class HttpConnection(asyncio.Protocol):
    """One client connection. The handler answers through `respond` or the stream methods."""

    def __init__(self, handler: Handler, registry: set[HttpConnection]) -> None:
        self._handler = handler
        self._registry = registry
        self._buffer = bytearray()
        self._busy = False  # a request is being answered
        self._closed = False
        self._keep_alive = True
        self._sent_continue = False
        self._paused = False
        self.transport: asyncio.Transport | None = None
        self._kernel_arrival_unix_ns = 0  # the next request's, when known
        self.on_lost: Callable[[], None] | None = None  # set by the handler per request

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._registry.add(self)
        self._kernel_arrival_unix_ns = kernel_arrival_ns(transport)
        StampedReads.install(transport, self.stamped_data_received)

    def stamped_data_received(self, data: bytes, kernel_unix_ns: int) -> None:
        """`data_received` with the kernel's receive time of the read: a read into an empty
        buffer begins a request, whose arrival it is (unless the accept-time peek had it)."""
        if not self._buffer and not self._kernel_arrival_unix_ns:
            self._kernel_arrival_unix_ns = kernel_unix_ns
        self.data_received(data)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._busy:
            if len(self._buffer) > _PAUSE_READING_AT and self.transport and not self._paused:
                self.transport.pause_reading()
                self._paused = True
            return
        self._process()

    def eof_received(self) -> bool:
        # A client that half-closes is gone as far as a streaming response is concerned.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._registry.discard(self)
        callback, self.on_lost = self.on_lost, None
        if callback is not None:
            callback()

    # --- responses ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed or self.transport is None or self.transport.is_closing()

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
        close: bool = False,
    ) -> None:
        """Send a whole response and finish the request."""
        if close:
            self._keep_alive = False
        head = self._status_and_headers(status, headers)
        head += b"Content-Type: %b\r\nContent-Length: %d\r\n\r\n" % (
            content_type.encode(),
            len(body),
        )
        self.write(head + body)
        self.finish()

    def start_stream(
        self, status: int, content_type: str, headers: list[tuple[str, str]] | None = None
    ) -> bytes:
        """The head of a chunked response, to be written by the caller (with the first data)."""
        head = self._status_and_headers(status, headers)
        return head + b"Content-Type: %b\r\nTransfer-Encoding: chunked\r\n\r\n" % (
            content_type.encode()
        )

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self._closed:
            self.transport.write(data)

    def finish(self) -> None:
        """The current response is complete: go on with the next request or close."""
        self.on_lost = None
        self._busy = False
        if self._closed or self.transport is None:
            return
        if not self._keep_alive:
            self.transport.close()
            return
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        if self._buffer:
            asyncio.get_running_loop().call_soon(self._process)

    def abort(self) -> None:
        """Drop the connection at once (the client sees a reset or a truncated body)."""
        self.on_lost = None
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _status_and_headers(self, status: int, headers: list[tuple[str, str]] | None) -> bytes:
        out = b"HTTP/1.1 %d %b\r\n" % (status, REASONS.get(status, "Unknown").encode())
        out += SERVER_HEADERS
        if headers:
            for name, value in headers:
                out += f"{name}: {value}\r\n".encode("latin-1", "replace")
        if not self._keep_alive:
            out += b"Connection: close\r\n"
        return out

    # --- request parsing ----------------------------------------------------------------
    def _process(self) -> None:
        if self._busy or self._closed or not self._buffer:
            return
        try:
            request = self._parse()
        except HttpError as exc:
            self._busy = True
            self._keep_alive = False
            body = b'{"error":{"message":"%b","type":"invalid_request_error","code":%d}}' % (
                str(exc).encode(),
                exc.status,
            )
            self.respond(exc.status, body, close=True)
            return
        if request is None:
            return
        self._busy = True
        self._keep_alive = request.keep_alive
        self._handler(request, self)

    def _parse(self) -> Request | None:
        buf = self._buffer
        while buf.startswith(b"\r\n"):  # tolerate stray CRLF between requests
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEADER_BYTES:
                raise HttpError(431, "request headers too large")
            return None
        method, target, version, headers = _parse_head(bytes(buf[:end]))
        pos = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parsed = _parse_chunked(buf, pos)
            if parsed is None:
                self._maybe_continue(headers)
                return None
            body, pos = parsed
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                raise HttpError(400, "malformed Content-Length") from None
            if length < 0:
                raise HttpError(400, "malformed Content-Length")
            if length > MAX_BODY_BYTES:
                raise HttpError(413, "request body too large")
            if len(buf) < pos + length:
                self._maybe_continue(headers)
                return None
            body = bytes(buf[pos : pos + length])
            pos += length
        del buf[:pos]
        self._sent_continue = False
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in connection
        else:
            keep_alive = "close" not in connection
        path, _, query = target.partition("?")
        received_unix_ns, received_ns = wall_and_perf_ns()  # one instant on both clocks
        return Request(
            method=method,
            path=path,
            version=version,
            headers=headers,
            body=body,
            keep_alive=keep_alive,
            received_ns=received_ns,
            received_unix_ns=received_unix_ns,
            query=query,
            kernel_arrival_unix_ns=self._take_kernel_arrival(),
        )

    def _take_kernel_arrival(self) -> int:
        arrival, self._kernel_arrival_unix_ns = self._kernel_arrival_unix_ns, 0
        return arrival

    def _maybe_continue(self, headers: dict[str, str]) -> None:
        if (
            not self._sent_continue
            and headers.get("expect", "").lower() == "100-continue"
            and self.transport is not None
        ):
            self._sent_continue = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
