"""Speculative decoding per step, from the server's own counters (its `/metrics`).

A server that decodes speculatively drafts tokens and keeps those its model accepts. Each
output event then carries several tokens: the report's tokens per event show it from the
client's side (analysis/steps/aggregate.py `event_token_columns`). The server counts the
work itself; vLLM's counters are `vllm:spec_decode_num_drafts_total`,
`..._num_draft_tokens_total` and `..._num_accepted_tokens_total`, which the master scrapes
(locustfiles/master/server_metrics.py) and `llmload sim --spec-draft-tokens` exports too.

Per step, each counter's growth over the step's steady window is read between the scrapes
around the window's start and end, interpolated linearly to the window's bounds (scrapes
are some seconds apart). The counters are the server's, so they count all of its traffic in
the window: this run's requests, and any other client's.

- `spec_draft_tokens`, `spec_accepted_tokens`: the tokens drafted and accepted in the window;
- `spec_acceptance_rate = accepted / draft tokens` (vLLM's definition);
- `spec_acceptance_length = 1 + accepted / drafts`: the tokens one decode step emits, on
  average (the target model's own token plus the accepted drafts).

All are NaN where the server exported none of it, or the window is not covered by scrapes.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from analysis.read.server_metrics import COUNTERS, ServerMetrics

SPEC_COLUMNS: Final = ("spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance_rate",
                       "spec_acceptance_length")  # fmt: skip


def value_at(t: np.ndarray, v: np.ndarray, when: float) -> float:
    """A scraped series at `when`, interpolated linearly between the scrapes around it (NaN
    outside them); `t` ascending. The energy counters read it too (derive/energy.py)."""
    if len(t) == 0 or when < t[0] or when > t[-1]:
        return float("nan")
    return float(np.interp(when, t, v))


def speculation_columns(metrics: ServerMetrics | None, row: dict[str, Any]) -> dict[str, float]:
    """One summary row's speculative-decoding columns, over its window."""
    nan = float("nan")
    out = dict.fromkeys(SPEC_COLUMNS, nan)
    start, end = row.get("window_start_ns"), row.get("window_end_ns")
    if metrics is None or start is None or end is None:
        return out
    frame = metrics.frame
    grown: dict[str, float] = {}
    for column in COUNTERS:
        have = frame[frame["ok"] & frame[column].notna()]
        t = have["scraped_at_ns"].to_numpy(np.float64)
        v = have[column].to_numpy(np.float64)
        grown[column] = value_at(t, v, float(end)) - value_at(t, v, float(start))
    drafts, tokens, accepted = (grown["spec_drafts"], grown["spec_draft_tokens"],
                                grown["spec_accepted_tokens"])  # fmt: skip
    out["spec_draft_tokens"] = tokens
    out["spec_accepted_tokens"] = accepted
    out["spec_acceptance_rate"] = accepted / tokens if tokens > 0 else nan
    out["spec_acceptance_length"] = 1.0 + accepted / drafts if drafts > 0 else nan
    return out


def add_speculation(rows: list[dict[str, Any]], metrics: ServerMetrics | None) -> None:
    """Every summary row gains SPEC_COLUMNS (after the rest)."""
    for row in rows:
        row.update(speculation_columns(metrics, row))
