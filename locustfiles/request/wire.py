"""A user's connection and the lean HTTP/1.1 exchange the load runs on it.

`new_pool()` gives each user a urllib3 PoolManager whose connections timestamp the client's
phases (`_Stamped`: when a connection was opened and how long that took, when a request's
bytes were handed to the kernel). For plain http the load's own requests (`client.execute`)
skip urllib3's request machinery, which cost about a fifth of a saturated worker's time
(docs/benchmarks.md, issue 25: a Retry object, http.client's request builder, the `email`
parser for the headers, two response wrappers per request), and run `UserPool.post`:

- the request's head and body go out in one `sendall`;
- the status line and headers are parsed here (names lower-cased, repeats joined by ", ");
- the body is read from the socket by `sse.py` as before (kernel receive times, many chunks
  per read): `LeanResponse.timed_reads`; a body read to its end leaves the connection to
  the next request.

The connection is still urllib3's (`_StampedHTTP`): its connect raises urllib3's errors,
which `errors.transport_kind` classifies like every other client here, with urllib3's
socket options (TCP_NODELAY). A connection is reused as urllib3 would: one per host, not
after the server closed it (the OS's poll with a zero timeout: gevent's emulation, which
urllib3 would use, costs 25 times more) and not after
IDLE_RECONNECT_NS idle. A response that cannot be parsed, or a connection that breaks before
the status line, raises urllib3's ProtocolError, as urllib3 does. https and any other pool a
tool passes in go through urllib3 whole; for https too the response head's timeout bounds
the whole head (`_Stamped.getresponse`), not each of its reads.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from http.client import BadStatusLine, RemoteDisconnected
from typing import Any
from urllib.parse import urlsplit

import urllib3
import urllib3.connection
from gevent import monkey
from urllib3.exceptions import ProtocolError

from locustfiles.request import sse
from locustfiles.request.sse import BodyError, ReadClock, Reader, dechunk

_perf_ns = time.perf_counter_ns
_poll: Any = monkey.get_original("select", "poll")  # the OS's (gevent's costs 25x more)

IDLE_RECONNECT_NS = 4_000_000_000
"""A kept-alive connection idle this long is opened anew before the next request: servers
close idle connections after a few seconds (uvicorn, so vLLM, SGLang and `transformers
serve`: 5 s), and a request written just as the server closes its end fails with no
response (RemoteDisconnected) though the server never saw it."""

MAX_HEAD_BYTES = 65536
"""A response's status line and headers longer than this are not HTTP (ProtocolError)."""
READ_SIZE = 65536
USER_AGENT = "llmload"


class _Stamped:
    """A connection that timestamps the client's phases (schema 1.4): when it was opened and
    how long that took, and when a request's first bytes were handed to the kernel. One idle
    for IDLE_RECONNECT_NS since its last response ended is opened anew first."""

    connected_at: int = 0  # perf_counter_ns when it was last opened
    connect_ns: int | None = None  # how long opening it took (TCP, and TLS for https)
    write_at: int = 0  # perf_counter_ns just before the current request's first send
    idle_since: int = 0  # perf_counter_ns when its last response was read to its end
    reader: tuple[Any, Reader] | None = None  # (socket, its timed reader): the lean path's

    def connect(self) -> None:
        start = _perf_ns()
        super().connect()  # type: ignore[misc]
        self.connected_at, self.connect_ns = start, _perf_ns() - start

    def idle_too_long(self) -> bool:
        """Idle past IDLE_RECONNECT_NS since its last response: the server may be closing it."""
        return bool(self.idle_since) and _perf_ns() - self.idle_since > IDLE_RECONNECT_NS

    def request(self, *args: Any, **kwargs: Any) -> None:
        self.write_at = 0  # a new request on this connection
        if self.idle_too_long():
            self.close()  # type: ignore[attr-defined]
        self.idle_since = 0
        super().request(*args, **kwargs)  # type: ignore[misc]

    def send(self, data: Any) -> None:
        if self.write_at == 0:
            if getattr(self, "sock", None) is None:  # http.client opens it here (auto_open)
                self.connect()
            self.write_at = _perf_ns()
        super().send(data)  # type: ignore[misc]

    def getresponse(self) -> Any:
        """urllib3's, with its read timeout bounding the whole head from the write, as the
        lean path's `_read_head` does: http.client reads the head line by line, each read
        with its own timeout, so a server trickling a byte every 0.3 s would never time out.
        Each of the head's reads gets what is left of the head's time (past it: TimeoutError,
        as a socket timeout, which urllib3 reports as its ReadTimeoutError). A TLS socket
        (https) takes the per-read hook; a plain socket (a tool's http pool) cannot, and
        keeps the per-read timeout (the load's plain http takes the lean path)."""
        timeout = self.timeout  # type: ignore[attr-defined]
        sock = self.sock  # type: ignore[attr-defined]
        if not isinstance(timeout, int | float) or not hasattr(sock, "__dict__"):
            return super().getresponse()  # type: ignore[misc]
        deadline = (self.write_at or _perf_ns()) + int(timeout * 1e9)
        recv_into = sock.recv_into  # the class's, bound

        def head_read(*args: Any) -> int:
            left = (deadline - _perf_ns()) / 1e9
            if left <= 0:
                raise TimeoutError(f"the response headers did not end within {timeout:g} s")
            sock.settimeout(left)
            return int(recv_into(*args))

        sock.recv_into = head_read  # http.client's reader reads through it (socket.SocketIO)
        try:
            return super().getresponse()  # type: ignore[misc]
        finally:
            del sock.recv_into
            sock.settimeout(timeout)


