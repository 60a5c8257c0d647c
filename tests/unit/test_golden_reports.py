"""Golden reports: every run stored in tests/golden/events/ reported again with today's code
gives the summary.json, summary.csv and report.md kept in tests/golden/expected/ (recorded by
tests/golden/record.py with the code of the day the runs were made).

The report is made through the `llmload` command's `main` only (no `analysis` module is
imported), so this holds across a reorganisation of the analysis package. The comparison
ignores exactly what differs between two reports of one run (tests/golden/cases.py): the run
URI given, and the last bits of two means whose sums DuckDB orders differently each time.

A difference that is meant (a new column, a changed word): check the diff, then write the
expected files again with `PYTHONPATH=. .venv/bin/python tests/golden/record.py --reports-only`.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import shutil
from pathlib import Path

import pytest

from tests.golden.cases import (
    CASES,
    EVENTS,
    EXPECTED,
    FILES,
    Case,
    comparable,
    make_report,
    run_dir,
)

MAX_DIFF_LINES = 80


def _csv_diff(got: str, want: str) -> list[str]:
    """Cell by cell (a summary.csv line holds some 150 columns): `row <group> <step>: column`."""
    ours, theirs = list(csv.reader(io.StringIO(got))), list(csv.reader(io.StringIO(want)))
    if not ours or not theirs or ours[0] != theirs[0]:
        added = [c for c in (ours[0] if ours else []) if c not in (theirs[0] if theirs else [])]
        gone = [c for c in (theirs[0] if theirs else []) if c not in (ours[0] if ours else [])]
        return [f"header differs: columns added {added}, removed {gone}"]
    header, out = theirs[0], []
    if len(ours) != len(theirs):
        out.append(f"{len(ours) - 1} rows, expected {len(theirs) - 1}")
    for n, (a, b) in enumerate(zip(ours[1:], theirs[1:], strict=False), start=1):
        for column, x, y in zip(header, a, b, strict=False):
            if x != y:
                out.append(f"row {n} ({' '.join(b[:2])}) {column}: {x!r}, expected {y!r}")
    return out


def _diff(name: str, got: str, want: str) -> str:
    if name.endswith(".csv"):
        lines = _csv_diff(got, want)
    else:
        lines = [
            line.rstrip("\n")
            for line in difflib.unified_diff(
                want.splitlines(True), got.splitlines(True), f"expected/{name}", f"made/{name}"
            )
        ]
    more = len(lines) - MAX_DIFF_LINES
    return "\n".join(lines[:MAX_DIFF_LINES] + ([f"... {more} more lines"] if more > 0 else []))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_stored_run_reports_as_it_did(case: Case, tmp_path: Path) -> None:
    events = tmp_path / "events"
    shutil.copytree(EVENTS / case.name, events)  # the fixtures stay untouched
    run_uri = f"file://{run_dir(events)}"
    out = tmp_path / "report"
    make_report(run_uri, out, case.report_args)
    assert json.loads((out / "summary.json").read_text())["run_uri"] == run_uri
    problems = []
    for name in FILES:
        want = (EXPECTED / case.name / name).read_text()
        got = comparable(name, (out / name).read_text(), want, run_uri)
        if got != want:
            problems.append(f"--- {case.name}/{name} differs:\n{_diff(name, got, want)}")
    if problems:
        pytest.fail(
            "the report differs from tests/golden/expected/ (if that is meant: "
            "tests/golden/record.py --reports-only)\n" + "\n".join(problems),
            pytrace=False,
        )
