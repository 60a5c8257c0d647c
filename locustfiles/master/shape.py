"""`StepShape`: Locust's load-shape hook, which makes each start a run and ticks its steps.

Locust finds the shape class in the locustfile's namespace, so `locustfiles/chat.py`
exports it. Each shape test start begins a new run (`MasterSide.begin_run`, locustfiles/master/side.py: run id, manifest,
the `RunCoordinator`); every tick asks the coordinator's Staircase (locustfiles/master/staircase.py)
for the target users and spawn rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from locust import LoadTestShape

if TYPE_CHECKING:
    from locustfiles.master.side import MasterSide


class StepShape(LoadTestShape):
    """Locust's shape hook: each start makes a new run (coordinator); ticks drive its steps.

    Locust makes the instance; chat.py's setup hands it the Environment's MasterSide."""

    use_common_options = False
    master: MasterSide | None = None

    def reset_time(self) -> None:
        """Called by Locust when a shape test starts (and again by the master's first spawn)."""
        super().reset_time()
        if self.master is None:
            return
        current = self.master.coordinator
        if current is None or current.finished_at is not None:
            self.master.begin_run()

    def tick(self) -> tuple[int, float] | None:
        coordinator = self.master.coordinator if self.master is not None else None
        return None if coordinator is None else coordinator.tick()
