"""Where a worker's rows go: buffers encoded to Parquet parts, a local spool, the store,
nothing lost; and the start-up warm-up that keeps first-use costs out of the run."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "EventSink",
    "SinkConfig",
    "Spool",
    "upload_spool",
    "warm_up",
]

__getattr__ = public_face(
    __name__,
    {
        "EventSink": "eventsink",
        "SinkConfig": "eventsink",
        "Spool": "spool",
        "upload_spool": "spool",
        "warm_up": "warmup",
    },
)
