"""The master's side of a run: the coordinator (run id, manifest, steps, clocks, finish),
the staircase and capacity search, Locust's shape hook, the preflight, the target's metrics."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "MasterSide",
    "RunCoordinator",
    "ServerMetricsScraper",
    "Staircase",
    "StepShape",
    "plan_for",
    "preflight",
]

__getattr__ = public_face(
    __name__,
    {
        "MasterSide": "side",
        "RunCoordinator": "coordinator",
        "ServerMetricsScraper": "server_metrics",
        "Staircase": "staircase",
        "StepShape": "shape",
        "plan_for": "search",
        "preflight": "preflight",
    },
)
