"""The watchdog's deadlines: total, TTFT until the first token, stall only after it."""

from __future__ import annotations

from locustfiles.request.client import Limits
from locustfiles.request.watchdog import Watch

S = 1_000_000_000


def watch(**limits: float | None) -> Watch:
    w = Watch(Limits(**limits))  # type: ignore[arg-type]
    w.t0 = w.last = w.progress = 0
    return w


def test_before_the_first_token_only_ttft_and_total_apply() -> None:
    w = watch(request_timeout=100, ttft_timeout=None, stall_timeout=1)
    assert w.check(50 * S) is None  # a long queue is not a stall
    w = watch(request_timeout=100, ttft_timeout=2, stall_timeout=1)
    assert w.check(int(1.5 * S)) is None and w.check(3 * S) == "ttft_timeout"


def test_after_the_first_token_a_silent_stream_stalls_and_the_total_still_counts() -> None:
    w = watch(request_timeout=10, ttft_timeout=2, stall_timeout=1)
    w.waiting_first = False
    w.last = w.progress = 5 * S
    assert w.check(int(5.5 * S)) is None
    assert w.check(int(6.5 * S)) == "stall_timeout"
    w.last = int(6.4 * S)  # a read that completed no data event (a `: ping`) is no progress
    assert w.check(int(6.5 * S)) == "stall_timeout"
    w.last = w.progress = int(10.5 * S)
    assert w.check(11 * S) == "total_timeout"
    w.expired = "stall_timeout"
    assert w.detail() == "no data within 1 s"
