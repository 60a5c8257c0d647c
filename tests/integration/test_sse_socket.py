"""The SSE reader over a real socket: the urllib3 internals it relies on, kernel times, the end.

The fast path reads http.client's socket directly (locustfiles/sse.py `private_internals`).
The first test is the canary: if an urllib3 or Python upgrade moves those private attributes,
it fails here, by name, instead of every worker silently falling back to slower, loop-timed
reads (which the fallback logs).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
import urllib3

from locustfiles import sse
from locustfiles.client import Limits, execute, new_pool
from locustfiles.record import RequestRecord
from locustfiles.sse import ReadClock, events, private_internals
from tests.support.sim import SimFactory, chat_body


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
