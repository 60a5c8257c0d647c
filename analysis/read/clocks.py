"""Worker clocks on the master's timeline: the offsets the master measured, applied to times.

The master measures each worker's wall-clock offset (worker clock minus master clock) with an
NTP-style exchange and records it in the manifest: `workers[].clock_offset_ms` and the round
trip of the sample it kept, `clock_rtt_ms` (docs/events.md). Step windows are in master time
while a request's `sent_at_ns` is its worker's wall clock, so the send times are moved onto the
master's clock before requests are placed in windows. Only wall-clock anchors are corrected:
durations (`*_ns` offsets) come from one clock on one worker and need no correction.

    offsets = worker_offsets_ns(run.manifest)        # {worker_id: ns}, measured workers only
    sent = aligned_sent_ns(run.requests, run.manifest)
    warnings += clock_warnings(run.manifest)
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import pandas as pd

CLOCK_WARN_MS: Final = 5.0
"""A worker clock further than this from the master's earns a warning."""

NS_PER_MS: Final = 1_000_000


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _workers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in manifest.get("workers") or [] if isinstance(w, dict) and w.get("worker_id")]


def worker_offsets_ns(manifest: dict[str, Any]) -> dict[str, int]:
    """Each measured worker's clock offset (its clock minus the master's), in ns.

    Workers whose offset was never measured (null) are left out: callers treat them as 0.
    A worker time `t` is `t - offset` on the master's clock.
    """
    out = {}
    for worker in _workers(manifest):
        offset_ms = _finite(worker.get("clock_offset_ms"))
        if offset_ms is not None:
            out[str(worker["worker_id"])] = int(round(offset_ms * NS_PER_MS))
    return out


def aligned_sent_ns(requests: pd.DataFrame, manifest: dict[str, Any]) -> np.ndarray:
    """`sent_at_ns` on the master's clock: minus the offset of the worker that sent it.

    Requests of workers without a measured offset (or without a `worker_id`) keep their time.
    """
    sent = requests["sent_at_ns"].to_numpy(np.int64)
    offsets = worker_offsets_ns(manifest)
    if not offsets or len(sent) == 0 or "worker_id" not in requests:
        return sent
    codes, workers = pd.factorize(requests["worker_id"])
    # one offset per distinct worker, plus a trailing 0 that code -1 (no worker id) picks
    table = np.array([offsets.get(str(w), 0) for w in workers] + [0], dtype=np.int64)
    result: np.ndarray = sent - table[codes]
    return result


def clock_warnings(manifest: dict[str, Any]) -> list[str]:
    """One line per worker whose clock was more than CLOCK_WARN_MS off the master's."""
    out = []
    for worker in _workers(manifest):
        offset_ms = _finite(worker.get("clock_offset_ms"))
        if offset_ms is None or abs(offset_ms) <= CLOCK_WARN_MS:
            continue
        rtt_ms = _finite(worker.get("clock_rtt_ms"))
        measured = f" (measured over a {rtt_ms:.1f} ms round trip)" if rtt_ms is not None else ""
        out.append(
            f"worker {worker['worker_id']}'s clock was {offset_ms:+.1f} ms off the master's"
            f"{measured}: its send times were corrected by that offset to place its requests "
            "in the step windows; check the hosts' time synchronisation (NTP)"
        )
    return out
