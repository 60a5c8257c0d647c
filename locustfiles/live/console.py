"""One console line per finished step in headless runs, from the master's live statistics.

    llmload step 1 [live sketch ±1%, exact figures in the report]: concurrency 2 (actual 1.98),
    412 requests, 0 errors, TTFT p50 12.1 ms p99 40.2 ms, TPOT p50 1.10 ms p99 2.31 ms,
    1850.2 output tok/s

(one line on the console). A step's line is printed STEP_LINE_DELAY_S after the next step is
announced (the coordinator calls `step_ended`): workers report their sketches every few
seconds and the requests in flight at the change still belong to the old step. The last
step's line comes at the end of the run, after the coordinator's finish (`flush`). Against a
simulated target every line starts with SIMULATED: never read it as inference performance.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO

import gevent

from locustfiles.live.board import Board
from locustfiles.live.sketch import RELATIVE_ACCURACY
from locustfiles.run.protocol import COLD_STEP

log = logging.getLogger("llmload.console")

STEP_LINE_DELAY_S = 4.0  # > Locust's worker report interval (3 s)


def _ms(seconds: Any) -> str:
    if seconds is None:
        return "n/a"
    value = float(seconds) * 1000
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def _pct(row: dict[str, Any], metric: str, pct: str) -> Any:
    return (row.get(metric) or {}).get(pct)


def step_line(row: dict[str, Any], *, accuracy: float | None, simulated: bool) -> str:
    """The console line of one step's live summary (a `LiveStats.step_summary` row)."""
    cold = row.get("group") == "cold"
    label = "cold" if cold else f"step {row.get('step')}"
    acc = f"±{accuracy * 100:g}%" if accuracy is not None else "approximate"
    actual = row.get("actual_concurrency")
    actual_text = f" (actual {actual:.2f})" if actual is not None else ""
    errors = row.get("errors") or {}
    failed = int(row.get("failed") or 0)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(errors.items()))
    tok_s = row.get("output_tokens_per_s")
    if row.get("rate") is not None:  # open loop: the rate, and how many were in flight
        in_flight = f" (in flight {actual:.2f})" if actual is not None else ""
        load = f"rate {row['rate']:g}/s{in_flight}"
    else:
        load = f"concurrency {row.get('concurrency')}{actual_text}"
    parts = [
        load,
        f"{int(row.get('requests') or 0)} requests",
        f"{failed} errors" + (f" ({kinds})" if kinds else ""),
        f"TTFT p50 {_ms(_pct(row, 'ttft', 'p50'))} p99 {_ms(_pct(row, 'ttft', 'p99'))}",
        f"TPOT p50 {_ms(_pct(row, 'tpot', 'p50'))} p99 {_ms(_pct(row, 'tpot', 'p99'))}",
        f"{tok_s:.1f} output tok/s" if tok_s is not None else "output tok/s n/a",
    ]
    prefix = "SIMULATED target: " if simulated else ""
    return (
        f"{prefix}llmload {label} [live sketch {acc}, exact figures in the report]: "
        + ", ".join(parts)
    )


class StepConsole:
    """Prints each finished step once, in order, a little after it ended (see module doc)."""

    def __init__(
        self,
        board: Board,
        stream: TextIO | None = None,
        delay_s: float = STEP_LINE_DELAY_S,
        spawn_later: Callable[..., Any] = gevent.spawn_later,
    ) -> None:
        self.board = board
        self.stream = stream
        self.delay_s = delay_s
        self._spawn_later = spawn_later
        self._pending: list[int] = []  # ended steps not printed yet, in order
        self._printed: set[tuple[str | None, int]] = set()  # (run id, step)

    def step_ended(self, ended: dict[str, Any]) -> None:
        """The coordinator left step `ended` (its announce dict): print it soon."""
        self._pending.append(int(ended["step"]))
        self._spawn_later(self.delay_s, self.print_due)

    def print_due(self) -> None:
        """Print the oldest pending step (one per timer: the timers fire in order)."""
        if self._pending:
            self._print(self._pending.pop(0))

    def flush(self) -> None:
        """End of run (after the coordinator's finish): every pending step, then the last one."""
        while self._pending:
            self._print(self._pending.pop(0))
        current = getattr(self.board.run, "current", None)
        if current is not None:
            self._print(int(current["step"]))

    def _print(self, step: int) -> None:
        key = (self.board.run_id, step)
        live = self.board.stats
        if live is None or key in self._printed:
            return
        self._printed.add(key)
        try:
            row = _summary(live, step)
            accuracy = RELATIVE_ACCURACY
        except Exception:  # a console line is never worth a run: say so and go on
            log.exception("llmload: could not summarise step %s for the console", step)
            return
        if row is None:
            return
        line = step_line(row, accuracy=accuracy, simulated=self.board.simulated())
        stream = self.stream if self.stream is not None else sys.stdout
        print(line, file=stream, flush=True)


def _summary(live: Any, step: int) -> dict[str, Any] | None:
    """The live row of `step` (the cold phase is its own group, not a numbered step)."""
    if step == COLD_STEP:
        rows = live.snapshot().get("steps") or []
        return next((r for r in rows if r.get("group") == "cold"), None)
    row: dict[str, Any] | None = live.step_summary(step)
    return row


def register(environment: Any, board: Board) -> StepConsole:
    """Headless master: print step lines (the master ends steps on the board)."""
    console = StepConsole(board)
    board.step_ended.append(console.step_ended)
    environment.events.test_stop.add_listener(lambda **_: console.flush())
    return console
