"""The SSE reader over a real socket: the urllib3 internals it relies on, kernel times, the end.

The fast path reads http.client's socket directly (locustfiles/request/sse.py `private_internals`).
The first test is the canary: if an urllib3 or Python upgrade moves those private attributes,
it fails here, by name, instead of every worker silently falling back to slower, loop-timed
reads (which the fallback logs).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import urllib3

from locustfiles.request import sse
from locustfiles.request.client import Limits, execute, new_pool
from locustfiles.request.record import RequestRecord
from locustfiles.request.sse import ReadClock, events, private_internals
from tests.support.raw import END, HEAD, Respond, chunk, sse_event
from tests.support.sim import TIMEOUT, SimFactory, chat_body

MS = 1_000_000


@pytest.fixture
def pool() -> Iterator[urllib3.PoolManager]:
    manager = new_pool()
    yield manager
    manager.clear()


def _open(pool: urllib3.PoolManager, port: int, **extra: object) -> urllib3.HTTPResponse:
    body = chat_body(max_tokens=6, stream=True, **extra)
    return pool.urlopen(
        "POST", f"http://127.0.0.1:{port}/v1/chat/completions", body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, preload_content=False, decode_content=False,
    )  # fmt: skip


def test_canary_the_installed_urllib3_has_the_internals_the_fast_path_uses(
    sim_factory: SimFactory, pool: urllib3.PoolManager
) -> None:
    sim = sim_factory()
    resp = _open(pool, sim.port)
    found = private_internals(resp)
    assert not isinstance(found, str), f"fast SSE path unavailable: {found} (urllib3 changed?)"
    fp, src, sock = found
    assert fp is resp._fp and callable(fp._close_conn)
    assert hasattr(src, "read1") and sock.fileno() >= 0
    resp.drain_conn()
    resp.release_conn()


def test_every_read_sets_the_clock_and_the_last_one_ends_the_body(
    sim_factory: SimFactory, pool: urllib3.PoolManager
) -> None:
    sim = sim_factory("--decode-base-ms", "5")
    resp = _open(pool, sim.port)
    clock = ReadClock()
    before = time.perf_counter_ns()
    batches = list(events(resp, clock))
    after = time.perf_counter_ns()
    resp.release_conn()
    times = [t for _, t in batches]
    assert times == sorted(times) and before <= times[0]
    assert times[-1] <= clock.last <= after  # the final read (terminating chunk) counts too
    assert b"[DONE]" in [d for datas, _ in batches for d in datas]


class WithoutInternals:
    """A urllib3 response as a future urllib3 might make it: no `_fp`."""

    def __init__(self, resp: urllib3.HTTPResponse) -> None:
        self.read1 = resp.read1


def test_the_fallback_reads_everything_and_says_why(
    sim_factory: SimFactory,
    caplog: pytest.LogCaptureFixture,
    pool: urllib3.PoolManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "_warned", set())  # the warning is logged once per process
    sim = sim_factory()
    resp = _open(pool, sim.port)
    with caplog.at_level(logging.WARNING, logger="llmload.sse"):
        datas = [d for batch, _ in events(WithoutInternals(resp), ReadClock()) for d in batch]
    assert datas[-1] == b"[DONE]" and len(datas) >= 7
    assert "fast SSE path unavailable (urllib3 response without _fp" in caplog.text


def test_end_of_response_is_the_arrival_of_its_last_bytes_not_when_the_loop_got_there(
    sim_factory: SimFactory, pool: urllib3.PoolManager
) -> None:
    sim = sim_factory("--decode-base-ms", "2")
    record = RequestRecord("req-end", 0, 1, False, "s", "chat", sim.config.served_model, True,
                           None, 6, "")  # fmt: skip
    body = chat_body(max_tokens=6, stream=True, stream_options={"include_usage": True})
    url = f"http://127.0.0.1:{sim.port}/v1/chat/completions"
    execute(pool, url, body, {"X-Request-Id": "req-end"}, record, Limits())
    assert record.status == "ok", record.error_detail
    assert record.last_token_ns is not None and record.end_ns is not None
    # the end is the arrival of the read that ended the body: right after the last token
    assert 0 <= record.end_ns - record.last_token_ns < 5_000_000
    assert record.coalesced_events >= 0


# -- against a raw server (tests/support/raw.py), a client whose reads it watches ----------


class WatchedReads:
    """Wraps the reader's socket reads (`sse.socket_reader`): the server can wait until the
    client is about to read the socket again (so each of its sends is one read), the first
    read can be held back `hold_s` (a busy loop), and each read's start and return are noted
    (perf_counter ns)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold_s: float = 0.0) -> None:
        self.hold_s = hold_s
        self.started: list[int] = []
        self.returned: list[int] = []
        self._reading = threading.Semaphore(0)
        real = sse.socket_reader

        def socket_reader(sock: object) -> sse.Reader:
            read = real(sock)

            def watched() -> tuple[bytes, int]:
                self.started.append(time.perf_counter_ns())
                self._reading.release()
                if self.hold_s and len(self.started) == 1:
                    time.sleep(self.hold_s)  # the bytes arrive meanwhile; nobody reads them
                got = read()
                self.returned.append(time.perf_counter_ns())
                return got

            return watched

        monkeypatch.setattr(sse, "socket_reader", socket_reader)

    def wait_for_a_read(self) -> None:
        """(server side) Until the client is in, or about to enter, its next socket read."""
        if not self._reading.acquire(timeout=TIMEOUT):
            raise TimeoutError("the client never read the socket (no fast SSE path?)")


