"""Which level runs next: the fixed staircase, or a capacity search under an SLO.

`FixedLevels` runs `--steps` / `--rates` in order. `CapacitySearch` (`--search`) runs the
same levels as a coarse staircase until a level misses the SLO, then bisects between the
last level that met it and the first that missed it, until the two are within
`--search-precision` of each other (a concurrency search also stops at a gap of one user),
all in one run. Each level is one step; the master judges it when the step ends, on the
live statistics of the step (locustfiles/live/stats.py: every finished request of the step that
the workers have reported, 1% relative accuracy, the warmup included). The report
recomputes each verdict exactly from the events and flags any that differ.

A search ends with a status:
- `found`: a level that met the SLO and one that missed it, within the precision: the
  result is the former;
- `all_passed`: the highest coarse level met the SLO (capacity is above it);
- `lowest_failed`: the first level missed it (the locust process exits 3);
- `stopped`: the run ended before the search did.

With `--stop-when overloaded` (locustfiles/master/overload.py) each step is also checked
against the overload rule: the server rejected or timed out too many requests, or its
throughput stopped growing while TTFT p50 grew. `FixedLevels` then ends the run after the
step that tripped it, the levels left skipped. `CapacitySearch` checks its coarse levels
only, and only a level that met the SLO after an earlier one did (a missed SLO ends the
coarse phase anyway; with no passing level there is nothing to bisect from): such a level
ends the coarse phase as an upper bound, as a missed level would, and the search bisects
between the last level that met the SLO unsaturated and it, judging the probes by the SLO
alone. It is not counted as meeting the SLO: a level past saturation may still meet a loose
SLO, but it only adds queueing, and the search's result is the highest level below it that
met the SLO. Either way `stopped` (the manifest's `stopped`) says after which step, why,
and which levels were skipped.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Final, Protocol

from analysis.kernel.percentiles import PERCENTILES
from analysis.kernel.slo import Slo, parse_slo
from locustfiles.master.overload import OverloadRule, StepFigures, step_figures

log = logging.getLogger("llmload.search")

MAX_BISECTIONS: Final = 12
"""Bisection probes at most (a precision of 0.05 over a doubling needs 5)."""

MAX_STRETCH: Final = 4.0
"""A search level runs at most this many times --step-duration waiting for its requests."""


class StepStats(Protocol):
    """What the search reads of a step's live statistics (live.GroupStats)."""

    sketches: dict[str, Any]
    output_tokens: int  # the overload rule's throughput (overload.py)

    @property
    def valid_share(self) -> float | None: ...  # of the answers checked, the valid ones

    def count(self, status: str) -> int: ...

    def errors(self) -> dict[str, int]: ...  # failed requests by error kind


