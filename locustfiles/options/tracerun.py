"""A `trace:PATH` workload makes the run one open-loop step that replays the trace.

    apply_trace(values, given)   # in options.from_parsed, before the checks between options

The trace (locustfiles/traffic/trace.py) is loaded with the `--trace-*` options, its window
becomes the workload's requests, and the run becomes one rate step: `rates` the window's mean
rate after the speedup (what the step records), `arrival` "trace" (the workers walk the
trace's own schedule, not a drawn one). Unless given, `--step-duration` is the window's
length after the speedup plus TRACE_TAIL_S (for the last requests to finish) and
`--step-warmup` 0 (every request of the trace counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from analysis.kernel.errors import UsageError
from locustfiles.traffic.trace import TraceSettings, load_trace

TRACE_TAIL_S = 5.0
TRACE_OPTIONS = ("trace_format", "trace_speedup", "trace_start", "trace_duration",
                 "trace_block_tokens")  # fmt: skip
_NOT_WITH_TRACE: dict[str, tuple[Callable[[dict[str, Any]], bool], str]] = {
    "steps": (lambda v: False, "a trace is replayed open loop, by its timestamps"),
    "rates": (lambda v: bool(v["rates"]), "the trace's timestamps are the arrivals"),
    "arrival": (lambda v: v["arrival"] != "poisson", "the trace's timestamps are the arrivals"),
    "search": (lambda v: v["search"] != "off", "a trace is replayed as recorded, not searched"),
    "turns": (lambda v: v["turns"].spec != "1", "each trace row is one request"),
    "tool_rate": (lambda v: v["tool_rate"] > 0, "each trace row is one request"),
    "followup_workload": (lambda v: v["followup_workload"] is not None,
                          "each trace row is one request"),
}  # fmt: skip
"""The options a trace replaces: (set?, why not with a trace)."""


def parse_speedup(text: str) -> float:
    """--trace-speedup: a finite number > 0 (2: twice as fast as recorded)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(
            f"--trace-speedup must be a number > 0, not {text!r}; e.g. --trace-speedup 10 "
            "replays the trace ten times as fast"
        )
    return value


def apply_trace(values: dict[str, Any], given: Callable[[str], bool]) -> None:
    """Load a trace workload's window and make the run its one rate step (module docstring);
    refuse the options a trace replaces, and the --trace-* options without a trace."""
    trace = values["workload"].trace
    if trace is None:
        for name in TRACE_OPTIONS:  # (the speedup's setting is its text, its value a number)
            if values[name] != 1.0 if name == "trace_speedup" else given(name):
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} applies to a trace: give --workload trace:PATH too")
        return
    for name, (is_set, why) in _NOT_WITH_TRACE.items():
        if is_set(values) or (name == "steps" and given(name)):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} cannot be given with --workload trace:PATH ({why}); drop it")
    fmt = values["trace_format"]
    settings = TraceSettings(
        format="" if fmt == "auto" else fmt,
        speedup=values["trace_speedup"],
        start_s=values["trace_start"],
        duration_s=values["trace_duration"],
        block_tokens=values["trace_block_tokens"],
    )
    trace.replay = replay = load_trace(trace.path, settings)
    values["rates"] = (replay.rate,)
    values["arrival"] = "trace"
    if not given("step_warmup"):
        values["step_warmup"] = 0.0
    if not given("step_duration"):
        values["step_duration"] = replay.span_s + TRACE_TAIL_S
