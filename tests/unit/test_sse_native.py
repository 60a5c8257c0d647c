"""The C decoder (`locustfiles/request/_ssefast.c`) against the SSE reader's Python code.

sse.py reads with the C extension where it is built and with its own Python code where it is
not; both must give the same events, the same times and the same errors. Here they meet over
random bodies (data, comments, fields, every line end, odd chunk size lines, trailers), random
read splits, and broken bodies (cut short, bad sizes, data not followed by CRLF, events past
the bound), the chunked framing undone by each; then the C decoder reads a real gevent
socket itself (`_socket_events`), waits on it, and times out as gevent's recv does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import pytest
from gevent import socket as gsocket

from locustfiles.request import sse
from locustfiles.request.sse import BodyError, EventTooLong, ReadClock, dechunk

pytestmark = pytest.mark.skipif(sse._native is None, reason="the C extension is not built")


def test_the_extension_is_built_here() -> None:
    """`pip install -e .` builds it (setup.py); the suites must test it, not only the fallback.
    LLMLOAD_SSE=python turns it off on purpose."""
    assert sse.implementation() == "native"


def test_its_clock_is_perf_counter() -> None:
    for _ in range(1000):
        before = time.perf_counter_ns()
        now = sse._native.perf_ns()
        assert before <= now <= time.perf_counter_ns()


# -- bodies ---------------------------------------------------------------------------------
def sse_text(rng: random.Random) -> bytes:
    """Random SSE text: events of data lines, comments and other fields, any line end."""
    parts = []
    for _ in range(rng.randint(0, 12)):
        lines = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            value = bytes(rng.choice(b'ab {}":,\xc3\xa9') for _ in range(rng.randint(0, 12)))
            if kind < 0.55:
                lines.append(rng.choice([b"data: ", b"data:", b"data:  "]) + value)
            elif kind < 0.65:
                lines.append(b"data")
            elif kind < 0.8:
                lines.append(b": " + value)
            elif kind < 0.9:
                lines.append(rng.choice([b"event: x", b"id: 7", b"retry: 10", b"dat: q"]))
            else:
                lines.append(b"")  # an extra blank line: an empty block
        end = rng.choice([b"\n", b"\r\n", b"\r"])
        parts.append(end.join(lines) + end + end)
    tail = rng.choice([b"", b"data: tail-without-blank-line", b"data: x\r", b"data: y\n"])
    return b"".join(parts) + tail


def size_line(n: int, rng: random.Random) -> bytes:
    form = rng.random()
    if form < 0.6:
        return b"%x" % n
    if form < 0.75:
        return b"%X" % n
    if form < 0.85:
        return b"%x;name=value" % n
    if form < 0.95:
        return b"00%x" % n
    return b" %x " % n  # whitespace: Python's int() takes it


def chunked(text: bytes, rng: random.Random) -> bytes:
    out, pos = [], 0
    while pos < len(text):
        n = rng.randint(1, 40)
        piece = text[pos : pos + n]
        out.append(size_line(len(piece), rng) + b"\r\n" + piece + b"\r\n")
        pos += n
    trailer = rng.choice([b"", b"X-Trailer: 1\r\n"])
    return b"".join(out) + b"0\r\n" + trailer + b"\r\n"


def splits(body: bytes, rng: random.Random) -> list[bytes]:
    if len(body) < 2:
        return [body] if body else []
    cuts = sorted(rng.sample(range(1, len(body)), k=min(len(body) - 1, rng.randint(0, 10))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def broken(body: bytes, rng: random.Random) -> bytes:
    """A body spoilt one way or another (or not at all)."""
    how = rng.random()
    if how < 0.2:
        return body[: rng.randint(0, len(body))]  # cut short
    if how < 0.4:
        i = rng.randrange(len(body))
        return body[:i] + bytes([rng.choice(b"zZ\r\n-0 ;")]) + body[i + 1 :]  # one byte changed
    if how < 0.5:
        return rng.choice([b"-3\r\nabc\r\n", b"zz\r\n", b"\r\n", b"3\r\nabcXY"]) + body
    return body


# -- the two ways through -------------------------------------------------------------------
class FakeLean:
    """A chunked body of the lean path, read as `pieces` (times 10, 20, ...), the first one
    as what came with the headers (time 5)."""

    chunked = True

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.complete = False

    def _sources(self) -> tuple[Callable[[], tuple[bytes, int] | None], Callable[[], Any]]:
        first = self.pieces[0] if self.pieces else b""
        rest = iter(enumerate(self.pieces[1:], start=1))

        def read() -> tuple[bytes, int]:
            i, piece = next(rest, (len(self.pieces), b""))
            return piece, 10 * i

        return (lambda: (first, 5) if first else None), read

    def timed_reads(self, clock: Any) -> Iterator[tuple[bytes, int]]:  # the Python path
        yield from dechunk(*self._sources(), clock)
        self.complete = True

    def chunked_source(self) -> tuple[Any, Any, Any]:  # the C path (no socket: raw_reads)
        return (*self._sources(), None)

    def ended(self) -> None:
        self.complete = True


class FakePlain:
    """A body without chunked framing, read as `pieces` (times 10, 20, ...): both paths
    split it, the C one through `feed`."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def timed_reads(self, clock: Any) -> Iterator[tuple[bytes, int]]:
        for i, piece in enumerate(self.pieces, start=1):
            clock.last = 10 * i
            yield piece, 10 * i


