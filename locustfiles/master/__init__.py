"""The master's side of a run: the coordinator (run id, manifest, steps, clocks, finish),
the staircase and capacity search, Locust's shape hook, the preflight, the target's metrics."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "RunCoordinator",
    "ServerMetricsScraper",
    "Staircase",
    "StepShape",
    "begin_run",
    "plan_for",
    "preflight",
]

__getattr__ = public_face(
    __name__,
    {
        "RunCoordinator": "coordinator",
        "ServerMetricsScraper": "server_metrics",
        "Staircase": "staircase",
        "StepShape": "shape",
        "begin_run": "coordinator",
        "plan_for": "search",
        "preflight": "preflight",
    },
)
