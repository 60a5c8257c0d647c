"""Reading an SSE response body fast: de-chunking over the socket, splitting events.

`events(resp)` yields, per socket read, the data of every event that read completed, with
the `perf_counter_ns()` of the read. It is a worker's hot path: the work is per read (one
gevent wake-up), not per line or per event. Tests check it parses exactly as sseclient-py
does, over every way of splitting a body into reads.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

READ_SIZE = 65536
assert READ_SIZE >= io.DEFAULT_BUFFER_SIZE  # one read1 drains http.client's buffered reader
_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns

# Linux kernel receive timestamps (not exported by Python's socket module): SO_TIMESTAMPNS.
SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None
_TIMESPEC = struct.Struct("@qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)

Reader = Callable[[], tuple[bytes, int]]


class BodyError(ConnectionError):
    """The body ended early or its chunked framing is broken (recorded: stream_truncated)."""


def events(resp: Any) -> Iterator[tuple[list[bytes], int]]:
    """(data of the events completed by one read, perf_counter_ns of that read).

    A minimal SSE reader: `data` fields joined by LF; comments, `event`, `id` and `retry`
    ignored; CRLF, CR and LF line ends; a final event without its blank line still counts.
    """
    buf = b""
    carry = b""  # a CR at the end of a read: its LF may start the next one
    for data, now in body_reads(resp):
        if carry:
            data, carry = carry + data, b""
        if b"\r" in data:
            if data.endswith(b"\r"):
                data, carry = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = buf + data if buf else data
        if b"\n\n" not in buf:
            continue
        *blocks, buf = buf.split(b"\n\n")
        datas = [d for d in map(data_of, blocks) if d is not None]
        if datas:
            yield datas, now
    last = data_of(buf)
    if last is not None:
        yield [last], _perf_ns()


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


def body_reads(resp: Any) -> Iterator[tuple[bytes, int]]:
    """The response body, one piece per socket read, each with its arrival time, to its end.

    Arrival time: the kernel's receive timestamp of the read's data (SO_TIMESTAMPNS, Linux,
    plain TCP) moved onto the perf_counter clock, else perf_counter_ns() when the read
    returns. The kernel's time does not include the wait for this greenlet's turn on a busy
    worker, which otherwise shifts timestamps by up to a millisecond at high concurrency.

    Chunked bodies (what SSE servers send) are de-chunked here, many chunks per read, from
    the socket itself once http.client's buffer is drained: http.client returns one chunk
    per call, which costs more than the event in it. Other bodies go through urllib3. At
    the end of a chunked body the http.client response is closed as http.client itself
    would, so the keep-alive connection can go back to the pool.
    """
    fp: Any = getattr(resp, "_fp", None)  # urllib3's HTTPResponse wraps http.client's
    src = getattr(fp, "fp", None)
    if src is None or not getattr(fp, "chunked", False) or fp.chunk_left is not None:
        while data := resp.read1(READ_SIZE):
            yield data, _perf_ns()
        return
    sock = getattr(getattr(resp, "_connection", None), "sock", None)
    yield from _dechunk(
        _timed(src.read1), socket_reader(sock) if sock is not None else _timed(src.read1)
    )
    fp._close_conn()


def _timed(read1: Callable[[int], bytes]) -> Reader:
    return lambda: (read1(READ_SIZE), _perf_ns())


def socket_reader(sock: Any) -> Reader:
    """Reads from the socket with kernel receive timestamps where the platform has them."""
    if SO_TIMESTAMPNS is None or isinstance(sock, ssl.SSLSocket):
        return _timed(sock.recv)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return _timed(sock.recv)
    recvmsg = sock.recvmsg

    def read() -> tuple[bytes, int]:
        data, ancdata, _, _ = recvmsg(READ_SIZE, _ANC_SIZE)
        perf, wall = _perf_ns(), _time_ns()
        for level, kind, payload in ancdata:
            if (
                level == socket.SOL_SOCKET
                and kind == SO_TIMESTAMPNS
                and len(payload) >= _TIMESPEC.size
            ):
                sec, nsec = _TIMESPEC.unpack_from(payload)
                lag = wall - (sec * 1_000_000_000 + nsec)
                if 0 <= lag < 1_000_000_000:  # sane (no clock step): use the kernel's time
                    return data, perf - lag
        return data, perf

    return read


def _dechunk(first_read: Reader, read: Reader) -> Iterator[tuple[bytes, int]]:
    """Chunked transfer decoding; yields (data each read completed, its time) to the end."""
    pending = b""
    left = 0  # data bytes of the current chunk still to come
    state = "size"  # size line | data | crlf after data | trailer lines after the last chunk
    recv = first_read
    last_t = 0
    while True:
        data, t = recv()
        recv = read
        if not data:
            raise BodyError("connection closed before the end of the chunked body")
        t = last_t = max(t, last_t)  # never earlier than a previous read
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
                try:
                    left = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise BodyError(f"bad chunk size line {line[:20]!r}") from None
                state = "data" if left else "trailer"
        pending = pending[pos:]
        if out:
            yield b"".join(out), t