def outcome(
    native: bool, make: Callable[[], Any], limit: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[list[bytes], int]], str | None, int, bool]:
    """(what events() yielded, the error it ended with, the clock's last time, complete)."""
    with monkeypatch.context() as m:
        if not native:
            m.setattr(sse, "_native", None)
        resp, clock, got = make(), ReadClock(), []
        error = None
        try:
            for datas, t in sse.events(resp, clock, limit):
                got.append((list(datas), t))
        except (BodyError, EventTooLong) as exc:
            error = f"{type(exc).__name__}: {exc}"
        return got, error, clock.last, bool(getattr(resp, "complete", True))


def same(make: Callable[[], Any], limit: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    expected = outcome(False, make, limit, monkeypatch)
    assert outcome(True, make, limit, monkeypatch) == expected
    return expected


@pytest.mark.parametrize("seed", range(40))
def test_chunked_bodies_read_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        body = chunked(sse_text(rng), rng)
        pieces = splits(body, rng)
        got, error, _, complete = same(lambda p=pieces: FakeLean(p), 1 << 20, monkeypatch)
        assert error is None and complete


@pytest.mark.parametrize("seed", range(40))
def test_broken_chunked_bodies_fail_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1000 + seed)
    errors = 0
    for _ in range(25):
        body = broken(chunked(sse_text(rng), rng), rng)
        pieces = splits(body, rng)
        limit = rng.choice([1 << 20, 30, 60])
        errors += same(lambda p=pieces: FakeLean(p), limit, monkeypatch)[1] is not None
    assert errors  # the spoilt bodies did spoil some reads


@pytest.mark.parametrize("seed", range(20))
def test_plain_bodies_read_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(2000 + seed)
    for _ in range(25):
        pieces = splits(sse_text(rng), rng)
        limit = rng.choice([1 << 20, 40])
        same(lambda p=pieces: FakePlain(p), limit, monkeypatch)


def test_the_errors_name_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {
        b"zz\r\nabc\r\n": "BodyError: bad chunk size line b'zz'",
        b"-3\r\nabc\r\n0\r\n\r\n": "BodyError: bad chunk size line b'-3'",
        b"3\r\nabcXY0\r\n\r\n": "BodyError: chunk data not followed by CRLF",
        b"3\r\nabc\r\n": "BodyError: connection closed before the end of the chunked body",
        b"20\r\ndata: " + b"x" * 26 + b"\r\n": "EventTooLong: an event line longer than 16 bytes",
    }
    for body, message in cases.items():
        for pieces in ([body], [body[:4], body[4:]]):
            assert same(lambda p=pieces: FakeLean(p), 16, monkeypatch)[1] == message


def test_huge_chunk_sizes_wait_for_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    body = b"ffffffffffffffffffffff\r\ndata: x\n\n"  # past 64 bits: read until the body ends
    got, error, _, _ = same(lambda: FakeLean([body]), 1 << 20, monkeypatch)
    assert got == [([b"x"], 5)] and error == "BodyError: " + (
        "connection closed before the end of the chunked body"
    )


