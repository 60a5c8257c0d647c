"""Per-request timing metrics, defined once and computed over whole tables.

Definitions (client view; docs/metrics.md has the formulas and the handbook's worked example):

- TTFE  = first event − send        (any SSE event, possibly a role-only chunk)
- TTFT  = first token − send        (first event carrying content, reasoning content or
          tool-call arguments: every chunk kind is output, none is filtered out)
- TTFO  = first answer − send       (first event carrying content or tool-call arguments:
          the answer the user waits for, after any reasoning; = TTFT without reasoning)
- TTFR  = first reasoning − send    (first event carrying reasoning; missing without any)
- E2E   = end of response − send
- TPOT  = (last token − first token) / (output tokens − 1); missing for a single token
- ITL   = per-token inter-token latency: a chunk of k tokens arriving Δ after the previous
          chunk contributes k samples of Δ/k; the first chunk's extra k−1 tokens contribute
          samples of 0. So a request's mean ITL equals its TPOT.
- ICL   = inter-chunk latency: the raw interval between consecutive output events. Never ITL.
- output_tokens_per_s = output tokens / E2E

Missing data gives NaN, never 0. Impossible timelines raise InvalidTimelineError naming the
request. Everything is vectorised with numpy: no Python loop per request or per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from analysis.kernel.errors import EventDataError, InvalidTimelineError

NS_PER_S = 1e9

# Request offsets in timeline order: each must be >= the ones before it when both are present.
_ORDERED_OFFSETS = ("headers_ns", "first_event_ns", "first_token_ns", "last_token_ns", "end_ns")
OUTPUT_KIND_OFFSETS: Final = ("first_content_ns", "first_reasoning_ns", "first_answer_ns")
"""Where one kind of output began: between the first and the last token."""


@dataclass(frozen=True)
class Samples:
    """Weighted latency samples: `weight[i]` samples of `value_s[i]` from request row `request[i]`.

    Weights let one chunk of k tokens stand for k per-token samples without expanding them.
    """

    request: np.ndarray  # int64 row positions in the requests table
    value_s: np.ndarray  # float64 seconds
    weight: np.ndarray  # float64 count of samples each value stands for

    def __len__(self) -> int:
        return len(self.value_s)

    def expand(self) -> np.ndarray:
        """Every sample spelled out (for tests and small data only)."""
        return np.repeat(self.value_s, self.weight.astype(np.int64))

    def select(self, mask_by_request: np.ndarray) -> Samples:
        """The samples whose request row is selected by a boolean mask over requests."""
        keep = mask_by_request[self.request]
        return Samples(self.request[keep], self.value_s[keep], self.weight[keep])


@dataclass(frozen=True)
class RequestMetrics:
    """Metrics for every request row (same order as the input) plus the ITL/ICL samples."""

    per_request: pd.DataFrame
    itl: Samples | None  # None: the chunks were read out of core (analysis/derive/chunkfacts.py)
    icl: Samples | None
    orphan_chunks: int  # chunk rows whose request row is absent (excluded from everything)


def chunk_request_index(request_ids: pd.Series, chunk_request_ids: pd.Series) -> np.ndarray:
    """Row position in `request_ids` of each chunk's request; -1 where there is none.

    Categorical chunk ids (as read from dictionary-encoded Parquet) are matched per category,
    which is much faster than hashing every chunk row.
    """
    index = pd.Index(request_ids)
    if not index.is_unique:
        dup = index[index.duplicated()].unique()
        raise EventDataError(
            f"request id {dup[0]} appears in more than one request row "
            f"({len(dup)} duplicated ids); each request must be recorded once"
        )
    if isinstance(chunk_request_ids.dtype, pd.CategoricalDtype):
        cat = chunk_request_ids.cat
        per_category = index.get_indexer(cat.categories)
        codes = cat.codes.to_numpy()
        return np.where(codes >= 0, per_category[codes], -1).astype(np.int64)
    return np.asarray(index.get_indexer(chunk_request_ids), dtype=np.int64)


def _offset_s(requests: pd.DataFrame, column: str) -> np.ndarray:
    if column not in requests:
        return np.full(len(requests), np.nan)
    return pd.to_numeric(requests[column], errors="coerce").to_numpy(np.float64) / NS_PER_S


def _raise_for(requests: pd.DataFrame, bad: np.ndarray, reason: str) -> None:
    if bad.any():
        ids = requests["request_id"].to_numpy()[bad]
        raise InvalidTimelineError(reason, [str(i) for i in ids])


def validate_request_timelines(requests: pd.DataFrame) -> None:
    """Reject impossible request rows: negative offsets or offsets out of timeline order."""
    offsets = {c: _offset_s(requests, c) for c in (*_ORDERED_OFFSETS, *OUTPUT_KIND_OFFSETS)}
    for column, values in offsets.items():
        _raise_for(requests, values < 0, f"{column} is negative ({column} is an offset from send)")
    for i, early in enumerate(_ORDERED_OFFSETS):
        for late in _ORDERED_OFFSETS[i + 1 :]:
            bad = offsets[early] > offsets[late]  # NaN compares False: missing is not an error
            _raise_for(requests, bad, f"{late} precedes {early}")
    first, last = offsets["first_token_ns"], offsets["last_token_ns"]
    for column in OUTPUT_KIND_OFFSETS:  # each kind of output begins within the output
        _raise_for(requests, offsets[column] < first, f"{column} precedes first_token_ns")
        _raise_for(requests, offsets[column] > last, f"{column} follows last_token_ns")
    if "output_tokens" in requests:
        tokens = pd.to_numeric(requests["output_tokens"], errors="coerce").to_numpy(np.float64)
        _raise_for(requests, tokens < 0, "output_tokens is negative")


def _group_starts(request: np.ndarray) -> np.ndarray:
    """True where a row starts a new request in a request-sorted array."""
    first = np.ones(len(request), dtype=bool)
    first[1:] = request[1:] != request[:-1]
    return first


def _per_request_max(ridx: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Each request's largest value (`ridx` sorted, as _sorted_chunks gives); NaN for none."""
    out = np.full(n, np.nan)
    if len(ridx):
        starts = np.flatnonzero(_group_starts(ridx))
        out[ridx[starts]] = np.maximum.reduceat(values, starts)
    return out


