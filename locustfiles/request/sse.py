"""Reading an SSE response body fast: de-chunking over the socket, splitting events.

`events(resp, clock)` yields, per socket read, the data of every event that read completed,
with the arrival time of the read. It is a worker's hot path: the work is per read (one
gevent wake-up), not per line or per event. Tests check it parses exactly as sseclient-py
does, over every way of splitting a body into reads.

Arrival times come from the kernel (SO_TIMESTAMPNS) wherever the bytes are read from the
socket here, so a worker whose loop was busy when the bytes arrived still records when they
arrived. `clock.last` is the arrival time of the latest read (also reads that complete no
event, and the read that ends the body): the stall timer and the response's end use it.

An event still pending (not yet ended by its blank line) is bounded: once it holds more than
`max_event_bytes` the stream is cut (`EventTooLong`, recorded as `malformed_event`); checked
once per read, on the pending buffer's length, never per line.

The per-read work (de-chunking, line ends, splitting, each event's data) runs in C where the
extension `_ssefast` is built (`pip install` builds it; setup.py): one call per read instead of
a Python loop per chunk and per event, about a third of a saturated worker's time (issue 25,
docs/benchmarks.md). The Python code below stays the reference and the fallback: where the
extension is missing (no compiler at install time, or `LLMLOAD_SSE=python`) it runs instead,
with the same results (tests/unit/test_sse_native.py holds them equal, errors included).
`implementation()` names the one in use.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("llmload.sse")

READ_SIZE = 65536
MAX_EVENT_BYTES = 1 << 20  # --max-event-bytes' default: an event pending longer is cut
assert READ_SIZE >= io.DEFAULT_BUFFER_SIZE  # one read1 drains http.client's buffered reader
_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns

# Linux kernel receive timestamps (not exported by Python's socket module): SO_TIMESTAMPNS.
SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None
_TIMESPEC = struct.Struct("@qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)

Reader = Callable[[], tuple[bytes, int]]

_native: Any = None
if os.environ.get("LLMLOAD_SSE", "").lower() != "python":
    try:
        _native = importlib.import_module("locustfiles.request._ssefast")  # built by setup.py
    except ImportError:  # not built (no compiler at install time): the Python code below
        _native = None
native_readable: Callable[[int], bool] | None = None if _native is None else _native.readable
"""Whether a descriptor has bytes or an end to read now (poll in C), where the C module is."""


try:
    from gevent.socket import socket as _gsocket
except ImportError:  # pragma: no cover - gevent is a dependency
    _gsocket = None


def implementation() -> str:
    """The SSE reader in use: "native" (the C extension) or "python"."""
    return "python" if _native is None else "native"


class BodyError(ConnectionError):
    """The body ended early or its chunked framing is broken (recorded: stream_truncated)."""


class EventTooLong(ValueError):
    """An event (one SSE line, or the lines of one event) longer than the bound: the server
    is not sending events (recorded: malformed_event; the connection is closed)."""


class ReadClock:
    """Arrival time (perf_counter ns) of a response's latest read; 0 before the first."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0


def events(
    resp: Any, clock: Any = None, max_event_bytes: int = MAX_EVENT_BYTES
) -> Iterator[tuple[list[bytes], int]]:
    """(data of the events completed by one read, arrival time of that read, perf_counter ns).

    `clock` (a ReadClock, or anything with a `last` attribute) gets the arrival time of every
    read, also of reads that complete no event and of the read that ends the body. An event
    still pending after a read with more than `max_event_bytes` raises EventTooLong.

    A minimal SSE reader: `data` fields joined by LF; comments, `event`, `id` and `retry`
    ignored; CRLF, CR and LF line ends; a final event without its blank line still counts.
    """
    clock = ReadClock() if clock is None else clock
    if _native is not None:
        return _native_events(resp, clock, max_event_bytes)
    return _python_events(resp, clock, max_event_bytes)


def _native_events(
    resp: Any, clock: Any, max_event_bytes: int
) -> Iterator[tuple[list[bytes], int]]:
    """`events` by the C decoder. A chunked body of the lean path (`chunked_source`) comes as
    the socket's reads, framing and all, and the decoder finds its end; any other body comes
    de-chunked from `body_reads`."""
    source = getattr(resp, "chunked_source", None) if getattr(resp, "chunked", False) else None
    decoder = _native.Decoder(
        source is not None, max_event_bytes, chunk_size, BodyError, EventTooLong
    )
    if source is None:
        yield from _fed(decoder, body_reads(resp, clock))
    else:
        first_read, read, sock = source()
        if _waitable(sock):  # a gevent socket: the decoder reads it itself
            yield from _socket_events(decoder, first_read, sock, clock)
        else:
            yield from _fed(decoder, raw_reads(first_read, read, clock))
        resp.ended()
    last = decoder.last()
    if last is not None:  # a final event without its blank line: it came with the last read
        yield [last], clock.last


