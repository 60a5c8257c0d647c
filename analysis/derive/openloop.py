"""Open-loop (rate) steps: did the generator keep to the arrival schedule?

A rate step sends arrivals on a schedule whatever the server does. Per sent request:

- send slip = `sent_at_ns − intended_ns − queued_ns`: how late the generator itself sent
  (the wait for a cap slot taken out; `intended_ns` is on the sending worker's clock);
- cap wait = `queued_ns`: how long the arrival waited for a slot under `--max-concurrency`.

Per step (docs/metrics.md, "Open loop"): slip p50/p99/max, requests that waited and the p99
wait, and warnings when the slip p99 exceeds SLIP_WARN_MS or the achieved rate falls more
than RATE_SHORTFALL under the intended one (naming the cause). Dropped arrivals (never sent)
have neither slip nor wait.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.derive.parts import GroupView, Part, RowPart, RunView
from analysis.derive.stats import SortedSamples

SLIP_WARN_MS: Final = 10.0
"""A rate step whose send slip p99 exceeds this earns a warning: the generator, not the
server, limited the arrival schedule."""

RATE_SHORTFALL: Final = 0.05
"""A rate step whose achieved send rate is more than this fraction under its intended rate
earns a warning naming the cause."""

NS_PER_MS: Final = 1_000_000


def _exact_ns(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer ns column as exact int64 values (0 where missing) and a presence mask."""
    if column not in frame:
        return np.zeros(len(frame), np.int64), np.zeros(len(frame), bool)
    values = frame[column]
    present = values.notna().to_numpy(bool)
    return values.to_numpy(np.int64, na_value=0), present


def slip_and_queue_ms(requests: pd.DataFrame, dropped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per request: send slip (sent_at_ns − intended_ns − queued_ns) and cap wait (queued_ns),
    both in ms; NaN for dropped arrivals and rows without a schedule (concurrency steps, 1.1).

    Computed in int64 ns (intended and sent are one worker's wall clock), then made ms.
    """
    slip = np.full(len(requests), np.nan)
    queued_ms = np.full(len(requests), np.nan)
    intended, has_intended = _exact_ns(requests, "intended_ns")
    queued, has_queued = _exact_ns(requests, "queued_ns")
    sent = requests["sent_at_ns"].to_numpy(np.int64)
    have = has_intended & has_queued & ~dropped
    slip[have] = (sent[have] - intended[have] - queued[have]) / NS_PER_MS
    waited = has_queued & ~dropped
    queued_ms[waited] = queued[waited] / NS_PER_MS
    return slip, queued_ms


def open_loop_columns(
    slip_ms: np.ndarray, queued_ms: np.ndarray, members: np.ndarray, *, open_loop: bool
) -> dict[str, Any]:
    """A group's summary columns of send slip and cap waits, over its sent requests
    `members` (per-request arrays from slip_and_queue_ms); missing unless `open_loop`."""
    slip = SortedSamples.of(slip_ms[members] if open_loop else np.empty(0))
    queued = queued_ms[members] if open_loop else np.empty(0)
    p50, p99 = (float(v) for v in slip.quantiles([0.50, 0.99]))
    return {
        "slip_p50_ms": p50,
        "slip_p99_ms": p99,
        "slip_max_ms": float(slip.values[-1]) if len(slip.values) else float("nan"),
        "requests_queued": int((queued > 0).sum()) if open_loop else None,
        "queued_p99_ms": float(SortedSamples.of(queued).quantiles([0.99])[0]),
    }


def _rate_text(rate: float) -> str:
    return f"{rate:g}"


def open_loop_warnings(row: Mapping[str, Any]) -> list[str]:
    """A rate step the generator could not keep to, or that sent well under its rate."""
    if row.get("mode") != "rate" or row.get("rate") is None:
        return []
    name = f"step {row['step']} (rate {_rate_text(row['rate'])}/s)"
    out = []
    slip_p99 = row["slip_p99_ms"]
    slipped = slip_p99 == slip_p99 and slip_p99 > SLIP_WARN_MS
    if slipped:
        out.append(
            f"{name}: send slip p99 {slip_p99:.3g} ms > {SLIP_WARN_MS:g} ms: the load generator, "
            "not the server, limited the arrival schedule; add workers or lower the rate"
        )
    achieved, rate = row["rate_achieved"], float(row["rate"])
    if not (achieved == achieved and achieved < (1 - RATE_SHORTFALL) * rate):
        return out
    causes = []
    if row["requests_dropped"]:
        causes.append(
            f"{row['requests_dropped']} arrival(s) were dropped at the concurrency cap "
            f"(--max-concurrency {row['concurrency']}, --over-cap drop)"
        )
    if row["requests_queued"]:
        causes.append(
            f"{row['requests_queued']} request(s) waited for a cap slot (queued p99 "
            f"{row['queued_p99_ms']:.3g} ms, --max-concurrency {row['concurrency']}): the "
            "server did not finish requests as fast as they arrived"
        )
    if slipped:
        causes.append(f"the generator sent late (slip p99 {slip_p99:.3g} ms)")
    if not causes:
        expected = rate * float(row["window_s"])
        spread = 1 / math.sqrt(expected) if expected > 0 else float("nan")
        if 1 - achieved / rate <= 3 * spread:  # within chance for a Poisson count: no warning
            return out
        causes.append(
            "no drops, cap waits or slip: a random arrival schedule puts fewer arrivals in "
            f"some windows (about ±{spread:.0%} at {expected:.0f} expected arrivals); a longer "
            "step evens it out"
        )
    out.append(
        f"{name}: achieved {achieved:.3g} requests/s, {1 - achieved / rate:.1%} under the "
        f"intended rate: {'; '.join(causes)}"
    )
    return out


@dataclass(frozen=True)
class OpenLoop(Part):
    """The open loop's part of the summary rows: slip and cap waits, per request and per row."""

    slip_ms: np.ndarray
    queued_ms: np.ndarray

    @classmethod
    def make(cls, view: RunView) -> OpenLoop:
        return cls(*slip_and_queue_ms(view.run.requests, view.dropped))

    def columns(self, group: GroupView) -> dict[str, Any]:
        return open_loop_columns(self.slip_ms, self.queued_ms, group.members,
                                 open_loop=group.rate_step)  # fmt: skip

    def warnings(self, name: str, row: Mapping[str, Any], group: GroupView) -> list[str]:
        return open_loop_warnings(row)

    def per_request(self) -> dict[str, np.ndarray]:
        return {"slip_ms": self.slip_ms}


ROW_PART: Final = RowPart("open loop", OpenLoop.make)
