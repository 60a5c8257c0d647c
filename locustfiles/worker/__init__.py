"""A worker's side of a run: its context (sink, workload stream, probes, recording), the
open-loop dispatcher, the self-monitor, and the watch on its master."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "Dispatcher",
    "LoopMonitor",
    "MasterWatch",
    "WorkerContext",
    "WorkerSide",
]

__getattr__ = public_face(
    __name__,
    {
        "Dispatcher": "openloop",
        "LoopMonitor": "monitor",
        "MasterWatch": "masterwatch",
        "WorkerContext": "context",
        "WorkerSide": "side",
    },
)