class FixedLevels:
    """The staircase as given: every level once, in order."""

    status: str | None = None
    last_failed = False  # the level just judged missed the SLO
    _stopped_words = "stopped after"  # the log line of the overload rule's stop

    def __init__(self, levels: tuple[float, ...], stop_rule: OverloadRule | None = None,
                 mode: str = "concurrency") -> None:  # fmt: skip
        self.levels = levels
        self.mode = mode  # concurrency | rate
        self.stop_rule = stop_rule  # --stop-when overloaded; None: never
        self.stopped: dict[str, Any] | None = None  # the manifest's `stopped`
        self._figures: list[StepFigures] = []  # the steps the rule has seen

    def first(self) -> float:
        return self.levels[0]

    def next_level(self, index: int, stats: StepStats | None, requests: int,
                   elapsed_s: float | None = None) -> float | None:  # fmt: skip
        """The level of step `index + 1` once step `index` ended (None: the run is done).
        `elapsed_s`: how long the step ran (the overload rule's throughput)."""
        if index + 1 >= len(self.levels):
            return None
        reason = self._overload(index, self.levels[index], stats, elapsed_s)
        if reason is not None:
            self._stop(index, self.levels[index], reason, self.levels[index + 1 :])
            return None
        return self.levels[index + 1]

    def _overload(self, index: int, level: float, stats: StepStats | None,
                  elapsed_s: float | None) -> str | None:  # fmt: skip
        """Why step `index` trips the overload rule (None: it does not, or no rule)."""
        if self.stop_rule is None:
            return None
        figures = step_figures(index, level, stats, elapsed_s)
        earlier = self._figures
        self._figures = [*earlier, figures]
        return self.stop_rule.verdict(figures, earlier)

    def _stop(self, index: int, level: float, reason: str, skipped: tuple[float, ...]) -> None:
        """Record that the rule skipped `skipped` after step `index` (the manifest's `stopped`)."""
        assert self.stop_rule is not None
        self.stopped = {
            "after_step": index,
            "level": _plain(level),
            "reason": reason,
            "skipped_levels": [_plain(x) for x in skipped],
            "rule": self.stop_rule.to_dict(),
        }
        log.warning("llmload: %s step %d (%s): %s; skipped levels %s", self._stopped_words, index,
                    self._text(level), reason, ", ".join(f"{x:g}" for x in skipped))  # fmt: skip

    def _text(self, level: float) -> str:
        return f"concurrency {level:g}" if self.mode == "concurrency" else f"{level:g} requests/s"

    def stop(self) -> None:
        """The run ended (finished or stopped early)."""

    def to_dict(self) -> dict[str, Any] | None:
        return None


def judge(slo: Slo, stats: StepStats | None) -> tuple[bool, list[str], dict[str, float | None]]:
    """A step's live verdict: (passed, failures as the report words them, values used)."""
    values: dict[str, float | None] = {}
    for objective in slo.objectives:
        values[objective.column] = _value(objective.column, stats)
    failures = slo.failures(values)
    return not failures, failures, values


def _value(column: str, stats: StepStats | None) -> float | None:
    if stats is None:
        return None
    if column == "error_rate":
        ok, failed = stats.count("ok"), stats.count("error")
        return failed / (ok + failed) if ok + failed else None
    if column == "valid_share":
        return stats.valid_share
    metric, stat, _unit = column.rsplit("_", 2)
    sketch = stats.sketches.get(metric)
    if sketch is None or sketch.count <= 0:
        return None
    if stat == "mean":
        return float(sketch.sum / sketch.count)
    q = 1.0 if stat == "max" else PERCENTILES[stat]
    value = sketch.quantile(q)
    return None if value is None else float(value)