def _fed(decoder: Any, reads: Iterator[tuple[bytes, int]]) -> Iterator[tuple[list[bytes], int]]:
    """Each read through the C decoder: the data of the events it completed, with its time;
    to the reads' end, or the chunked body's end the decoder found."""
    feed = decoder.feed
    for data, now in reads:
        datas = feed(data)
        if datas:
            yield datas, now
        if decoder.done:
            break


def waiter(sock: Any) -> Callable[[], Any] | None:
    """A wait for the socket's next bytes (or its end), as gevent's recv waits, the socket's
    timeout included; None for a socket the C reader does not read (a blocking read waits)."""
    if _native is None or not _waitable(sock):
        return None
    wait, ready = sock._wait, sock._read_event
    return lambda: wait(ready)


def _waitable(sock: Any) -> bool:
    """A plain gevent socket, with the internals `_socket_events` waits on (gevent's own recv
    methods use them: `_wait`, `_read_event`); its kernel stamps turned on (`socket_reader`).
    Without them the decoder is fed by `raw_reads` instead: the same results, a bytes object
    and an exception more per read. Canary: tests/unit/test_sse_native.py asserts a gevent
    socket qualifies."""
    return (
        SO_TIMESTAMPNS is not None
        and _gsocket is not None
        and isinstance(sock, _gsocket)
        and not isinstance(sock, ssl.SSLSocket)
        and callable(getattr(sock, "_wait", None))
        and getattr(sock, "_read_event", None) is not None
    )


def _socket_events(
    decoder: Any, first_read: Callable[[], tuple[bytes, int] | None], sock: Any, clock: Any
) -> Iterator[tuple[list[bytes], int]]:
    """A chunked body read from the socket by the C decoder, one call per read (no bytes
    object, no exception when there is nothing to read yet: then the greenlet waits on the
    socket as gevent's own recv does, its timeout included), to the body's end. Times as
    `raw_reads` gives them: the kernel's, never earlier than the read before."""
    read, wait, ready, fileno = decoder.read, sock._wait, sock._read_event, sock.fileno
    skew = kernel_skew_ns()
    last_t = clock.last
    full = False  # whether the last read filled its buffer (else the socket is most likely empty)
    got = first_read()
    if got is not None:
        full = len(got[0]) >= READ_SIZE
        t = last_t = max(got[1], last_t)
        clock.last = t
        datas = decoder.feed(got[0])
        if datas:
            yield datas, t
    while not decoder.done:
        if not full and fileno() >= 0:
            # a short read took what there was: wait for the next bytes rather than ask the
            # kernel again (a read that finds nothing is a syscall per wake-up for nothing);
            # bytes that came meanwhile wake the wait at once. Closed (-1): the read says so.
            wait(ready)
        done = read(fileno(), skew)  # -1 once closed (EBADF): a closed socket's number is reused
        if done is None:  # nothing yet (woken without bytes)
            full = False
            continue
        full = decoder.full
        datas, t = done
        t = last_t = max(t, last_t)
        clock.last = t
        if datas:
            yield datas, t


def _python_events(
    resp: Any, clock: Any, max_event_bytes: int
) -> Iterator[tuple[list[bytes], int]]:
    """`events` in Python: the reference the C decoder is held to, and its fallback."""
    buf = b""
    carry = b""  # a CR at the end of a read: its LF may start the next one
    for data, now in body_reads(resp, clock):
        if carry:
            data, carry = carry + data, b""
        if b"\r" in data:
            if data.endswith(b"\r"):
                data, carry = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = buf + data if buf else data
        if b"\n\n" not in buf:
            if len(buf) > max_event_bytes:
                raise EventTooLong(f"an event line longer than {max_event_bytes} bytes")
            continue
        *blocks, buf = buf.split(b"\n\n")
        if len(buf) > max_event_bytes:
            raise EventTooLong(f"an event line longer than {max_event_bytes} bytes")
        datas: list[Any] = [
            b[6:] if b[:6] == b"data: " and b"\n" not in b else data_of(b) for b in blocks
        ]  # the common case inline (data_of's first test), the rest through data_of
        if None in datas:
            datas = [d for d in datas if d is not None]
        if datas:
            yield datas, now
    last = data_of(buf)
    if last is not None:  # a final event without its blank line: it came with the last read
        yield [last], clock.last


