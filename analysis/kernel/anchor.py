"""One instant on two clocks: the wall clock that anchors an event and the monotonic counter
its offsets are measured on.

A request row's `sent_at_ns` is wall time; its `*_ns` offsets are `time.perf_counter_ns()`
differences. The two are read one after the other, and a process preempted between the two
readings (a loaded host: the scheduler's slice is milliseconds) would anchor every offset of
that request that far from where it was; the request path (analysis/derive/path.py), which
compares the client's instants with the engine's, showed such a request as a negative part.
`wall_and_perf_ns` reads the counter on both sides of the wall clock and keeps the tightest of
a few tries: its error is the gap between the counter's two readings (well under 10 µs).
"""

from __future__ import annotations

import time
from typing import Final

TIGHT_NS: Final = 20_000
"""A pair read within this (counter before to counter after) is kept at once."""

_wall_ns = time.time_ns
_perf_ns = time.perf_counter_ns


def wall_and_perf_ns(tries: int = 4) -> tuple[int, int]:
    """(wall ns, perf_counter ns) of one instant: the wall reading and the midpoint of the
    counter readings around it, the tightest pair of up to `tries`."""
    best_gap, wall, perf = -1, 0, 0
    for _ in range(tries):
        before = _perf_ns()
        now = _wall_ns()
        after = _perf_ns()
        gap = after - before
        if best_gap < 0 or gap < best_gap:
            best_gap, wall, perf = gap, now, before + gap // 2
        if gap <= TIGHT_NS:
            break
    return wall, perf
