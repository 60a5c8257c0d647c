"""One validity verdict per step and per run: can the numbers be believed, and as what?

A pipeline cannot read warnings; it reads a verdict (docs/reports.md, "Verdicts"):

- `incomplete`: events are missing (parts missing or unreadable, workers that never
  confirmed their events, sinks that lost rows), the run has no recorded end (its master
  never finished it), or the step has no steady window or no request in it;
- `client-limited`: the load generator, not the server, shaped the numbers: a worker was
  saturated (its CPU, or its event-loop lag p90: late a tenth of the time, over their
  limits), a rate step's send slip p99 was over
  its limit, or stalls of the workers' loops touched more than a share of the step's
  requests *and* could have moved one of its reported percentiles by more than a set
  fraction;
- `server-overloaded`: the server turned requests away or let them time out: queue
  rejections (429/503) and timeouts over a share of the step's requests;
- `failed`: the step sent requests and not one succeeded, and no cause above explains it (a
  page instead of a stream, a refusal, a malformed body): nothing was measured;
- `valid`: none of these.

The worst comes first: incomplete, client-limited, server-overloaded, valid. The run's verdict
is the worst of its steps' and its own (`incomplete` for lost events or a missing end), with
every reason. `llmload report --fail-on-invalid` exits EXIT_INVALID when the run's verdict
is one of those given (default: incomplete, client-limited: the numbers are not the server's
or not all there; server-overloaded is a finding about the server).

Limits are a spec like `--slo`'s (`--validity cpu=80,lag_ms=5,slip_ms=10,stalled=0.05,
moved=5,overload=0.01`); each key's default is in LIMITS.

Stalls are graded by what they can do (analysis/workers.stall_effect): a stall warns only
when it could move a reported percentile by more than `moved` percent; a smaller one is a
note (summary.json `notes`), not a warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from analysis.derive.openloop import SLIP_WARN_MS
from analysis.derive.workers import SATURATED_LAG_MS
from analysis.kernel.errors import UsageError
from analysis.kernel.schema import OVERLOAD_KINDS, SATURATED_CPU_PERCENT
from analysis.read.completeness import Completeness
from analysis.steps.aggregate import row_name

VALID: Final = "valid"
CLIENT_LIMITED: Final = "client-limited"
INCOMPLETE: Final = "incomplete"
SERVER_OVERLOADED: Final = "server-overloaded"
FAILED: Final = "failed"
VERDICTS: Final = (INCOMPLETE, CLIENT_LIMITED, SERVER_OVERLOADED, FAILED, VALID)
"""Every verdict, worst first."""

INVALID: Final = (INCOMPLETE, CLIENT_LIMITED, FAILED)
"""The verdicts `--fail-on-invalid` fails on when given no list."""

EXIT_INVALID: Final = 4
"""`llmload report --fail-on-invalid`: the run's verdict is one of those failed on."""

LIMITS: Final = {
    "cpu": SATURATED_CPU_PERCENT,  # a worker's one-second CPU% at or above: saturated
    "lag_ms": SATURATED_LAG_MS,  # a worker's loop-lag p90 at or above: saturated
    "slip_ms": SLIP_WARN_MS,  # a rate step's send slip p99 above: the generator was late
    "stalled": 0.05,  # share of a step's requests overlapping a stall of their worker...
    "moved": 5.0,  # ...and the percent a stall could move a reported percentile by
    "overload": 0.01,  # share of a step's requests rejected (429/503) or timed out
}
"""Validity limits by key (`--validity key=value,...`), with their defaults."""

_EXAMPLE = "e.g. --validity cpu=90,stalled=0.1,overload=0.05"


@dataclass(frozen=True)
class Limits:
    """The validity limits (LIMITS keys); `spec` as given."""

    values: dict[str, float] = field(default_factory=lambda: dict(LIMITS))
    spec: str = ""

    def __getitem__(self, key: str) -> float:
        return self.values[key]


def parse_limits(spec: str | None) -> Limits:
    """Parse `--validity`; UsageError naming the bad entry and the fix."""
    values = dict(LIMITS)
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, text = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in LIMITS:
            raise UsageError(
                f"--validity entry {item!r} is not key=value with key in "
                f"{', '.join(LIMITS)} ({_EXAMPLE})"
            )
        try:
            value = float(text.strip().removesuffix("%"))
        except ValueError:
            raise UsageError(
                f"--validity {key}={text.strip()!r} is not a number ({_EXAMPLE})"
            ) from None
        if text.strip().endswith("%") and key in ("stalled", "overload"):
            value /= 100.0
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"--validity {key} must be a number >= 0, not {text.strip()!r}")
        values[key] = value
    return Limits(values, (spec or "").strip())


@dataclass
class Verdict:
    """The run's verdict, its reasons (each naming its step), and the notes that stayed
    below every limit (disturbances too small to move a reported figure)."""

    verdict: str
    reasons: list[str]
    limits: Limits
    notes: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        """`client-limited: step 3: worker w1 saturated (CPU 97% >= 80%)`; `valid` alone."""
        return self.verdict + (": " + "; ".join(self.reasons) if self.reasons else "")

    def failed(self, on: tuple[str, ...]) -> bool:
        return self.verdict in on

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "limits": self.limits.values,
            "spec": self.limits.spec,
        }


def worst(verdicts: list[str]) -> str:
    return min(verdicts, key=VERDICTS.index) if verdicts else VALID


