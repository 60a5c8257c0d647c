"""The board the master's live views read: the run now going, its live statistics, its reports.

The master (locustfiles/master) pins its current run (`RunCoordinator`) on the board when the
run begins and calls the board's `step_ended` listeners as steps end; the views in this room
(LiveStats' timeline, the console, the LLM tab, the end-of-run report) read the board. The
board is made once per Environment by chat.py and passed to both sides: neither reaches the
other through attributes on Locust's `environment`, and this room never imports the master.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from locustfiles.live.stats import LiveStats, RunView


@dataclass
class Board:
    run: RunView | None = None
    stats: LiveStats | None = None  # master and local runner only
    step_ended: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run is not None else None

    def simulated(self) -> bool:
        """Whether the current run's target said it is simulated (its /version)."""
        target = getattr(getattr(self.run, "manifest", None), "target", None) or {}
        return bool(target.get("simulated"))

    def end_step(self, ended: dict[str, Any]) -> None:
        """The master left step `ended` (its announce dict): tell the listeners."""
        for listener in list(self.step_ended):
            listener(ended)