class _StampedHTTP(_Stamped, urllib3.connection.HTTPConnection):
    pass


class _StampedHTTPS(_Stamped, urllib3.connection.HTTPSConnection):
    pass


class _StampedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _StampedHTTP


class _StampedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _StampedHTTPS


Target = tuple[tuple[str, int], str, str]
"""A plain http URL's ((host, port), request line, Host header line)."""


class UserPool(urllib3.PoolManager):
    """One user's keep-alive pool: one connection per host, no retries, no redirects; its
    connections timestamp the client's phases. `post` is the lean path for plain http."""

    def __init__(self) -> None:
        super().__init__(num_pools=4, maxsize=1, block=False, retries=False)
        self.pool_classes_by_scheme = {"http": _StampedHTTPPool, "https": _StampedHTTPSPool}
        self.idle: dict[tuple[str, int], _StampedHTTP] = {}  # the lean path's, per host
        weakref.finalize(self, _close_all, self.idle)  # as urllib3's pools close theirs
        self._targets: dict[str, Target | None] = {}

    def target(self, url: str) -> Target | None:
        """((host, port), request line, Host header line) of a plain http URL; None for any
        other (https goes through urllib3)."""
        if url in self._targets:
            return self._targets[url]
        parts = urlsplit(url)
        found = None
        if parts.scheme == "http" and parts.hostname:
            port = parts.port or 80
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
            host_header = host if port == 80 else f"{host}:{port}"
            found = (
                (parts.hostname, port),
                f"POST {path} HTTP/1.1\r\n",
                f"Host: {host_header}\r\n",
            )
        self._targets[url] = found
        return found

    def post(
        self,
        target: Target,
        payload: bytes,
        headers: dict[str, str],
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> LeanResponse:
        """Send one POST and read its status line and headers; the body is left to read.
        Raises urllib3's errors where urllib3 would (connect, protocol), TimeoutError when
        the headers do not come within `read_timeout`, ValueError for a header value with a
        line break."""
        key, request_line, host_line = target
        lines = [request_line]
        agent = host = True
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"header {name!r} has a line break in its name or value")
            if name[0] in "HhUu":
                lowered = name.lower()
                agent = agent and lowered != "user-agent"
                host = host and lowered != "host"
            lines.append(f"{name}: {value}\r\n")
        if host:
            lines.insert(1, host_line)
        if agent:
            lines.append(f"User-Agent: {USER_AGENT}\r\n")
        lines.append(f"Content-Length: {len(payload)}\r\n\r\n")
        head = "".join(lines).encode("latin-1")
        conn = self._connection(key, connect_timeout)
        try:
            sock = conn.sock
            sock.settimeout(read_timeout)
            conn.write_at = _perf_ns()
            _send_all(sock, head + payload)
            return _read_head(self, key, conn, read_timeout)
        except BaseException as exc:
            conn.close()  # in an unknown state
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                # as urllib3 names a connection that broke before the response
                raise ProtocolError("Connection aborted.", exc) from exc
            raise

    def _connection(self, key: tuple[str, int], connect_timeout: float | None) -> Any:
        """The host's idle connection when it can still be used, else a new one (connected)."""
        conn = self.idle.pop(key, None)
        if conn is not None:
            sock = conn.sock
            if (
                sock is None
                or conn.idle_too_long()
                or _readable(sock)  # the server closed it (or sent junk)
            ):
                conn.close()
                conn = None
        if conn is None:
            conn = _StampedHTTP(key[0], key[1], timeout=connect_timeout)
            conn.connect()
        conn.idle_since = 0
        return conn

    def give_back(self, key: tuple[str, int], conn: Any) -> None:
        """A connection whose response was read to its end: kept for the next request (one
        per host; a spare is closed)."""
        if key in self.idle or conn.sock is None:
            conn.close()
        else:
            self.idle[key] = conn

    def clear(self) -> None:
        _close_all(self.idle)
        super().clear()


