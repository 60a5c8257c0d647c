"""The request path, end to end: where each request's time went, client and engine joined.

The client times its own side (schema 1.4: the decision to send, the connection, the write,
the first token, the end); an engine that traces (vLLM `--otlp-traces-endpoint`, the
simulator's) times its side in one `llm_request` span per request, in the request's trace
(analysis/kernel/spans.py). Joined by trace id (falling back to `gen_ai.request.id`), a request's
time splits into parts, each the time between two instants on one timeline (docs/metrics.md,
"The request path"):

    decided ─ client delay (connect inside) ─▶ write ─ network up ─▶ span start
      ─ server other (ingress, template, tokenise, schedule) ─ queue ─ prefill ─▶ server
      first token ─┬─ first-token delivery ─▶ client first token    (TTFT from the write)
                   └─ decode ─▶ server last token ─ tail ─▶ client end   (E2E from the write)

network up + server other + queue + prefill + first-token delivery = the client's TTFT, and
network up + server other + queue + prefill + decode + tail = its E2E, per request, by
construction: what is measured independently is where the boundaries fall. The first token
travels while the server decodes the next ones, so first-token delivery and decode run side
by side, and the tail is the last token's delivery (with the stream's end): from the
server's last token to the client's end of the body. (Before, the tail was E2E - TTFT -
decode: the last token's delivery minus the first's, negative whenever the first token took
the longer way; against vLLM on a quiet machine 55 of 125 requests at concurrency 1.)
The server's decode is its first to last token on the clock its TTFT and E2E are taken on
(`e2e - ttft` of the span; vLLM's `time_in_model_decode` is its engine core's, whose first
token is earlier by the trip to the API server), else the span's decode time. The span's
times are on the server's clock, taken to be the master's (as the step windows are); the
worker's are aligned to the master's first (analysis/read/clocks.py), so a skewed server
clock shows as a negative network or delivery part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.derive.parts import GroupView, Part, RowPart, RunView
from analysis.derive.sessions import float_column
from analysis.derive.stats import SortedSamples
from analysis.kernel.spans import REQUEST_SPAN, trace_id_of

NS_PER_S: Final = 1e9

PARTS: Final = (
    "network_up",
    "server_other",
    "server_queue",
    "server_prefill",
    "first_token_delivery",
    "server_decode",
    "tail",
)
"""The parts of a request's time after its write, in path order. Per request `<part>_s`; per
step `<part>_{mean,p50,p99}_s`."""

TTFT_PARTS: Final = PARTS[:5]
"""The parts that add up to the client's TTFT."""

E2E_PARTS: Final = (*PARTS[:4], "server_decode", "tail")
"""The parts that add up to the client's E2E (first-token delivery runs beside decode)."""

CLIENT_DELAY_WARN_MS: Final = 5.0
"""A step whose client delay p99 (decided to send -> bytes written) is above this earns a
warning: the client, not the server, held those requests back before they left."""

PER_REQUEST_COLUMNS: Final = ("span", *(f"{p}_s" for p in PARTS))
"""Columns of requests.parquet the join adds (after the 1.4 client columns)."""


@dataclass(frozen=True)
class RequestPath:
    """Per request row: whether its engine span was found, and each part in seconds (NaN
    without a span, or when the request has no first token or end)."""

    span: np.ndarray  # bool
    parts: dict[str, np.ndarray]  # part -> float64 seconds
    client_delay_ms: np.ndarray  # NaN when not recorded (before 1.4, or never written)
    connect_ms: np.ndarray  # NaN unless the request opened a new connection
    connect_new: np.ndarray  # bool: it opened a new connection
    spans_found: bool  # the run has spans at all

    def frame(self) -> pd.DataFrame:
        out = pd.DataFrame({"span": self.span})
        for part in PARTS:
            out[f"{part}_s"] = self.parts[part]
        return out


def request_spans(spans: pd.DataFrame | None) -> pd.DataFrame | None:
    """The spans that time one request (vLLM's `llm_request`, or any span with a TTFT
    attribute), the earliest first where a trace holds several."""
    if spans is None or spans.empty:
        return None
    mine = spans[(spans["name"] == REQUEST_SPAN) | spans["ttft_s"].notna()]
    return mine.sort_values("start_ns", kind="stable") if len(mine) else None