def _record(request_id: str) -> RequestRecord:
    return RequestRecord(request_id, 0, 1, False, "s", "chat", "m", True, None, 6, "")


def test_events_that_share_a_read_share_its_time_and_are_counted(
    raw_server: Callable[[Respond], int],
    pool: urllib3.PoolManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = WatchedReads(monkeypatch)

    def respond(conn: socket.socket) -> None:
        conn.sendall(HEAD)
        reads.wait_for_a_read()  # the headers are in and nothing of the body is buffered
        conn.sendall(chunk(sse_event("a") + sse_event("b") + sse_event("c")))  # one read
        for later in (sse_event("d"), sse_event("e", "stop"), b"data: [DONE]\n\n"):
            reads.wait_for_a_read()  # the previous send was read on its own
            time.sleep(0.02)
            conn.sendall(chunk(later) + (END if later.startswith(b"data: [DONE]") else b""))

    port = raw_server(respond)
    record = _record("req-coalesced")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    execute(pool, url, chat_body(max_tokens=6), {}, record, Limits())
    assert record.status == "ok", record.error_detail
    assert record.end_ns is not None
    assert record.events == 6 and record.chunk_tokens == [1] * 5
    assert record.coalesced_events == 2  # b and c came in a's read; d, e, [DONE] alone
    a, b, c, d, e = record.chunk_offsets
    assert a == b == c  # one read, one time
    assert c < d < e <= record.end_ns  # a read of their own each


def test_event_times_are_the_kernels_arrival_not_when_the_client_read_them(
    raw_server: Callable[[Respond], int],
    pool: urllib3.PoolManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole body arrives while the client is kept from reading for 200 ms (as a busy
    worker loop would): its events and end keep the time the bytes arrived."""
    reads = WatchedReads(monkeypatch, hold_s=0.2)
    body = b"".join(chunk(sse_event(t)) for t in "abc") + chunk(sse_event("", "stop"))
    body += chunk(b"data: [DONE]\n\n") + END

    def respond(conn: socket.socket) -> None:
        conn.sendall(HEAD)
        reads.wait_for_a_read()  # sent while the client holds its first read back
        conn.sendall(body)

    port = raw_server(respond)
    record = _record("req-kernel")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    execute(pool, url, chat_body(max_tokens=6), {}, record, Limits())
    assert record.status == "ok", record.error_detail
    assert record.headers_ns is not None and record.end_ns is not None
    assert len(record.chunk_offsets) == 3 and len(reads.returned) == 1  # all in one read
    # Record times are ns since the request was sent (t0), which the test does not see;
    # the headers were timed (t0 + headers_ns) before the first read started, so the read
    # returned at least `returned - started + headers_ns - x` after a time x was recorded.
    held = reads.returned[0] - reads.started[0]
    assert held >= 200 * MS
    for name, t in (("first token", record.chunk_offsets[0]),
                    ("last token", record.chunk_offsets[-1]), ("end", record.end_ns)):  # fmt: skip
        before_read = held + record.headers_ns - t
        assert before_read >= 150 * MS, f"{name} timed {before_read / MS:.1f} ms before the read"


def test_a_thread_switch_between_the_clock_readings_never_times_a_read_before_its_arrival(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read's kernel time is moved onto perf_counter with two clock readings; when the loop
    thread loses the GIL between them (the sink's thread, milliseconds), the time may come
    out late, never before the bytes arrived (CI once saw a first event timed before the
    request's write, in a saturated open-loop worker)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                read = sse.socket_reader(client)  # stamps on (the skew measured unpatched)
                sent = time.perf_counter_ns()
                server.sendall(b"x")
                time.sleep(0.02)  # the bytes are in the kernel's buffer

                def late_wall() -> int:  # the thread was switched out before this reading
                    time.sleep(0.005)
                    return time.time_ns()

                monkeypatch.setattr(sse, "_time_ns", late_wall)
                data, t = read()
    assert data == b"x"
    assert t >= sent, (t - sent) / 1e6
