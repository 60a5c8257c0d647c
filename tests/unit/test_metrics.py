"""The timing metrics against the handbook's worked example and hand-made timelines."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.derive.metrics import compute_request_metrics
from analysis.kernel.errors import EventDataError, InvalidTimelineError

S = 1_000_000_000  # ns per second


def make_run(
    timelines: dict[str, tuple[float, list[tuple[float, int]]]],
    *,
    queue_s: float = 0.0,
    output_tokens: dict[str, int] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """requests/chunks frames from {request_id: (end_s, [(chunk_offset_s, tokens), ...])}."""
    req_rows, chunk_rows = [], []
    for rid, (end, chunks) in timelines.items():
        offsets = [round((t + queue_s) * S) for t, _ in chunks]
        tokens = sum(k for _, k in chunks)
        req_rows.append(
            {
                "request_id": rid,
                "headers_ns": offsets[0] // 2 if offsets else None,
                "first_event_ns": offsets[0] if offsets else None,
                "first_token_ns": offsets[0] if offsets else None,
                "last_token_ns": offsets[-1] if offsets else None,
                "end_ns": round((end + queue_s) * S),
                "output_tokens": (output_tokens or {}).get(rid, tokens),
            }
        )
        for seq, ((_, k), off) in enumerate(zip(chunks, offsets, strict=True)):
            chunk_rows.append({"request_id": rid, "seq": seq, "offset_ns": off, "tokens": k})
    chunks_df = pd.DataFrame(chunk_rows, columns=["request_id", "seq", "offset_ns", "tokens"])
    return pd.DataFrame(req_rows).astype({"output_tokens": "Int64"}), chunks_df


HANDBOOK = {"r": (1.25, [(0.8, 1), (0.9, 1), (1.2, 1)])}


def test_handbook_lab_base_case() -> None:
    m = compute_request_metrics(*make_run(HANDBOOK))
    row = m.per_request.iloc[0]
    assert row.ttft_s == pytest.approx(0.8)
    assert row.tpot_s == pytest.approx(0.2)
    assert row.e2e_s == pytest.approx(1.25)
    assert m.itl.expand() == pytest.approx([0.1, 0.3])
    assert m.icl.expand() == pytest.approx([0.1, 0.3])
    assert row.itl_mean_s == pytest.approx(row.tpot_s)


def test_handbook_lab_one_second_of_queueing_moves_ttft_only() -> None:
    m = compute_request_metrics(*make_run(HANDBOOK, queue_s=1.0))
    row = m.per_request.iloc[0]
    assert row.ttft_s == pytest.approx(1.8)
    assert m.itl.expand() == pytest.approx([0.1, 0.3])
    assert row.tpot_s == pytest.approx(0.2)
    assert row.e2e_s == pytest.approx(2.25)


def test_handbook_lab_late_last_token_raises_tpot_and_e2e() -> None:
    late = {"r": (1.75, [(0.8, 1), (0.9, 1), (1.7, 1)])}
    row = compute_request_metrics(*make_run(late)).per_request.iloc[0]
    assert row.ttft_s == pytest.approx(0.8)
    assert row.tpot_s == pytest.approx(0.45)
    assert row.e2e_s == pytest.approx(1.75)


def test_multi_token_chunks_spread_the_interval_over_their_tokens() -> None:
    # 2 tokens at 0.5 s, then 3 tokens at 0.9 s: 5 tokens, TPOT = 0.4 / 4 = 0.1.
    m = compute_request_metrics(*make_run({"r": (1.0, [(0.5, 2), (0.9, 3)])}))
    row = m.per_request.iloc[0]
    assert row.tpot_s == pytest.approx(0.1)
    # The first chunk's extra token counts 0; the second chunk gives 3 samples of 0.4/3.
    assert sorted(m.itl.expand()) == pytest.approx([0.0, 0.4 / 3, 0.4 / 3, 0.4 / 3])
    assert row.itl_mean_s == pytest.approx(row.tpot_s)
    # The inter-chunk latency is the raw 0.4 s interval: one sample, not per token.
    assert m.icl.expand() == pytest.approx([0.4])
    assert row.chunk_tokens == 5


def test_single_token_has_missing_tpot_not_zero() -> None:
    m = compute_request_metrics(*make_run({"r": (0.31, [(0.3, 1)])}))
    row = m.per_request.iloc[0]
    assert row.ttft_s == pytest.approx(0.3)
    assert math.isnan(row.tpot_s)
    assert math.isnan(row.itl_mean_s)
    assert math.isnan(row.icl_mean_s)
    assert len(m.itl) == 0


def test_request_without_tokens_has_missing_token_metrics() -> None:
    requests, chunks = make_run({"r": (0.5, [])})
    requests["output_tokens"] = pd.array([pd.NA], dtype="Int64")
    row = compute_request_metrics(requests, chunks).per_request.iloc[0]
    assert math.isnan(row.ttft_s) and math.isnan(row.tpot_s)
    assert math.isnan(row.output_tokens_per_s)
    assert row.e2e_s == pytest.approx(0.5)


def test_many_requests_interleaved_and_categorical_ids_give_the_same_answer() -> None:
    rng = np.random.default_rng(7)
    timelines = {}
    for i in range(50):
        n = int(rng.integers(1, 20))
        times = np.cumsum(rng.uniform(0.001, 0.05, n)) + 0.2
        toks = rng.integers(1, 4, n)
        timelines[f"r{i}"] = (float(times[-1]) + 0.01, list(zip(times, toks, strict=True)))
    requests, chunks = make_run(timelines)
    shuffled = chunks.sample(frac=1.0, random_state=1).reset_index(drop=True)
    plain = compute_request_metrics(requests, shuffled)
    shuffled["request_id"] = shuffled["request_id"].astype("category")
    cat = compute_request_metrics(requests, shuffled)
    pd.testing.assert_frame_equal(plain.per_request, cat.per_request)
    ok = plain.per_request["tpot_s"].notna()
    np.testing.assert_allclose(
        plain.per_request.loc[ok, "itl_mean_s"], plain.per_request.loc[ok, "tpot_s"], rtol=1e-9
    )
    # Per-token samples: one per output token after the first, over the whole table.
    assert plain.itl.weight.sum() == pytest.approx(chunks["tokens"].sum() - len(timelines))


def test_orphan_chunks_are_counted_and_excluded() -> None:
    requests, chunks = make_run(HANDBOOK)
    orphan = pd.DataFrame([{"request_id": "ghost", "seq": 0, "offset_ns": 5, "tokens": 1}])
    m = compute_request_metrics(requests, pd.concat([chunks, orphan], ignore_index=True))
    assert m.orphan_chunks == 1
    assert m.itl.expand() == pytest.approx([0.1, 0.3])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r, c: r.__setitem__("end_ns", [int(1.1 * S)]), "end_ns precedes last_token_ns"),
        (lambda r, c: r.__setitem__("headers_ns", [-1]), "headers_ns is negative"),
        (
            lambda r, c: c.__setitem__("offset_ns", [int(0.9 * S), int(0.8 * S), int(1.2 * S)]),
            "tokens out of order",
        ),
        (lambda r, c: c.__setitem__("seq", [0, 1, 1]), "share one seq"),
        (
            lambda r, c: c.__setitem__("offset_ns", [int(0.8 * S), int(0.9 * S), int(1.3 * S)]),
            "after the end",
        ),
    ],
)
def test_impossible_timelines_are_rejected_naming_the_request(mutate, reason) -> None:  # type: ignore[no-untyped-def]
    requests, chunks = make_run(HANDBOOK)
    mutate(requests, chunks)
    with pytest.raises(InvalidTimelineError, match=reason) as info:
        compute_request_metrics(requests, chunks)
    assert "request r" in str(info.value)
    assert info.value.request_ids == ["r"]


def test_duplicate_request_rows_are_an_error() -> None:
    requests, chunks = make_run(HANDBOOK)
    with pytest.raises(EventDataError, match="more than one request row"):
        compute_request_metrics(pd.concat([requests, requests]), chunks)
