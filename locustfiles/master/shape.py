"""`StepShape`: Locust's load-shape hook, which makes each start a run and ticks its steps.

Locust finds the shape class in the locustfile's namespace, so `locustfiles/chat.py`
exports it. Each shape test start begins a new run (`master.begin_run`: run id, manifest,
the `RunCoordinator`); every tick asks the coordinator's Staircase (locustfiles/master/staircase.py)
for the target users and spawn rate.
"""

from __future__ import annotations

from locust import LoadTestShape

from locustfiles.master.coordinator import begin_run


class StepShape(LoadTestShape):
    """Locust's shape hook: each start makes a new run (coordinator); ticks drive its steps."""

    use_common_options = False

    def reset_time(self) -> None:
        """Called by Locust when a shape test starts (and again by the master's first spawn)."""
        super().reset_time()
        runner = getattr(self, "runner", None)
        if runner is None:
            return
        current = getattr(runner.environment, "llmload_coordinator", None)
        if current is None or current.finished_at is not None:
            begin_run(runner.environment)

    def tick(self) -> tuple[int, float] | None:
        environment = self.runner.environment if self.runner is not None else None
        coordinator = getattr(environment, "llmload_coordinator", None)
        return None if coordinator is None else coordinator.tick()