def lines(
    resp: Any, clock: Any = None, max_line_bytes: int = MAX_EVENT_BYTES
) -> Iterator[tuple[list[bytes], int]]:
    """`events` for a body of text lines (a stream adapter's `framing = "lines"`): each line,
    without its line end (LF or CRLF), is one event's data, empty lines included; a last line
    without its line end counts too. A line pending longer than `max_line_bytes` raises
    EventTooLong."""
    clock = ReadClock() if clock is None else clock
    buf = b""
    for data, now in body_reads(resp, clock):
        buf = buf + data if buf else data
        if b"\n" not in buf:
            if len(buf) > max_line_bytes:
                raise EventTooLong(f"a line longer than {max_line_bytes} bytes")
            continue
        *done, buf = buf.split(b"\n")
        if len(buf) > max_line_bytes:
            raise EventTooLong(f"a line longer than {max_line_bytes} bytes")
        yield [d[:-1] if d[-1:] == b"\r" else d for d in done], now
    if buf:
        yield [buf[:-1] if buf[-1:] == b"\r" else buf], clock.last


def data_of(block: bytes) -> bytes | None:
    """An event block's data (its `data` fields joined by LF); None if it has none."""
    if block.startswith(b"data: ") and b"\n" not in block:  # the common case
        return block[6:]
    parts = []
    for line in block.split(b"\n"):
        name, _, value = line.partition(b":")
        if name == b"data":
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


def body_reads(resp: Any, clock: Any) -> Iterator[tuple[bytes, int]]:
    """The response body, one piece per socket read, each with its arrival time, to its end.

    Arrival time: the kernel's receive timestamp of the read's data (SO_TIMESTAMPNS, Linux,
    plain TCP) moved onto the perf_counter clock, else perf_counter_ns() when the read
    returns. The kernel's time does not include the wait for this greenlet's turn on a busy
    worker (or a stalled loop), which would otherwise shift timestamps. `clock.last` is set
    at every read.

    Chunked bodies (what SSE servers send) are de-chunked here, many chunks per read, from
    the socket itself once http.client's buffer is drained: http.client returns one chunk
    per call, which costs more than the event in it. Bytes http.client had already buffered
    with the headers are taken without waiting (they arrived with the headers; their time is
    when they are taken: the lean path, which reads the headers with kernel times too, gives
    them the headers' arrival); everything after comes from the socket with kernel times. Other
    bodies go through urllib3. At the end of a chunked body the http.client response is
    closed as http.client itself would, so the keep-alive connection can go back to the pool.

    This relies on private attributes of urllib3's and http.client's responses
    (`private_internals()`); without them it falls back to urllib3's read1, logged once. A
    response of the lean path (`wire.LeanResponse`) reads its own body the same way
    (`timed_reads`).
    """
    timed_reads = getattr(resp, "timed_reads", None)
    if timed_reads is not None:
        yield from timed_reads(clock)
        return
    found = private_internals(resp)
    if isinstance(found, str):
        if found != "not chunked":
            _warn_fallback(found)
        while data := resp.read1(READ_SIZE):
            t = clock.last = _perf_ns()
            yield data, t
        return
    fp, src, sock = found
    yield from dechunk(_buffered_reader(src, sock), socket_reader(sock), clock)
    fp._close_conn()


_warned: set[str] = set()


