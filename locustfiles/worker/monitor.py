"""A worker measures itself: event-loop lag, its own stalls, and its process CPU.

A repeating timer on the gevent hub fires every TICK_S; how late it fires is the loop's lag
(a tight sleep's overshoot: the time the loop was busy elsewhere, e.g. a long CPU burst or a
thread holding the GIL). Every lag of STALL_NS or more is a stall: recorded with its start
and length, and every request whose lifetime overlaps one is flagged (`worker_stall_ns`).
Every SAMPLE_S the monitor emits a sample: the process's CPU% over the interval (all its
threads) and every tick's lag in it, so analysis can compute exact per-step lag percentiles.

    monitor = LoopMonitor(on_sample=sink_rows.append, on_stall=stall_rows.append)
    monitor.start()                    # after start-up, in the worker process
    t0 = perf_counter_ns(); ...; stall = monitor.overlap_ns(t0, perf_counter_ns())
    monitor.stop()                     # emits the last (partial) sample

The timer callback runs in the hub: it only appends numbers and never raises. Its cost is
a few microseconds per tick (~0.1% of a core).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from analysis.kernel.schema import SATURATED_CPU_PERCENT, STALL_NS

log = logging.getLogger("llmload.monitor")

TICK_S: Final = 0.005
"""Lag probe period: a stall's start is known to within one tick."""
SAMPLE_S: Final = 1.0
"""One sample row (CPU%, the interval's lags) per this many seconds."""
_WARN_EVERY_S: Final = 30.0
_KEEP_STALLS: Final = 4096

_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns
_cpu_ns = time.process_time_ns


class LoopMonitor:
    """Loop lag, stalls and CPU% of this process (see the module docstring)."""

    def __init__(
        self,
        on_sample: Callable[[dict[str, Any]], None],
        on_stall: Callable[[dict[str, Any]], None],
        tick_s: float = TICK_S,
        sample_s: float = SAMPLE_S,
        stall_ns: int = STALL_NS,
    ) -> None:
        self.on_sample = on_sample
        self.on_stall = on_stall
        self.tick_s = tick_s
        self.tick_ns = int(tick_s * 1e9)
        self.sample_ns = int(sample_s * 1e9)
        self.stall_ns = stall_ns
        self.stalls: deque[tuple[int, int]] = deque(maxlen=_KEEP_STALLS)  # (start, end) perf ns
        self.stall_count = 0
        self._timer: Any = None
        self._prev = 0  # perf ns of the last tick
        self._lags: list[int] = []  # this sample's lags, microseconds
        self._sample_start = 0  # perf ns
        self._cpu_start = 0
        self._warned_at = 0.0

    # -- control -------------------------------------------------------------------------
    def start(self) -> LoopMonitor:
        if self._timer is not None:
            return self
        import gevent

        self._prev = self._sample_start = _perf_ns()
        self._cpu_start = _cpu_ns()
        self._timer = gevent.get_hub().loop.timer(self.tick_s, self.tick_s)
        self._timer.start(self._tick)
        return self

    def stop(self) -> None:
        """Stop the timer and emit what the current sample holds."""
        if self._timer is None:
            return
        self._timer.stop()
        self._timer.close()
        self._timer = None
        now = _perf_ns()
        if now - self._prev - self.tick_ns >= self.stall_ns:  # a stall ends with the monitor
            self._stall(self._prev + self.tick_ns, now)
        self._emit_sample(now)

    @property
    def running(self) -> bool:
        return self._timer is not None

    # -- the timer -----------------------------------------------------------------------
    def _tick(self) -> None:
        now = _perf_ns()
        lag = now - self._prev - self.tick_ns
        self._prev = now
        if lag < 0:
            lag = 0
        self._lags.append(lag // 1000)
        if lag >= self.stall_ns:
            self._stall(now - lag, now)
        if now - self._sample_start >= self.sample_ns:
            self._emit_sample(now)

    def _stall(self, start: int, end: int) -> None:
        self.stalls.append((start, end))
        self.stall_count += 1
        wall_end = _time_ns()
        try:
            self.on_stall({"started_at_ns": wall_end - (end - start), "length_ns": end - start})
        except Exception:  # never let the hub's callback raise
            log.exception("llmload: recording a worker stall failed")

    def _emit_sample(self, now: int) -> None:
        interval = now - self._sample_start
        if interval <= 0:
            return
        cpu = _cpu_ns()
        cpu_percent = 100.0 * (cpu - self._cpu_start) / interval
        lags, self._lags = self._lags, []
        self._sample_start, self._cpu_start = now, cpu
        row = {
            "at_ns": _time_ns(),
            "interval_ns": interval,
            "cpu_percent": cpu_percent,
            "loop_lag_us": lags,
        }
        try:
            self.on_sample(row)
        except Exception:
            log.exception("llmload: recording a worker sample failed")
        self._warn_if_saturated(cpu_percent, lags)

    def _warn_if_saturated(self, cpu_percent: float, lags: list[int]) -> None:
        p99 = sorted(lags)[int(0.99 * (len(lags) - 1))] if lags else 0
        if cpu_percent < SATURATED_CPU_PERCENT and p99 * 1000 < self.stall_ns:
            return
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "llmload: this worker is saturated (CPU %.0f%%, loop-lag p99 %.1f ms): its "
                "timings include its own delay; add worker processes or lower the load",
                cpu_percent,
                p99 / 1000,
            )

    # -- requests ------------------------------------------------------------------------
    def overlap_ns(self, start: int, end: int) -> int:
        """Stall time (perf ns) overlapping [start, end], including a stall still going on:
        a request may finish before the late timer has run."""
        total = 0
        for s, e in reversed(self.stalls):
            if e <= start:
                break
            total += max(0, min(e, end) - max(s, start))
        if self._timer is not None:
            due = self._prev + self.tick_ns
            now = _perf_ns()
            if now - due >= self.stall_ns:  # the loop is late right now: a stall in progress
                total += max(0, min(now, end) - max(due, start))
        return total