class CapacitySearch(FixedLevels):
    """Coarse staircase until the SLO fails, then bisection (see the module docstring)."""

    _stopped_words = "capacity search: the coarse phase stopped after"

    def __init__(self, levels: tuple[float, ...], mode: str, spec: str, precision: float,
                 min_requests: int, stop_rule: OverloadRule | None = None) -> None:  # fmt: skip
        super().__init__(levels, stop_rule, mode)
        self.spec = spec
        self.slo = parse_slo(spec)
        self.precision = precision
        self.min_requests = min_requests
        self.probes: list[dict[str, Any]] = []
        self.status: str | None = "running"
        self.passed: float | None = None  # highest level that met the SLO
        self.passed_step: int | None = None
        self.failed: float | None = None  # lowest level that missed it
        self._coarse = 0  # index into levels while coarse
        self._bisections = 0
        self._current: float = levels[0]

    def first(self) -> float:
        self._current = self.levels[0]
        return self._current

    def next_level(self, index: int, stats: StepStats | None, requests: int,
                   elapsed_s: float | None = None) -> float | None:  # fmt: skip
        passed, failures, values = judge(self.slo, stats)
        level = self._current
        phase = "coarse" if self.failed is None else "bisect"
        saturated = None  # the overload rule ends the coarse phase here (module docstring)
        if phase == "coarse":
            reason = self._overload(index, level, stats, elapsed_s)
            if (
                reason
                and passed
                and self.passed is not None
                and self._coarse + 1 < len(self.levels)
            ):
                saturated = reason
        self.last_failed = not passed or saturated is not None
        probe = {
            "step": index, "level": level, "phase": phase, "passed": passed,
            "requests": requests, "few_requests": requests < self.min_requests,
            "failures": failures, "values": values,
        }  # fmt: skip
        if saturated is not None:
            probe["overloaded"] = saturated
        self.probes.append(probe)
        log.info("llmload: capacity search: step %d at %s %s the SLO%s (%d requests)", index,
                 self._text(level), "met" if passed else "missed",
                 "" if passed else ": " + "; ".join(failures), requests)  # fmt: skip
        if saturated is not None:
            self.failed = level
            self._stop(index, level, saturated, self.levels[self._coarse + 1 :])
            return self._bisect()
        if passed and (self.passed is None or level > self.passed):
            self.passed, self.passed_step = level, index
        if not passed and (self.failed is None or level < self.failed):
            self.failed = level
        if phase == "coarse":
            if not passed:
                if self.passed is None:
                    return self._end("lowest_failed")
            elif self._coarse + 1 < len(self.levels):
                self._coarse += 1
                self._current = self.levels[self._coarse]
                return self._current
            else:
                return self._end("all_passed")
        return self._bisect()

    def _bisect(self) -> float | None:
        low, high = self.passed, self.failed
        assert low is not None and high is not None
        if self._close(low, high) or self._bisections >= MAX_BISECTIONS:
            return self._end("found")
        mid = (low + high) / 2
        mid = float(math.floor(mid)) if self.mode == "concurrency" else _round(mid)
        if not low < mid < high:
            return self._end("found")
        self._bisections += 1
        self._current = mid
        return mid

    def _close(self, low: float, high: float) -> bool:
        if self.mode == "concurrency" and high - low <= 1:
            return True
        return high - low <= self.precision * low

    def _end(self, status: str) -> float | None:
        """The search is over: no next level."""
        self.status = status
        best = "none" if self.passed is None else self._text(self.passed)
        log.info("llmload: capacity search %s: highest level meeting the SLO: %s", status, best)
        return None

    def _level(self, level: float) -> float | int:
        """A level as the manifest gives it: users are whole numbers."""
        return int(level) if self.mode == "concurrency" else level

    def stop(self) -> None:
        if self.status == "running":
            self.status = "stopped"

    def to_dict(self) -> dict[str, Any] | None:
        result = None
        if self.passed is not None:
            result = {"level": self._level(self.passed), "step": self.passed_step}
        return {
            "mode": self.mode,
            "slo": self.spec,
            "precision": self.precision,
            "min_requests": self.min_requests,
            "status": self.status,
            "probes": [{**p, "level": self._level(p["level"])} for p in self.probes],
            "result": result,
        }


def _round(rate: float) -> float:
    """A bisected rate to 3 significant digits (readable levels, still strictly between)."""
    if rate <= 0:
        return rate
    digits = 3 - int(math.floor(math.log10(rate))) - 1
    return round(rate, max(digits, 0) if rate >= 1 else digits)


def _plain(level: float) -> float | int:
    """A level as the manifest gives it: whole numbers as integers."""
    return int(level) if float(level).is_integer() else level


def stop_rule_for(options: Any) -> OverloadRule | None:
    """The overload rule of --stop-when and its thresholds (None: never stop early)."""
    if options.stop_when != "overloaded":
        return None
    return OverloadRule(options.stop_ttft_factor, options.stop_min_growth,
                        options.stop_overload_rate)  # fmt: skip


def plan_for(options: Any) -> FixedLevels:
    """The plan of a run's options (ChatOptions)."""
    rule = stop_rule_for(options)
    if options.search == "off":
        return FixedLevels(options.levels, rule, options.mode)
    return CapacitySearch(options.levels, options.mode, options.slo, options.search_precision,
                          options.search_min_requests, rule)  # fmt: skip
