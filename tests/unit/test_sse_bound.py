"""One SSE event is bounded in size (`--max-event-bytes`), checked once per read."""

from __future__ import annotations

import pytest

from locustfiles.request.client import Limits
from locustfiles.request.sse import MAX_EVENT_BYTES, EventTooLong, events
from locustfiles.request.watchdog import Watch

pytestmark = pytest.mark.usefixtures("both_sse_readers")  # tests/support/ssereaders.py


class FakeResp:
    """Stands for a non-chunked urllib3 response: read1 returns the next piece."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def read1(self, n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def datas(pieces: list[bytes], limit: int) -> list[bytes]:
    return [d for batch, _ in events(FakeResp(pieces), max_event_bytes=limit) for d in batch]


def test_the_default_bound_is_one_mebibyte() -> None:
    assert MAX_EVENT_BYTES == 1 << 20


def test_an_event_within_the_bound_passes_whatever_the_reads() -> None:
    line = b"data: " + b"x" * 94 + b"\n\n"  # 102 bytes pending before its blank line
    assert datas([line[:50], line[50:]], 102) == [b"x" * 94]
    assert datas([line * 3], 102) == [b"x" * 94] * 3


@pytest.mark.parametrize(
    "pieces",
    [
        [b"data: " + b"x" * 200],  # one read, no line end
        [b"data: " + b"x" * 50, b"x" * 50, b"x" * 100],  # grows over reads
        [b"data: a\n\ndata: " + b"x" * 200],  # after a complete event in the same read
        [b": ping\n" * 40],  # comment lines without a blank line: one endless event
    ],
    ids=["one-read", "over-reads", "after-an-event", "comment-lines"],
)
def test_an_event_past_the_bound_is_cut(pieces: list[bytes]) -> None:
    with pytest.raises(EventTooLong, match="an event line longer than 100 bytes"):
        datas(pieces, 100)


def test_comments_are_not_a_first_token() -> None:
    """The TTFT deadline counts from the request's start: reads of `: ping` comments (which
    move `last`, the stall clock) do not put it off."""
    watch = Watch(Limits(ttft_timeout=1.0, request_timeout=None, stall_timeout=0.5))
    watch.t0 = 0
    watch.last = int(1.5e9)  # a comment read just now
    assert watch.check(int(1.6e9)) == "ttft_timeout"
