"""Which of a request's phases its worker's loop stalls fell in (analysis/derive/workers.py), and the
bound of what they could move."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.derive.workers import stall_effect, stall_phases

MS = 1_000_000


def _requests(stall_ns: list[float]) -> pd.DataFrame:
    return pd.DataFrame({
        "worker_id": ["w1", "w1", "w2"],
        "sent_at_ns": [1_000 * MS, 2_000 * MS, 1_000 * MS],
        "first_token_ns": [100 * MS, 100 * MS, 100 * MS],
        "last_token_ns": [300 * MS, 300 * MS, 300 * MS],
        "end_ns": [310 * MS, 310 * MS, 310 * MS],
        "worker_stall_ns": stall_ns,
    })  # fmt: skip


STALLS = pd.DataFrame({
    "worker_id": ["w1", "w1", "w1"],
    "started_at_ns": [1_050 * MS, 1_200 * MS, 1_305 * MS],  # in r0's TTFT, decode, and tail
    "length_ns": [10 * MS, 20 * MS, 10 * MS],
})  # fmt: skip


def test_each_phase_gets_the_stall_time_inside_it() -> None:
    # r0 overlapped all three stalls (10 + 20 + 5 ms inside it); r1 none; r2's worker (w2)
    # has no stall rows: its whole overlap counts in every phase (the safe side)
    phases = stall_phases(_requests([35 * MS, 0, 7 * MS]), STALLS)
    assert phases["ttft"] == pytest.approx([0.010, 0.0, 0.007])
    assert phases["decode"] == pytest.approx([0.020, 0.0, 0.007])
    assert phases["e2e"] == pytest.approx([0.035, 0.0, 0.007])


def test_unmeasured_stalls_stay_missing() -> None:
    phases = stall_phases(_requests([np.nan, np.nan, np.nan]), STALLS)
    assert np.isnan(phases["e2e"]).all()
    nan = np.full(3, np.nan)
    assert np.isnan(stall_effect(nan, nan, nan, nan, phases)[0])


def test_the_bound_frees_each_figure_of_its_own_phase() -> None:
    # 100 requests; the 10 slowest (TTFT 200 ms) had 10 ms of stall in their TTFT: the TTFT
    # p99 could fall to 190 ms (5%), the p50 (100 ms) not at all; E2E (all 1 s) not at all
    n = 100
    ttft = np.full(n, 0.1)
    ttft[:10] = 0.2
    stalled = {p: np.zeros(n) for p in ("ttft", "decode", "e2e")}
    stalled["ttft"][:10] = stalled["e2e"][:10] = 0.01
    moved, figure = stall_effect(ttft, np.full(n, 0.02), np.full(n, 1.0), np.full(n, 46.0), stalled)
    assert moved == pytest.approx(5.0) and figure == "ttft_p99"
    # the same stall time inside the decode instead: TPOT 20 ms less 10 ms over 45 gaps
    stalled = {p: np.zeros(n) for p in ("ttft", "decode", "e2e")}
    stalled["decode"][:] = stalled["e2e"][:] = 0.01
    moved, figure = stall_effect(ttft, np.full(n, 0.02), np.full(n, 1.0), np.full(n, 46.0), stalled)
    assert figure == "tpot_p50" and moved == pytest.approx(100 * (0.01 / 45) / 0.02)
