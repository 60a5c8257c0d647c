"""Live statistics: per-step sketches on workers, merged exactly on the master; the LLM tab,
the live page, /llmload/metrics, the headless step lines and the report at the end."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "Board",
    "LiveStats",
    "Recorder",
    "Sketch",
    "StepConsole",
]

__getattr__ = public_face(
    __name__,
    {
        "Board": "board",
        "LiveStats": "stats",
        "Recorder": "stats",
        "Sketch": "sketch",
        "StepConsole": "console",
    },
)