def test_a_stream_holds_only_what_is_pending() -> None:
    """A large read grows the decoder's buffers; once its events are out they shrink back:
    an open stream holds no read-sized buffer between reads (memory per stream)."""
    decoder = sse._native.Decoder(True, 1 << 20, sse.chunk_size, BodyError, EventTooLong)
    text = b"".join(b'data: {"i": %d, "pad": "%s"}\n\n' % (i, b"x" * 200) for i in range(800))
    body = chunked(text, random.Random(5))
    datas = decoder.feed(body[: len(body) // 2])
    assert len(datas) > 300 and decoder.held() < 4096
    datas = decoder.feed(body[len(body) // 2 :])
    assert decoder.done and decoder.held() < 4096


# -- the C decoder on a real socket -----------------------------------------------------------
class SocketLean:
    """A chunked body on a gevent socket, the way wire.LeanResponse hands it over."""

    chunked = True

    def __init__(self, sock: Any, first: bytes = b"") -> None:
        self.sock, self.first, self.complete = sock, first, False

    def chunked_source(self) -> tuple[Any, Any, Any]:
        first, at = self.first, time.perf_counter_ns()
        return (lambda: (first, at) if first else None), sse.socket_reader(self.sock), self.sock

    def ended(self) -> None:
        self.complete = True


def _pair() -> tuple[Any, Any]:
    a, b = gsocket.socketpair()  # AF_UNIX: no kernel stamps, the read's time instead
    return a, b


def _tcp_pair() -> tuple[Any, Any]:
    server = gsocket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = gsocket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    return client, peer


def test_the_decoder_reads_a_gevent_socket_and_waits_on_it() -> None:
    client, peer = _tcp_pair()
    text = b"".join(b'data: {"i": %d}\n\n' % i for i in range(30))
    body = chunked(text, random.Random(7))
    sent: list[int] = []

    def write() -> None:
        for piece in splits(body, random.Random(8)):
            gevent.sleep(0.002)
            sent.append(time.perf_counter_ns())
            peer.sendall(piece)

    writer = gevent.spawn(write)
    resp = SocketLean(client)
    assert sse._waitable(client)
    clock = ReadClock()
    clock.last = start = time.perf_counter_ns()
    got = list(sse.events(resp, clock))
    writer.join()
    assert [d for datas, _ in got for d in datas] == [b'{"i": %d}' % i for i in range(30)]
    times = [t for _, t in got]
    assert times == sorted(times) and start <= times[0] and times[-1] <= time.perf_counter_ns()
    assert times[-1] >= sent[-1]  # kernel times: the last read came after the last write
    assert resp.complete
    client.close()
    peer.close()


def test_a_read_on_a_gevent_socket_times_out_as_gevents_recv_does() -> None:
    client, peer = _tcp_pair()
    client.settimeout(0.05)
    peer.sendall(b"5\r\ndata:\r\n")  # a chunk, then nothing
    with pytest.raises(TimeoutError):
        list(sse.events(SocketLean(client)))
    client.close()
    peer.close()


def test_a_connection_closed_mid_body_is_a_body_error_on_a_socket() -> None:
    client, peer = _pair()
    peer.sendall(b"9\r\ndata: a\n\n\r\n")
    peer.close()
    resp = SocketLean(client)
    got = []
    with pytest.raises(BodyError, match="closed before the end"):
        for datas, _ in sse.events(resp):
            got.extend(datas)
    assert got == [b"a"] and not resp.complete
    client.close()


def test_the_bytes_that_came_with_the_headers_come_first() -> None:
    client, peer = _pair()
    body = chunked(b"data: 1\n\ndata: 2\n\n", random.Random(3))
    peer.sendall(body[5:])
    got = [d for datas, _ in sse.events(SocketLean(client, first=body[:5])) for d in datas]
    assert got == [b"1", b"2"]
    client.close()
    peer.close()


def test_the_timed_reader_of_a_gevent_socket_is_the_c_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """socket_reader on a gevent socket reads through the extension (headers, bodies of any
    framing): the bytes, the kernel's times and the end as the Python reader gives them."""
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(sse, "_native", None)
            client, peer = _tcp_pair()
            read = sse.socket_reader(client)
            assert ("_native_reader" in read.__qualname__) is native
            got = []

            def write(peer: Any) -> None:
                for piece in (b"HTTP/1.1 200 OK\r\n", b"\r\n", b"abc"):
                    gevent.sleep(0.003)
                    peer.sendall(piece)
                    gevent.sleep(0.003)
                peer.close()

            writer = gevent.spawn(write, peer)
            before = time.perf_counter_ns()
            while True:
                data, t = read()
                got.append(data)
                if not data:
                    break
                assert before <= t <= time.perf_counter_ns()
            writer.join()
            assert b"".join(got) == b"HTTP/1.1 200 OK\r\n\r\nabc" and len(got) == 4
            client.settimeout(0.05)
            with pytest.raises(OSError):  # closed by us: no read hangs
                client.close()
                read()