def _warn_fallback(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning(
            "llmload: fast SSE path unavailable (%s; urllib3 %s): reading through urllib3, "
            "with event times taken when the loop gets to them, not the kernel's",
            reason,
            _urllib3_version(),
        )


def _urllib3_version() -> str:
    module = sys.modules.get("urllib3")
    return str(getattr(module, "__version__", "unknown"))


def private_internals(resp: Any) -> tuple[Any, Any, Any] | str:
    """(http.client response, its buffered reader, the socket) of a urllib3 response whose
    body is chunked and unread; else why not ("not chunked" is the ordinary case of a body
    with a length). A test checks the installed urllib3 still has these (the canary)."""
    fp: Any = getattr(resp, "_fp", None)  # urllib3's HTTPResponse wraps http.client's
    if fp is None:
        return "urllib3 response without _fp"
    if not hasattr(fp, "chunked") or not hasattr(fp, "chunk_left"):
        return "http.client response without chunked/chunk_left"
    if not fp.chunked:
        return "not chunked"
    if fp.chunk_left is not None:
        return "chunked body already partly read"
    src = getattr(fp, "fp", None)
    if src is None or not hasattr(src, "read1"):
        return "http.client response without its buffered reader (fp)"
    if not callable(getattr(fp, "_close_conn", None)):
        return "http.client response without _close_conn"
    sock = getattr(getattr(resp, "_connection", None), "sock", None)
    if sock is None:
        return "urllib3 response without _connection.sock"
    return fp, src, sock


def _buffered_reader(src: Any, sock: Any) -> Callable[[], tuple[bytes, int] | None]:
    """What http.client buffered beyond the headers, taken without waiting; None if nothing.

    TLS sockets cannot be polled this way: their first read goes through http.client (and
    may wait), timed when it returns.
    """

    def read() -> tuple[bytes, int] | None:
        if isinstance(sock, ssl.SSLSocket):
            return src.read1(READ_SIZE), _perf_ns()
        timeout = sock.gettimeout()
        sock.settimeout(0.0)
        try:
            data = src.read1(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            data = b""
        finally:
            sock.settimeout(timeout)
        return (data, _perf_ns()) if data else None

    return read


def _timed(read1: Callable[[int], bytes]) -> Reader:
    return lambda: (read1(READ_SIZE), _perf_ns())


def socket_reader(sock: Any) -> Reader:
    """Reads from the socket with kernel receive timestamps where the platform has them."""
    if SO_TIMESTAMPNS is None or isinstance(sock, ssl.SSLSocket):
        return _timed(sock.recv)
    kernel_skew_ns()  # the first response of a process: the kernel stamps arrivals from now
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return _timed(sock.recv)
    if _native is not None and _waitable(sock):
        return _native_reader(sock)
    recvmsg = sock.recvmsg

    def read() -> tuple[bytes, int]:
        data, ancdata, _, _ = recvmsg(READ_SIZE, _ANC_SIZE)
        # the wall clock first: a thread switch between the two readings (the sink's thread
        # taking the GIL) can then only make the time later, never earlier than the arrival
        wall = _time_ns()
        perf = _perf_ns()
        for level, kind, payload in ancdata:
            if (
                level == socket.SOL_SOCKET
                and kind == SO_TIMESTAMPNS
                and len(payload) >= _TIMESPEC.size
            ):
                sec, nsec = _TIMESPEC.unpack_from(payload)
                lag = wall - (sec * 1_000_000_000 + nsec) - kernel_skew_ns()
                if 0 <= lag < 1_000_000_000:  # sane (no clock step): use the kernel's time
                    return data, perf - lag
        return data, perf

    return read


def _native_reader(sock: Any) -> Reader:
    """`socket_reader`'s reads made by the C extension on a gevent socket: the same bytes and
    times, without gevent's recvmsg (an exception when nothing is there yet, the ancillary
    data parsed in Python); the greenlet waits on the socket as gevent's recv does."""
    recv, wait, ready, fileno = _native.recv, sock._wait, sock._read_event, sock.fileno
    skew = kernel_skew_ns()

    def read() -> tuple[bytes, int]:
        while True:  # the descriptor asked each time: -1 once closed (EBADF), never reused
            got: tuple[bytes, int] | None = recv(fileno(), skew)
            if got is not None:
                return got
            wait(ready)

    return read


_kernel_skew: list[int] = []
_stamping: list[int] = []  # the descriptor of this process's socket that keeps the kernel stamping
STAMPING_WAIT_S = 2.0  # how long the first measurement waits for the kernel to stamp arrivals


def kernel_skew_ns() -> int:
    """How far this process's wall clock (time.time_ns) runs from the kernel's, in ns.

    0 on a normal host, where both are CLOCK_REALTIME. A process whose time is shifted in
    user space only (libfaketime, as the multi-host tests use to fake a skewed host) would
    otherwise move every kernel receive timestamp by the shift. Measured once: the smallest
    difference between time_ns() just after a loopback datagram's read and the kernel's
    timestamp of it, over a few tries (a datagram is read microseconds after it arrives).

    The first call also makes sure the kernel stamps arrivals from then on. Linux stamps
    received packets only while some socket asks for it, and turns that on for the whole
    system asynchronously (a deferred work item), a little after the first socket asks: a
    response whose bytes arrived in that gap would carry the time they were read, not the
    time they arrived. So the measuring socket stays open for the life of the process, and
    the call waits (at most STAMPING_WAIT_S) until a datagram read late shows its arrival.
    The worker calls this at start, before its first request.
    """
    if not _kernel_skew:
        _kernel_skew.append(_measure_kernel_skew())
    return _kernel_skew[0]


def _stamp_of(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            return int(sec * 1_000_000_000 + nsec)
    return None


def _measure_kernel_skew(tries: int = 5) -> int:
    if SO_TIMESTAMPNS is None:
        return 0
    best: int | None = None
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            rx.bind(("127.0.0.1", 0))
            rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            rx.settimeout(1.0)

            def late_by(wait_s: float) -> int | None:
                """A datagram read `wait_s` after it was sent: read time minus its stamp."""
                tx.sendto(b"t", rx.getsockname())
                if wait_s:
                    time.sleep(wait_s)
                _, ancdata, _, _ = rx.recvmsg(16, _ANC_SIZE)
                wall = _time_ns()
                stamp = _stamp_of(ancdata)
                return None if stamp is None else wall - stamp

            for _ in range(tries):
                diff = late_by(0)
                if diff is not None and (best is None or abs(diff) < abs(best)):
                    best = diff
            # stamping is on once a datagram read 2 ms late shows that it waited (a stamp
            # taken at the read would show no wait, whatever the clocks' skew)
            deadline = time.monotonic() + STAMPING_WAIT_S
            while best is not None and time.monotonic() < deadline:
                waited = late_by(0.002)
                if waited is not None and waited - best >= 1_000_000:
                    break
    except OSError:
        rx.close()
        return 0
    _stamping.append(rx.detach())  # open until the process exits (no socket object to collect)
    if best is None or abs(best) < 1_000_000:  # under 1 ms: the same clock, read late
        return 0
    return best


def _size_with_extensions(line: bytes) -> int:
    """A chunk size line with extensions (`1a;name=value`): its size."""
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise BodyError(f"bad chunk size line {line[:20]!r}") from None


MAX_CHUNK_SIZE = 1 << 62  # a larger size is read as this one: the body ends long before


def chunk_size(line: bytes) -> int:
    """A chunk size line's size by `dechunk`'s rules (hex, any case; extensions; whatever
    `int(..., 16)` takes), else BodyError: what the C decoder asks for any line that is not
    plain hex digits."""
    try:
        size = int(line, 16)
    except ValueError:
        size = _size_with_extensions(line)
    if size < 0:
        raise BodyError(f"bad chunk size line {line[:20]!r}")
    return min(size, MAX_CHUNK_SIZE)


def raw_reads(
    first_read: Callable[[], tuple[bytes, int] | None], read: Reader, clock: Any
) -> Iterator[tuple[bytes, int]]:
    """The reads of a chunked body as they come, framing and all, each with its arrival time
    (never earlier than the one before, nor than the clock's start), `clock.last` set at each;
    a connection closed mid-body raises BodyError. The caller finds the body's end and stops
    (the C decoder: `_native_events`); `dechunk` is the same in Python, framing undone."""
    last_t = clock.last
    got = first_read()
    while True:
        data, t = got if got is not None else read()
        got = None
        if not data:
            raise BodyError("connection closed before the end of the chunked body")
        t = last_t = max(t, last_t)
        clock.last = t
        yield data, t


def dechunk(
    first_read: Callable[[], tuple[bytes, int] | None], read: Reader, clock: Any = None
) -> Iterator[tuple[bytes, int]]:
    """Chunked transfer decoding; yields (data each read completed, its time) to the end.

    `first_read` returns what was already buffered, or None; `read` reads the socket.
    """
    pending = b""
    left = 0  # data bytes of the current chunk still to come
    state = "size"  # size line | data | crlf after data | trailer lines after the last chunk
    # times never earlier than the clock's start (the headers): bytes the kernel took in
    # while http.client was still parsing the headers would otherwise precede them
    for data, t in raw_reads(first_read, read, ReadClock() if clock is None else clock):
        pending = pending + data if pending else data
        out = []
        pos, size = 0, len(pending)
        while pos < size:
            if state == "data":
                take = min(left, size - pos)
                out.append(pending[pos : pos + take])
                pos += take
                left -= take
                if left == 0:
                    state = "crlf"
            elif state == "crlf":
                if size - pos < 2:
                    break
                if pending[pos : pos + 2] != b"\r\n":
                    raise BodyError("chunk data not followed by CRLF")
                pos += 2
                state = "size"
            else:
                eol = pending.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = pending[pos:eol]
                pos = eol + 2
                if state == "trailer":
                    if not line:  # the empty line that ends the body
                        if out:
                            yield b"".join(out), t
                        return
                    continue
                left = chunk_size(line)
                if not left:
                    state = "trailer"
                elif pos + left + 2 <= size:  # the common case: the whole chunk is here
                    end = pos + left
                    if pending[end : end + 2] != b"\r\n":
                        raise BodyError("chunk data not followed by CRLF")
                    out.append(pending[pos:end])
                    pos, left = end + 2, 0
                else:
                    state = "data"
        pending = pending[pos:]
        if out:
            yield b"".join(out), t