def _send_all(sock: Any, data: bytes) -> None:
    """`sock.sendall(data)`, tried first as one send on a gevent socket's own non-blocking
    socket: a request fits the kernel's buffer, and gevent's sendall asks the buffer's size
    (a syscall) and goes through three Python layers first. What did not fit goes by sendall."""
    raw = getattr(sock, "_sock", None)
    sent = 0
    if raw is not None:  # gevent's: the OS's socket, non-blocking
        try:
            sent = raw.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def _readable(sock: Any) -> bool:
    """Whether the socket has bytes or an end to read now (an idle connection should not)."""
    if sse.native_readable is not None:
        return bool(sse.native_readable(sock.fileno()))
    poller = _poll()
    poller.register(sock, 1)  # POLLIN
    return bool(poller.poll(0))


def _close_all(idle: dict[tuple[str, int], Any]) -> None:
    for conn in idle.values():
        conn.close()
    idle.clear()


def new_pool() -> UserPool:
    """One user's keep-alive pool (see UserPool)."""
    return UserPool()


class LeanResponse:
    """A response read by the lean path: status, headers (names lower-case), the body's
    framing, the bytes that came with the headers and when they came (`arrived_at`:
    perf_counter ns of the read that completed the headers, the kernel's receive time where
    the platform stamps it). `_connection` as urllib3's responses have it (the phases, the
    socket)."""

    __slots__ = ("_body", "_connection", "_key", "_pool", "_rest", "arrived_at", "buffered",
                 "chunked", "complete", "headers", "length", "reusable", "status")  # fmt: skip

    def __init__(
        self,
        pool: UserPool,
        key: tuple[str, int],
        conn: Any,
        status: int,
        headers: dict[str, str],
        buffered: bytes,
        reusable: bool,
        arrived_at: int,
    ) -> None:
        self._pool, self._key, self._connection = pool, key, conn
        self.status, self.headers, self.buffered = status, headers, buffered
        self.arrived_at = arrived_at
        self.reusable = reusable
        self.complete = False  # the body was read to its end
        self._body: Iterator[tuple[bytes, int]] | None = None
        self._rest = b""
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.length: int | None = None
        if status in (204, 304) or 100 <= status < 200:
            self.length = 0
        elif not self.chunked and "content-length" in headers:
            try:
                self.length = int(headers["content-length"].split(",")[0])
            except ValueError:
                raise ProtocolError(f"bad Content-Length {headers['content-length']!r}") from None
            if self.length < 0:
                raise ProtocolError(f"bad Content-Length {headers['content-length']!r}")
        if not self.chunked and self.length is None:
            self.reusable = False  # the body ends when the server closes the connection

    def timed_reads(self, clock: Any) -> Iterator[tuple[bytes, int]]:
        """The body, one piece per socket read with its arrival time (`sse.body_reads`'s
        contract), de-chunked; to its end, after which the connection can be given back.
        The bytes that came with the headers arrived when they did (`arrived_at`), not when
        this greenlet got round to them."""
        if self.chunked:
            first_read, read, _ = self.chunked_source()
            yield from dechunk(first_read, read, clock)
            self.complete = True
            return
        read = _reader(self._connection)
        first, self.buffered = self.buffered, b""
        at = self.arrived_at
        if self.length is not None:
            left = self.length
            if first:
                piece = first[:left]
                left -= len(piece)
                clock.last = max(at, clock.last)
                yield piece, clock.last
            while left > 0:
                data, t = read()
                if not data:
                    raise BodyError(f"connection closed with {left} byte(s) of the body to come")
                t = clock.last = max(t, clock.last)
                yield data[:left], t
                left -= len(data)
        else:  # to the connection's end
            if first:
                clock.last = max(at, clock.last)
                yield first, clock.last
            while True:
                data, t = read()
                if not data:
                    break
                t = clock.last = max(t, clock.last)
                yield data, t
        self.complete = True

    def chunked_source(self) -> tuple[Callable[[], tuple[bytes, int] | None], Reader, Any]:
        """A chunked body's sources for a reader that undoes the framing itself (`dechunk`,
        or the C decoder of `sse.events`, which calls `ended()` at the body's end): what came
        with the headers (once, with their arrival time), the socket's timed reader (which
        turned the kernel's stamps on), and the socket."""
        first, self.buffered = self.buffered, b""
        at = self.arrived_at
        read = _reader(self._connection)
        return (lambda: (first, at) if first else None), read, self._connection.sock

    def ended(self) -> None:
        """The body was read to its end (by `sse.events`): the connection can be given back."""
        self.complete = True

    def read(self, amt: int | None = None) -> bytes:
        """Body bytes (de-chunked): all of them, or at most `amt`."""
        if self._body is None:
            self._body = self.timed_reads(ReadClock())
        buf = self._rest
        while amt is None or len(buf) < amt:
            piece = next(self._body, None)
            if piece is None:
                break
            buf += piece[0]
        if amt is None:
            self._rest = b""
            return buf
        self._rest = buf[amt:]
        return buf[:amt]

    def release_conn(self) -> None:
        """Back to the pool when read to its end on a reusable connection, else closed."""
        conn, self._connection = self._connection, _CLOSED
        if conn is _CLOSED:
            return
        if self.complete and self.reusable and not self._rest:
            self._pool.give_back(self._key, conn)
        else:
            conn.close()

    def close(self) -> None:
        """Drop the connection (in an unknown state, or the client walks away)."""
        self.reusable = False
        if self._connection is not _CLOSED:
            self._connection.close()