def _num(row: dict[str, Any], key: str) -> float:
    value = row.get(key)
    if value is None:
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _stalls(row: dict[str, Any], limits: Limits) -> tuple[bool, str, bool]:
    """(client-limited by stalls, the line describing them, whether it is a warning)."""
    stalled = row.get("requests_worker_stalled")
    if not stalled:
        return False, "", False
    share = stalled / row["requests"] if row.get("requests") else float("nan")
    moved = _num(row, "stall_moved_pct")
    figure = row.get("stall_moved_figure") or "no percentile"
    could = (
        f"at most they moved {figure} by {moved:.3g}%"
        if moved == moved
        else "what they could move is unknown"
    )
    line = (
        f"{row_name(row)}: {stalled} request(s) ({share:.1%}) overlapped a stall of their own "
        f"worker's event loop; {could} (event times come from the kernel; worker_stall_ns "
        "in requests.csv)"
    )
    big = moved != moved or moved > limits["moved"]
    limited = big and share == share and share > limits["stalled"]
    return limited, line, big


def step_verdict(
    row: dict[str, Any], limits: Limits, run_incomplete: bool
) -> tuple[str, list[str], list[str], list[str]]:
    """(verdict, reasons, warnings, notes) of one summary row."""
    name = row_name(row)
    found: dict[str, list[str]] = {v: [] for v in VERDICTS}
    warnings: list[str] = []
    notes: list[str] = []
    if run_incomplete:
        found[INCOMPLETE].append(f"{name}: the run's events are incomplete")
    if row["group"] == "step" and (row.get("window_start_ns") is None or not row.get("requests")):
        found[INCOMPLETE].append(f"{name}: no steady window or no request in it")
    cpu, lag = _num(row, "worker_cpu_max_pct"), _num(row, "loop_lag_p90_ms")
    if cpu == cpu and cpu >= limits["cpu"]:
        found[CLIENT_LIMITED].append(
            f"{name}: a worker's CPU reached {cpu:.0f}% (limit {limits['cpu']:g}%)"
        )
    if lag == lag and lag >= limits["lag_ms"]:
        found[CLIENT_LIMITED].append(
            f"{name}: a worker's loop-lag p90 was {lag:.1f} ms (limit {limits['lag_ms']:g} ms)"
        )
    slip = _num(row, "slip_p99_ms")
    if row.get("mode") == "rate" and slip == slip and slip > limits["slip_ms"]:
        found[CLIENT_LIMITED].append(
            f"{name}: send slip p99 {slip:.3g} ms (limit {limits['slip_ms']:g} ms)"
        )
    limited, line, big = _stalls(row, limits)
    if limited:
        found[CLIENT_LIMITED].append(line)
    elif line:
        (warnings if big else notes).append(line)
    requests = row.get("requests") or 0
    overloaded = sum(int(row.get(f"errors_{kind}") or 0) for kind in OVERLOAD_KINDS)
    if requests and overloaded / requests > limits["overload"]:
        found[SERVER_OVERLOADED].append(
            f"{name}: {overloaded} of {requests} request(s) ({overloaded / requests:.1%}) were "
            f"rejected (429/503) or timed out (limit {limits['overload']:.1%})"
        )
    if row["group"] == "step" and requests and not row.get("ok") and not any(found.values()):
        # nothing succeeded and nothing above explains it (an overload says why already)
        found[FAILED].append(
            f"{name}: none of its {requests} request(s) succeeded{_top_error(row)}: nothing "
            "was measured"
        )
    verdict = next((v for v in VERDICTS if found[v]), VALID)
    reasons = [r for v in VERDICTS for r in found[v]]
    return verdict, reasons, warnings, notes


def _top_error(row: dict[str, Any]) -> str:
    """`` (most: http_4xx_other, 12)`` for a step row's most frequent error kind, or ``."""
    counts = {k[len("errors_") :]: int(v or 0) for k, v in row.items() if k.startswith("errors_")}
    kind, count = max(counts.items(), key=lambda kv: kv[1], default=("", 0))
    return f" (most: {kind}, {count})" if count else ""


def run_reasons(manifest: dict[str, Any], completeness: Completeness) -> list[str]:
    """Why the run as a whole is incomplete (empty: it is not)."""
    out = []
    if not completeness.complete:
        problems = completeness.warnings()
        out.append(
            "events are incomplete"
            + (f" ({len(problems)} problem(s): {problems[0]})" if problems else "")
        )
    status = manifest.get("status")
    if status not in ("finished", "aborted"):
        out.append(
            f"the run has no recorded end (status {status or 'unknown'}): its master did not "
            "finish it, so its last step and its workers' final parts may be missing"
        )
    return out


def judge_run(
    rows: list[dict[str, Any]],
    manifest: dict[str, Any],
    completeness: Completeness,
    limits: Limits,
    warnings: list[str],
) -> Verdict:
    """Set `verdict` and `verdict_reasons` on every row; the run's Verdict. Stall lines that
    could move a reported figure go to `warnings`, the others to the verdict's notes."""
    own = run_reasons(manifest, completeness)
    verdicts = [INCOMPLETE] if own else []
    reasons = list(own)
    notes: list[str] = []
    for row in rows:
        verdict, why, warn, note = step_verdict(row, limits, bool(own))
        row["verdict"] = verdict
        row["verdict_reasons"] = "; ".join(why)
        warnings.extend(warn)
        notes.extend(note)
        if row["group"] == "step":
            verdicts.append(verdict)
            reasons.extend(r for r in why if not r.endswith("the run's events are incomplete"))
    return Verdict(worst(verdicts), reasons, limits, notes)
