"""docs/reports.md names exactly the summary.csv and requests.csv columns the code writes."""

from __future__ import annotations

import re
from pathlib import Path

from analysis.derive.path import PARTS
from analysis.derive.sessions import SESSION_COLUMNS, TURN_COLUMNS
from analysis.kernel.percentiles import STATS
from analysis.kernel.schema import ERROR_KINDS
from analysis.steps.aggregate import BY_CHOICES, LATENCY_METRICS, PER_REQUEST_COLUMNS
from tests.integration.test_report_summary import EXPECTED

DOC = Path(__file__).resolve().parents[2] / "docs" / "reports.md"


def documented(section: str) -> set[str]:
    text = DOC.read_text(encoding="utf-8").split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    expanded = set()
    for name in names:
        if name == "<metric>_<stat>_s":
            expanded |= {f"{m}_{s}_s" for m in LATENCY_METRICS for s in STATS}
        elif name in ("<part>_mean_s", "<part>_p50_s", "<part>_p99_s"):
            stat = name.split("_", 1)[1]
            expanded |= {f"{p}_{stat}" for p in PARTS}
        elif name == "errors_<kind>":
            expanded |= {f"errors_{k}" for k in ERROR_KINDS}
        else:
            expanded.add(name)
    return expanded


BY_COLUMNS = set(BY_CHOICES)
"""Summary columns only a split adds (`--by model`)."""


def test_summary_columns_are_documented() -> None:
    assert documented("`summary.csv` columns") == set(EXPECTED[0]) | BY_COLUMNS | {"run_verdict"}


def test_request_columns_are_documented() -> None:
    assert documented("`requests.csv` / `requests.parquet` columns") == set(PER_REQUEST_COLUMNS)


def test_session_columns_are_documented() -> None:
    assert documented("`sessions.csv` / `sessions.parquet` columns") == set(SESSION_COLUMNS)


def test_turn_columns_are_documented() -> None:
    assert documented("Sessions by turn") == set(TURN_COLUMNS)