class _Closed:
    sock = None
    reader = None
    write_at = connected_at = idle_since = 0
    connect_ns = None

    def close(self) -> None:
        pass


_CLOSED: Any = _Closed()


def _reader(conn: Any) -> Reader:
    """The connection's socket reader with arrival times (`sse.socket_reader`), made once per
    socket."""
    return _stamped_reader(conn)[1]


def _stamped_reader(conn: Any) -> tuple[Any, Reader, Callable[[], Any] | None]:
    """(socket, its reader, a wait for its next bytes or None): made once per socket. The
    wait is the gevent socket's own (`sse.waiter`), the socket's timeout included."""
    sock = conn.sock
    stamped = conn.reader
    if stamped is None or stamped[0] is not sock:
        stamped = conn.reader = (sock, sse.socket_reader(sock), sse.waiter(sock))
    return stamped


def _read_head(
    pool: UserPool, key: tuple[str, int], conn: Any, timeout: float | None = None
) -> LeanResponse:
    """Read and parse the status line and headers (skipping 1xx interim responses), with
    the arrival time of the read that completed them. `timeout` bounds the whole head from
    the write, not each read: a server that trickles its headers a byte at a time is cut
    there (TimeoutError), as one that stays silent is by the socket's own timeout."""
    sock, read, wait = _stamped_reader(conn)
    deadline = None if timeout is None else conn.write_at + int(timeout * 1e9)
    shortened = False
    if wait is not None and sock.fileno() >= 0:
        wait()  # the request was just written: its answer cannot be there yet (no read for nothing)
    buf = b""
    at = 0
    while True:
        end = buf.find(b"\r\n\r\n")
        sep = 4
        if end < 0 and b"\n\n" in buf:
            end, sep = buf.find(b"\n\n"), 2
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise ProtocolError(
                    "Connection aborted.", BadStatusLine(buf[:40].decode("latin-1"))
                )
            if deadline is not None and buf:  # a head in pieces: what is left of its time
                left = (deadline - _perf_ns()) / 1e9
                if left <= 0:
                    raise TimeoutError(f"the response headers did not end within {timeout:g} s")
                sock.settimeout(left)
                shortened = True
            data, at = read()
            if not data:
                conn.close()
                reason: Exception = (
                    RemoteDisconnected("Remote end closed connection without response")
                    if not buf
                    else BadStatusLine(buf[:40].decode("latin-1"))
                )
                raise ProtocolError("Connection aborted.", reason)
            buf += data
            continue
        if shortened:
            sock.settimeout(timeout)  # the body's reads get the timeout they were given
            shortened = False
        head, buf = buf[:end], buf[end + sep :]
        lines = head.decode("latin-1").splitlines()
        status_line = lines[0].split(None, 2) if lines else []
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
            raise ProtocolError("Connection aborted.", BadStatusLine(lines[0] if lines else ""))
        try:
            status = int(status_line[1])
        except ValueError:
            raise ProtocolError("Connection aborted.", BadStatusLine(lines[0])) from None
        if 100 <= status < 200 and status != 101:
            continue  # an interim response (100 Continue): the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                continue
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        connection = headers.get("connection", "").lower()
        if status_line[0] == "HTTP/1.1":
            reusable = "close" not in connection
        else:
            reusable = "keep-alive" in connection
        return LeanResponse(pool, key, conn, status, headers, buf, reusable, at or _perf_ns())