def _per_request_mean(samples: Samples, n: int) -> np.ndarray:
    total = np.bincount(samples.request, weights=samples.value_s * samples.weight, minlength=n)
    count = np.bincount(samples.request, weights=samples.weight, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _sorted_chunks(
    requests: pd.DataFrame, chunks: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Chunk (request row, offset s, tokens) sorted by request then seq; validated."""
    ridx = chunk_request_index(requests["request_id"], chunks["request_id"])
    known = ridx >= 0
    orphans = int((~known).sum())
    ridx = ridx[known]
    seq = chunks["seq"].to_numpy(np.int64)[known]
    offset = chunks["offset_ns"].to_numpy(np.float64)[known] / NS_PER_S
    tokens = chunks["tokens"].to_numpy(np.float64)[known]
    order = np.lexsort((seq, ridx))
    ridx, seq, offset, tokens = ridx[order], seq[order], offset[order], tokens[order]

    def fail(bad: np.ndarray, reason: str) -> None:
        if bad.any():
            ids = requests["request_id"].to_numpy()[np.unique(ridx[bad])]
            raise InvalidTimelineError(reason, [str(i) for i in ids])

    fail(offset < 0, "a chunk offset_ns is negative")
    fail(tokens < 0, "a chunk has a negative token count")
    starts = _group_starts(ridx)
    same = ~starts
    fail(same & (np.diff(seq, prepend=0) == 0), "two chunks share one seq number")
    fail(same & (np.diff(offset, prepend=0.0) < 0), "tokens out of order (chunk offsets decrease)")
    end = _offset_s(requests, "end_ns")[ridx]
    fail(offset > end, "a chunk arrives after the end of the response")
    return ridx, offset, tokens, orphans


def _interval_samples(ridx: np.ndarray, offset: np.ndarray, tokens: np.ndarray | None) -> Samples:
    """ICL samples (tokens None) or per-token ITL samples (tokens given, all > 0)."""
    starts = _group_starts(ridx)
    delta = np.diff(offset, prepend=0.0)
    if tokens is None:
        keep = ~starts
        return Samples(ridx[keep], delta[keep], np.ones(int(keep.sum())))
    value = np.where(starts, 0.0, delta / tokens)
    weight = np.where(starts, tokens - 1.0, tokens)
    keep = weight > 0
    return Samples(ridx[keep], value[keep], weight[keep])


PER_REQUEST_METRICS: Final = ("ttfe_s", "ttft_s", "ttfo_s", "ttfr_s", "tpot_s", "e2e_s",
                               "itl_mean_s", "icl_mean_s", "output_tokens_per_s",
                               "answer_tokens", "chunk_count", "chunk_tokens", "token_events",
                               "multi_token_events", "max_event_tokens")  # fmt: skip
"""The per-request metric columns, in order."""


def request_timing(requests: pd.DataFrame) -> pd.DataFrame:
    """The metrics a request row holds alone: TTFE, TTFT, TTFO, TTFR, TPOT, E2E, output rate,
    the answer's tokens (output less reasoning) (validated:
    InvalidTimelineError)."""
    validate_request_timelines(requests)
    first_token = _offset_s(requests, "first_token_ns")
    last_token = _offset_s(requests, "last_token_ns")
    end = _offset_s(requests, "end_ns")
    out = pd.to_numeric(requests["output_tokens"], errors="coerce").to_numpy(np.float64)
    reasoning = (
        pd.to_numeric(requests["reasoning_tokens"], errors="coerce").to_numpy(np.float64)
        if "reasoning_tokens" in requests
        else np.full(len(requests), np.nan)
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out >= 2, (last_token - first_token) / (out - 1), np.nan)
        rate = np.where((out >= 0) & (end > 0), out / end, np.nan)
    return pd.DataFrame(
        {"ttfe_s": _offset_s(requests, "first_event_ns"), "ttft_s": first_token,
         "ttfo_s": _offset_s(requests, "first_answer_ns"),
         "ttfr_s": _offset_s(requests, "first_reasoning_ns"),
         "tpot_s": tpot, "e2e_s": end, "output_tokens_per_s": rate,
         "answer_tokens": out - reasoning},
        index=requests.index,
    )  # fmt: skip


def with_chunk_metrics(timing: pd.DataFrame, chunk_metrics: pd.DataFrame) -> pd.DataFrame:
    """The per-request metrics in PER_REQUEST_METRICS order, from both halves."""
    both = pd.concat([timing, chunk_metrics], axis=1)
    return both[list(PER_REQUEST_METRICS)]


def compute_request_metrics(requests: pd.DataFrame, chunks: pd.DataFrame) -> RequestMetrics:
    """TTFE, TTFT, TPOT, E2E, mean ITL/ICL and output rate for every request row.

    `requests` needs request_id and the *_ns offset columns of schema v1 (output_tokens too);
    `chunks` needs request_id, seq, offset_ns and tokens. Raises InvalidTimelineError.
    """
    timing = request_timing(requests)
    n = len(requests)
    ridx, offset, tokens, orphans = _sorted_chunks(requests, chunks)
    icl = _interval_samples(ridx, offset, None)
    has_tokens = tokens > 0
    itl = _interval_samples(ridx[has_tokens], offset[has_tokens], tokens[has_tokens])
    from_chunks = pd.DataFrame(
        {
            "itl_mean_s": _per_request_mean(itl, n),
            "icl_mean_s": _per_request_mean(icl, n),
            "chunk_count": np.bincount(ridx, minlength=n),
            "chunk_tokens": np.bincount(ridx, weights=tokens, minlength=n),
            # tokens per event (speculative decoding sends several): events with any, with
            # more than one, and the most one event carried
            "token_events": np.bincount(ridx[has_tokens], minlength=n),
            "multi_token_events": np.bincount(ridx[tokens > 1], minlength=n),
            "max_event_tokens": _per_request_max(ridx, tokens, n),
        },
        index=requests.index,
    )
    per_request = with_chunk_metrics(timing, from_chunks)
    return RequestMetrics(per_request=per_request, itl=itl, icl=icl, orphan_chunks=orphans)
