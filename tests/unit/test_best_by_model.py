"""With `--by model` a step has one row per model: it meets the SLO only when every model's
row does, so one fast model cannot make a step count as passing (best concurrency, rate)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.kernel.slo import parse_slo
from analysis.read.completeness import Completeness
from analysis.report.summary import Report
from analysis.steps.aggregate import StepTable


def _report(rows: list[dict[str, Any]]) -> Report:
    table = StepTable(rows, pd.DataFrame(), np.empty(0), [{} for _ in rows])
    return Report("r", "runs/r", {}, Completeness(), parse_slo("ttft_p99=1"), table, [])


def _row(step: int, model: str, ok: bool, **more: Any) -> dict[str, Any]:
    return {"group": "step", "step": step, "model": model, "concurrency": 2 ** (step + 1),
            "mode": "concurrency", "rate": None, "slo_pass": ok, **more}  # fmt: skip


def test_a_step_passes_only_when_every_model_passes() -> None:
    report = _report([_row(0, "a", True), _row(0, "b", True),
                      _row(1, "a", True), _row(1, "b", False)])  # fmt: skip
    assert report.best_concurrency == 2
    assert report.slo_failed


def test_rate_steps_likewise() -> None:
    rows = [_row(0, "a", True, mode="rate", rate=5.0), _row(0, "b", True, mode="rate", rate=5.0),
            _row(1, "a", True, mode="rate", rate=9.0), _row(1, "b", False, mode="rate", rate=9.0)]  # fmt: skip
    assert _report(rows).best_rate == 5.0