def _join(requests: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Row position in `spans` of each request's span; -1 where there is none. By trace id
    first, then by `gen_ai.request.id` (vLLM's is `chatcmpl-<X-Request-Id>`)."""
    ids = requests["request_id"].astype(str).tolist()
    by_trace = pd.Index(spans["trace_id"].astype(str)).drop_duplicates(keep="first")
    first_of_trace = ~spans["trace_id"].astype(str).duplicated(keep="first").to_numpy()
    positions = np.flatnonzero(first_of_trace)
    found = by_trace.get_indexer([trace_id_of(i) for i in ids])
    where = np.where(found >= 0, positions[np.maximum(found, 0)], -1)
    named = spans["server_request_id"].astype("string")
    if named.notna().any() and (where < 0).any():
        first_named = ~named.duplicated(keep="first").to_numpy() & named.notna().to_numpy()
        index = pd.Index(named[first_named].astype(str))
        rows = np.flatnonzero(first_named)
        server_ids = requests.get("server_request_id")
        for candidates in (
            [f"chatcmpl-{i}" for i in ids],
            ids,
            server_ids.astype(str).tolist() if server_ids is not None else None,
        ):
            if candidates is None:
                continue
            hit = index.get_indexer(candidates)
            fill = (where < 0) & (hit >= 0)
            where[fill] = rows[hit[fill]]
    return where


def request_path(
    requests: pd.DataFrame,
    sent_ns: np.ndarray,
    ttft_s: np.ndarray,
    e2e_s: np.ndarray,
    spans: pd.DataFrame | None,
) -> RequestPath:
    """Each request's path: `sent_ns` its write on the master's clock (aligned), `ttft_s` and
    `e2e_s` its client times from the write; `spans` the run's span rows (None: none)."""
    n = len(requests)
    delay = float_column(requests, "client_delay_ns") / 1e6
    new = (
        requests["connect_new"].astype("boolean").fillna(False).to_numpy(bool)
        if "connect_new" in requests
        else np.zeros(n, bool)
    )
    connect = np.where(new, float_column(requests, "connect_ns") / 1e6, np.nan)
    parts = {p: np.full(n, np.nan) for p in PARTS}
    timed = request_spans(spans)
    if timed is None or n == 0:
        return RequestPath(np.zeros(n, bool), parts, delay, connect, new, timed is not None)
    where = _join(requests, timed)
    have = where >= 0
    pick = np.maximum(where, 0)

    def col(name: str) -> np.ndarray:
        return np.where(have, float_column(timed, name)[pick], np.nan)

    start = np.where(have, timed["start_ns"].to_numpy(np.int64)[pick], 0)
    network_up = np.where(have, (start - sent_ns) / NS_PER_S, np.nan)
    queue, prefill, server_ttft = col("queue_s"), col("prefill_s"), col("ttft_s")
    server_e2e = col("e2e_s")
    parts["network_up"] = network_up
    parts["server_queue"] = queue
    parts["server_prefill"] = prefill
    parts["server_other"] = server_ttft - np.nan_to_num(queue) - np.nan_to_num(prefill)
    parts["first_token_delivery"] = ttft_s - network_up - server_ttft
    decode = server_e2e - server_ttft  # the span's decode time where it has no e2e or ttft
    decode = np.where(np.isnan(decode), col("decode_s"), decode)  # (as the SQL's coalesce)
    parts["server_decode"] = decode
    parts["tail"] = e2e_s - network_up - server_ttft - decode
    return RequestPath(have, parts, delay, connect, new, True)


def _stats(values: np.ndarray) -> tuple[float, float, float]:
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan"), float("nan"), float("nan")
    p50, p99 = (float(v) for v in SortedSamples.of(values).quantiles([0.50, 0.99]))
    return float(values.mean()), p50, p99


def path_columns(path: RequestPath, members: np.ndarray, ok: np.ndarray) -> dict[str, Any]:
    """A group's columns: the client's delay and connects over its sent requests `members`,
    each part's mean, p50 and p99 over its successful requests with a span, and the share of
    its successful requests that had one (NaN when the run has no spans)."""
    out: dict[str, Any] = {}
    _, p50, p99 = _stats(path.client_delay_ms[members])
    out["client_delay_p50_ms"], out["client_delay_p99_ms"] = p50, p99
    out["connections_new"] = int((members & path.connect_new).sum())
    _, p50, p99 = _stats(path.connect_ms[members])
    out["connect_p50_ms"], out["connect_p99_ms"] = p50, p99
    latency = members & ok
    spanned = latency & path.span
    total = int(latency.sum())
    out["span_share"] = float(spanned.sum()) / total if path.spans_found and total else float("nan")
    for part in PARTS:
        mean, p50, p99 = _stats(path.parts[part][spanned])
        out[f"{part}_mean_s"], out[f"{part}_p50_s"], out[f"{part}_p99_s"] = mean, p50, p99
    return out


def path_warnings(name: str, row: Mapping[str, Any]) -> list[str]:
    """The client's own delay, where large; requests without their engine span."""
    out = []
    p99 = row.get("client_delay_p99_ms")
    if p99 is not None and p99 == p99 and p99 > CLIENT_DELAY_WARN_MS:
        out.append(
            f"{name}: the client took {p99:.1f} ms (p99) from deciding to send to writing the "
            f"request ({row.get('connections_new', 0)} new connection(s), connect p99 "
            f"{row.get('connect_p99_ms', float('nan')):.1f} ms): a delay of the client's, not "
            "counted in TTFT or E2E; reuse connections (a longer run, fewer users per worker) "
            "or add workers"
        )
    share = row.get("span_share")
    if share is not None and share == share and share < 1.0 and row.get("ok"):
        missing = round((1.0 - share) * row["ok"])
        out.append(
            f"{name}: {missing} of {row['ok']} successful request(s) have no engine span (the "
            "engine's exporter dropped or has not yet sent them: raise --otlp-linger, or "
            "import the collector's file with `llmload spans import`); the request path "
            "covers the others"
        )
    return out


@dataclass(frozen=True)
class PathPart(Part):
    """The request path's part of the summary rows (its per-request columns too)."""

    path: RequestPath

    @classmethod
    def make(cls, view: RunView) -> PathPart:
        return cls(request_path(view.run.requests, view.sent, view.ttft_s, view.e2e_s,
                                view.run.spans))  # fmt: skip

    def columns(self, group: GroupView) -> dict[str, Any]:
        return path_columns(self.path, group.members, group.ok)

    def warnings(self, name: str, row: Mapping[str, Any], group: GroupView) -> list[str]:
        return path_warnings(name, row)

    def per_request(self) -> dict[str, np.ndarray]:
        return {column: values.to_numpy() for column, values in self.path.frame().items()}


ROW_PART: Final = RowPart("request path", PathPart.make)
