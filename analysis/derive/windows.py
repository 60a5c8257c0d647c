"""Steady-state windows of the steps, from the manifest's actual step timeline.

The steady window of a step is `[spawned_at_ns + warmup_s, ended_at_ns]` (master wall clock,
both ends included). A rate (open-loop) step has no spawn ramp: its `spawned_at_ns` is its
`started_at_ns`, the start of its arrival schedule, so the same rule holds. A step the
manifest does not time (hand-made runs, a step missing from the timeline, a step that never
ended) falls back to the span of its own requests, from the first send to the last response
end, and says so in a warning. Send times are placed on the master's clock first: each
worker's measured clock offset is taken off (analysis/read/clocks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.read.clocks import aligned_sent_ns

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class Window:
    """A closed wall-clock interval in ns since the epoch, and where it came from."""

    start_ns: int
    end_ns: int
    source: str  # "manifest", "requests" (fallback span) or "cold" (span of the cold group)

    @property
    def length_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    def contains(self, t_ns: np.ndarray) -> np.ndarray:
        return (t_ns >= self.start_ns) & (t_ns <= self.end_ns)


@dataclass(frozen=True)
class StepPlan:
    """One step: its index, target concurrency (a rate step: its cap, 0 none), steady window
    (None: empty) and, for a rate (open-loop) step, its intended arrival rate in requests/s."""

    step: int
    concurrency: int
    window: Window | None
    rate: float | None = None  # None: a concurrency (closed-loop) step

    @property
    def mode(self) -> str:
        return "concurrency" if self.rate is None else "rate"


def request_span(sent_ns: np.ndarray, done_ns: np.ndarray, source: str) -> Window | None:
    """From the first send to the last response end (or send, for unfinished requests)."""
    if len(sent_ns) == 0:
        return None
    last = np.maximum(sent_ns, np.where(done_ns >= 0, done_ns, sent_ns))
    return Window(int(sent_ns.min()), int(last.max()), source)


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class StepSeen:
    """What a step's own (non-cold) requests say of it, for a step the manifest does not
    time: their highest concurrency, their span (first send, last end or send: None without
    requests) and their highest recorded `rate` (None: none recorded)."""

    concurrency: int
    span: tuple[int, int] | None
    rate: float | None = None


def _rate(entry: dict[str, Any], seen: StepSeen | None) -> float | None:
    """The step's intended rate: the manifest's (schema 1.2), else its requests' `rate`.

    A manifest step without `rate` (a concurrency step, or a run before 1.2) whose requests
    carry none either is a concurrency step: None.
    """
    value = entry.get("rate")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return seen.rate if seen is not None else None


def steps_seen(
    requests: pd.DataFrame, done_ns: np.ndarray, sent_ns: np.ndarray
) -> dict[int, StepSeen]:
    """Each step its non-cold requests are tagged with, and what they say of it (StepSeen),
    from request rows in memory (analysis/steps/outofcore.py asks the engine the same)."""
    not_cold = ~requests["cold"].to_numpy(bool)
    step_col = requests["step"].to_numpy(np.int64)
    concurrency = requests["concurrency"].to_numpy(np.int64)
    rates = (
        pd.to_numeric(requests["rate"], errors="coerce").to_numpy(np.float64)
        if "rate" in requests
        else None
    )
    out = {}
    for step in sorted(set(np.unique(step_col[not_cold]).tolist())):
        mine = not_cold & (step_col == step)
        span = request_span(sent_ns[mine], done_ns[mine], "requests")
        rate = None
        if rates is not None:
            known = rates[mine][~np.isnan(rates[mine])]
            rate = float(known.max()) if len(known) else None
        out[int(step)] = StepSeen(
            int(concurrency[mine].max()),
            (span.start_ns, span.end_ns) if span is not None else None,
            rate,
        )
    return out


def plan_steps(
    manifest: dict[str, Any],
    requests: pd.DataFrame,
    done_ns: np.ndarray,
    sent_ns: np.ndarray | None = None,
) -> tuple[list[StepPlan], list[str]]:
    """Every step of the run (manifest timeline and steps seen in requests), with warnings.

    `sent_ns` is each request's send time on the master's clock (default: `sent_at_ns`
    corrected by its worker's clock offset, analysis/read/clocks.py); `done_ns` its wall-clock end
    on the same clock (send + `end_ns`, -1 when unknown).
    """
    sent = aligned_sent_ns(requests, manifest) if sent_ns is None else sent_ns
    return plan_from(manifest, steps_seen(requests, done_ns, sent))


def plan_from(
    manifest: dict[str, Any], seen: dict[int, StepSeen]
) -> tuple[list[StepPlan], list[str]]:
    """Every step of the run: the manifest's timeline and the steps its requests were tagged
    with (`seen`, steps_seen), with warnings."""
    warnings: list[str] = []
    timeline = {}
    for entry in manifest.get("steps") or []:
        step = _int(entry.get("step"))
        if step is not None:
            timeline[step] = entry
    plans = []
    fallback = []
    for step in sorted(set(timeline) | set(seen)):
        mine = seen.get(step)
        entry = timeline.get(step, {})
        concurrency = _int(entry.get("concurrency"))
        if concurrency is None:
            concurrency = mine.concurrency if mine is not None else 0
        spawned, ended = _int(entry.get("spawned_at_ns")), _int(entry.get("ended_at_ns"))
        warmup_ns = int(round(float(entry.get("warmup_s") or 0.0) * NS_PER_S))
        window: Window | None
        if spawned is not None and ended is not None:
            window = Window(spawned + warmup_ns, ended, "manifest")
            if window.end_ns <= window.start_ns:
                warnings.append(
                    f"step {step}: the steady window is empty (warmup {warmup_ns / NS_PER_S:g} s "
                    "outlasts the step); no latency statistics for it"
                )
                window = None
        else:
            span = mine.span if mine is not None else None
            window = Window(span[0], span[1], "requests") if span is not None else None
            if window is not None:
                fallback.append(step)
        plans.append(StepPlan(step, concurrency, window, _rate(entry, mine)))
    if fallback:
        listed = ", ".join(str(s) for s in fallback)
        warnings.append(
            f"the manifest has no step timeline for step(s) {listed}: their windows are the span "
            "of their requests (warmup and ramp included)"
        )
    return plans, warnings
