"""Steady windows from the manifest timeline, and the fallback to the requests' span."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.derive.windows import Window, plan_steps

S = 1_000_000_000


def frame(steps: list[int], sent: list[int], cold: list[bool] | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": steps,
            "concurrency": [2 * (s + 1) for s in steps],
            "sent_at_ns": sent,
            "cold": cold or [False] * len(steps),
        }
    )


def test_manifest_window_starts_after_spawn_plus_warmup() -> None:
    manifest = {"steps": [{"step": 0, "concurrency": 4, "started_at_ns": 0,
                           "spawned_at_ns": 2 * S, "ended_at_ns": 10 * S, "warmup_s": 1.5}]}  # fmt: skip
    plans, warnings = plan_steps(manifest, frame([0], [5 * S]), np.array([6 * S]))
    assert warnings == []
    assert plans[0].concurrency == 4
    assert plans[0].window == Window(int(3.5 * S), 10 * S, "manifest")
    assert plans[0].window.length_s == 6.5


def test_missing_timeline_falls_back_with_a_warning() -> None:
    requests = frame([0, 0, 1], [1 * S, 2 * S, 5 * S], None)
    done = np.array([3 * S, -1, 7 * S])  # the second never finished: its send counts
    plans, warnings = plan_steps({}, requests, done)
    assert [p.window for p in plans] == [
        Window(1 * S, 3 * S, "requests"),
        Window(5 * S, 7 * S, "requests"),
    ]
    assert [p.concurrency for p in plans] == [2, 4]
    assert len(warnings) == 1 and "step(s) 0, 1" in warnings[0]


def test_empty_window_and_step_without_requests() -> None:
    manifest = {"steps": [
        {"step": 0, "concurrency": 1, "spawned_at_ns": 0, "ended_at_ns": 1 * S, "warmup_s": 5},
        {"step": 1, "concurrency": 2, "spawned_at_ns": S, "ended_at_ns": 9 * S, "warmup_s": 0},
    ]}  # fmt: skip
    plans, warnings = plan_steps(manifest, frame([], []), np.array([], dtype=np.int64))
    assert plans[0].window is None and "empty" in warnings[0]
    assert plans[1].window == Window(S, 9 * S, "manifest")


def test_cold_requests_do_not_make_steps() -> None:
    plans, _ = plan_steps({}, frame([3], [S], [True]), np.array([2 * S]))
    assert plans == []
