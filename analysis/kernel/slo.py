"""Service-level objectives: parse `--slo`, judge steps, mark good requests (goodput).

Syntax: comma-separated `name=value`, e.g. `ttft_p99=0.5,tpot_p50=50ms,e2e_p99=10,ttft=1,tpot=0.1`.

- `<metric>_<stat>=<limit>` is a step objective: the step's statistic must be <= limit.
  metric: ttft, ttfo, ttfr, tpot, itl, icl, e2e; stat: mean, p50, p90, p95, p99, p999, max.
  ttft is the first token of any kind; ttfo the first answer token (content or a tool call,
  after any reasoning); ttfr the first reasoning token.
- `<metric>=<limit>` is a per-request threshold (DistServe-style goodput): a request is good
  when it succeeded and meets every threshold. metric: ttft, ttfo, ttfr, tpot, itl (the
  request's mean per-token ITL), e2e. A metric a request does not have (TPOT of a one-token answer) does not
  disqualify it.
- `error_rate=<fraction>` (or `1%`) is a step objective on the step's error rate.
- `valid_share=<fraction>` (or `99%`) is a step objective the other way round: at least that
  share of the step's checked answers must be valid (`--response-format`, tool calls:
  locustfiles/request/validity.py).

Latency limits are seconds; `ms` and `s` suffixes are accepted. A step whose statistic is
missing (no successful request) fails the objective: no data is not a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from analysis.kernel.errors import UsageError
from analysis.kernel.percentiles import STATS

if TYPE_CHECKING:
    import pandas as pd

STEP_METRICS: Final = ("ttft", "ttfo", "ttfr", "tpot", "itl", "icl", "e2e")
REQUEST_METRICS: Final = {"ttft": "ttft_s", "ttfo": "ttfo_s", "ttfr": "ttfr_s", "tpot": "tpot_s",
                          "itl": "itl_mean_s", "e2e": "e2e_s"}  # fmt: skip
"""Per-request threshold name -> column of the per-request table it applies to."""

_EXAMPLE = "e.g. --slo ttft_p99=0.5,tpot_p50=0.05,e2e_p99=10,ttft=1"


def invalid_answers(requests: pd.DataFrame) -> np.ndarray | None:
    """Per request: its answer was checked and found invalid (`output_valid` false). None
    when no answer of the run was checked (no --response-format, no tool call, or a run
    written before schema 1.5): goodput then knows nothing of validity."""
    if "output_valid" not in requests:
        return None
    column = requests["output_valid"]
    checked = column.notna().to_numpy(bool)
    if not checked.any():
        return None
    valid = column.astype("boolean").fillna(True).to_numpy(bool)
    return checked & ~valid


@dataclass(frozen=True)
class Objective:
    """A step objective: `column` of the step's summary row must be <= `limit`."""

    name: str  # as written: ttft_p99, error_rate, valid_share
    column: str  # summary column: ttft_p99_s, error_rate, valid_share
    limit: float
    at_least: bool = False  # the value must be >= limit (valid_share), else <= limit


@dataclass(frozen=True)
class Threshold:
    """A per-request threshold: a good request has `column` <= `limit` (or no value)."""

    name: str  # ttft, tpot, itl, e2e
    column: str  # per-request column: ttft_s, tpot_s, itl_mean_s, e2e_s
    limit: float


@dataclass(frozen=True)
class Slo:
    objectives: tuple[Objective, ...] = ()
    thresholds: tuple[Threshold, ...] = ()
    spec: str = ""

    def __bool__(self) -> bool:
        return bool(self.objectives or self.thresholds)

    def good(
        self, per_request: pd.DataFrame, ok: np.ndarray, invalid: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Good requests: ok, with a valid answer, and within every threshold. None without
        thresholds, unless answers were checked (`invalid`: per request, an answer found
        invalid; None: none was checked): then good is ok and valid."""
        if invalid is not None:
            ok = ok & ~invalid
        if not self.thresholds:
            return ok.copy() if invalid is not None else None
        good = ok.copy()
        for t in self.thresholds:
            value = per_request[t.column].to_numpy(np.float64)
            good &= ~(value > t.limit)  # NaN (metric absent) does not disqualify
        return good

    def failures(self, row: dict[str, Any]) -> list[str]:
        """The objectives a step's summary row misses, each as `name value > limit`."""
        out = []
        for o in self.objectives:
            value = row.get(o.column)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                out.append(f"{o.name} missing (no data)")
            elif o.at_least and float(value) < o.limit:
                out.append(f"{o.name} {float(value):.4g} < {o.limit:g}")
            elif not o.at_least and float(value) > o.limit:
                out.append(f"{o.name} {float(value):.4g} > {o.limit:g}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "objectives": {o.name: o.limit for o in self.objectives},
            "request_thresholds": {t.name: t.limit for t in self.thresholds},
        }


def _number(name: str, text: str, *, rate: bool) -> float:
    raw = text.strip().lower()
    scale = 1.0
    if rate and raw.endswith("%"):
        raw, scale = raw[:-1], 0.01
    elif not rate and raw.endswith("ms"):
        raw, scale = raw[:-2], 0.001
    elif not rate and raw.endswith("s"):
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise UsageError(
            f"--slo {name}={text}: {text!r} is not a number; give seconds such as 0.5 or "
            f"500ms ({_EXAMPLE})"
        ) from None
    if not math.isfinite(value) or value < 0 or (rate and value > 1):
        bound = "a fraction between 0 and 1 (or a percentage)" if rate else "a positive duration"
        raise UsageError(f"--slo {name}={text}: the limit must be {bound} ({_EXAMPLE})")
    return value


def parse_slo(spec: str | None) -> Slo:
    """Parse an `--slo` spec; raises UsageError naming the bad entry and the fix."""
    if spec is None or not spec.strip():
        return Slo()
    objectives: list[Objective] = []
    thresholds: list[Threshold] = []
    seen: set[str] = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or not name or not value.strip():
            raise UsageError(f"--slo entry {item!r} is not name=value ({_EXAMPLE})")
        if name in seen:
            raise UsageError(f"--slo names {name} twice; give each objective once")
        seen.add(name)
        if name == "error_rate":
            objectives.append(Objective(name, name, _number(name, value, rate=True)))
        elif name == "valid_share":
            objectives.append(Objective(name, name, _number(name, value, rate=True), True))
        elif name in REQUEST_METRICS:
            limit = _number(name, value, rate=False)
            thresholds.append(Threshold(name, REQUEST_METRICS[name], limit))
        else:
            metric, _, stat = name.partition("_")
            if metric not in STEP_METRICS or stat not in STATS:
                raise UsageError(
                    f"--slo name {name!r} is unknown; use <metric>_<stat> with metric in "
                    f"{', '.join(STEP_METRICS)} and stat in {', '.join(STATS)}, a per-request "
                    f"threshold ({', '.join(REQUEST_METRICS)}), error_rate or valid_share ({_EXAMPLE})"
                )
            limit = _number(name, value, rate=False)
            objectives.append(Objective(name, f"{name}_s", limit))
    if not objectives and not thresholds:
        raise UsageError(f"--slo {spec!r} names no objective ({_EXAMPLE})")
    return Slo(tuple(objectives), tuple(thresholds), spec.strip())
