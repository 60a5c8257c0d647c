"""The SSE reader against sseclient-py, and the chunked decoder, over arbitrary read splits."""

from __future__ import annotations

import random

import pytest
import sseclient

from locustfiles.request.sse import BodyError, data_of, dechunk, events

BODIES = [
    b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n',
    b'data: {"a": 1}\r\n\r\ndata:{"b":2}\r\n\r\n',
    b"data: line one\ndata: line two\n\n: a comment\n\nevent: ping\nid: 7\n\ndata\n\n",
    b"retry: 10\ndata: x\r\rdata: y\r\n\r\ndata: tail-without-blank-line",
    b"data:  two leading spaces\n\ndata: \xc3\xa9t\xc3\xa9\n\n",
]


pytestmark = pytest.mark.usefixtures("both_sse_readers")  # tests/support/ssereaders.py


class FakeResp:
    """Stands for a non-chunked urllib3 response: read1 returns the next piece."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def read1(self, n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def splits(body: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(body)), k=min(len(body) - 1, rng.randint(0, 8))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def reference(body: bytes) -> list[bytes]:
    out = []
    for event in sseclient.SSEClient([body]).events():
        if event.data != "":
            out.append(event.data.encode())
    return out


@pytest.mark.parametrize("body", BODIES)
def test_events_match_sseclient_whatever_the_reads(body: bytes) -> None:
    rng = random.Random(body)
    expected = reference(body)
    for _ in range(50):
        got = [d for datas, _ in events(FakeResp(splits(body, rng))) for d in datas]
        assert [g for g in got if g != b""] == expected


def test_events_from_one_read_share_its_timestamp() -> None:
    batches = list(events(FakeResp([b"data: 1\n\ndata: 2\n\ndata: 3", b"\n\n"])))
    assert [b for b, _ in batches] == [[b"1", b"2"], [b"3"]]
    assert batches[0][1] <= batches[1][1]


def test_data_of_ignores_blocks_without_data() -> None:
    assert data_of(b": keep-alive") is None
    assert data_of(b"event: x\nid: 1") is None
    assert data_of(b"data: a\ndata: b") == b"a\nb"


def chunked(payloads: list[bytes], trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)
    return body + b"0\r\n" + trailer + b"\r\n"


def reader(pieces: list[bytes]):  # type: ignore[no-untyped-def]
    it = iter(pieces)
    return lambda: (next(it, b""), 0)


@pytest.mark.parametrize("trailer", [b"", b"X-Trailer: 1\r\n"])
def test_dechunk_whatever_the_reads(trailer: bytes) -> None:
    payloads = [b"data: %d\n\n" % i * (i + 1) for i in range(20)]
    raw = chunked(payloads, trailer) + b"NEXT RESPONSE"
    rng = random.Random(1)
    for _ in range(100):
        pieces = splits(raw[: -len(b"NEXT RESPONSE")], rng)
        out = b"".join(d for d, _ in dechunk(reader(pieces[:1]), reader(pieces[1:])))
        assert out == b"".join(payloads)


def test_dechunk_reports_a_body_cut_short() -> None:
    raw = chunked([b"data: 1\n\n", b"data: 2\n\n"])[:-9]
    with pytest.raises(BodyError, match="closed before the end"):
        list(dechunk(reader([raw]), reader([])))


def test_dechunk_rejects_garbage_sizes() -> None:
    with pytest.raises(BodyError, match="bad chunk size"):
        list(dechunk(reader([b"zz\r\nabc\r\n"]), reader([])))
    with pytest.raises(BodyError, match="bad chunk size"):
        list(dechunk(reader([b"-3\r\nabc\r\n0\r\n\r\n"]), reader([])))
    for whole in (True, False):  # a chunk whose data is not followed by CRLF, whole or split
        raw = b"3\r\nabcXY0\r\n\r\n"
        pieces = [raw] if whole else [raw[:5], raw[5:]]
        with pytest.raises(BodyError, match="not followed by CRLF"):
            list(dechunk(reader(pieces[:1]), reader(pieces[1:])))


def test_dechunk_reads_extensions_and_any_hex_case() -> None:
    raw = b"A;name=value\r\n0123456789\r\n1a\r\n" + b"x" * 26 + b"\r\n0;last\r\n\r\n"
    for cut in range(1, len(raw)):
        got = b"".join(d for d, _ in dechunk(reader([raw[:cut]]), reader([raw[cut:]])))
        assert got == b"0123456789" + b"x" * 26, cut


def test_the_kernel_clock_skew_of_a_normal_process_is_zero() -> None:
    from locustfiles.request.sse import _measure_kernel_skew

    assert _measure_kernel_skew() == 0  # time_ns() and the kernel's timestamps agree here
