"""Golden reports: the stored runs, how their reports are made, and what the comparison ignores.

Each case is a real run against the simulated engine (tests/golden/record.py made them), kept
as a file store: `events/<name>/<run_id>/` (manifest.json, requests/, chunks/, index/, ...).
Its report, made by the code of the day the run was recorded, is kept in `expected/<name>/`
(summary.json, summary.csv, report.md). tests/unit/test_golden_reports.py reports every stored
run again and compares: a change of any figure, row, column or word is a change of behaviour.

Only the public entry point is used: the `llmload` command's `main` (pyproject's
[project.scripts]), in process, as `llmload report RUN_URI --out DIR --no-html --quiet`. No
module of `analysis` is imported here, so these tests survive a reshuffle of its modules.

Normalisation (what differs between two reports of one stored run, and nothing else):
- the run URI the report was given: summary.json's `run_uri` and report.md's `| events |` row
  echo it. It is replaced by RUN_URI_PLACEHOLDER, spelled as each file spells it (JSON string
  escapes in summary.json, `|` escaped in report.md).
- the means of float values: `itl_mean_s` and `icl_mean_s` (DuckDB adds up their per-bin sums
  of value x weight on several threads, in an order that varies from one report to the
  next, so their last bit or two do: 0.001019129152596315 or 0.0010191291525963148 for the
  same run), and every other mean of float values per step (TTFT, TPOT, E2E, the sessions'
  waits, the request path's parts: the engine's compensated sum, analysis/steps/outofcore.py,
  against numpy's pairwise one: 0.520362051111111 or 0.5203620511111111). --in-memory's numpy sums, and the lowest versions of `make
  test-min`, differ in the last bits too. A value within SUM_ORDER_REL_TOL of the expected
  one (relative) counts as it (summary.json's steps, summary.csv's columns).
Every other byte of the three files is the same whatever the day, the directory, the output
folder, the time zone, the CPU count (DuckDB's threads) or the dependency versions (those of
.venv and of requirements-min.txt): checked when the golden files were recorded (20 reports
of each run with 2 threads; 1, 8 and 32 threads; another time zone; the lowest versions).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
EVENTS = GOLDEN / "events"  # a file store per case (not "runs/": .gitignore ignores runs/)
EXPECTED = GOLDEN / "expected"
FILES = ("summary.json", "summary.csv", "report.md")
RUN_URI_PLACEHOLDER = "<RUN_URI>"
SUM_ORDER_FIELDS = (
    "itl_mean_s", "icl_mean_s", "ttft_mean_s", "tpot_mean_s", "e2e_mean_s", "tool_wait_s_mean",
    "think_s_mean", "network_up_mean_s", "server_other_mean_s", "server_queue_mean_s",
    "server_prefill_mean_s", "first_token_delivery_mean_s", "server_decode_mean_s", "tail_mean_s",
)  # fmt: skip
SUM_ORDER_REL_TOL = 1e-12  # the order of the sums moves them by up to ~2.4e-16 (relative)
_JSON_FIELD = re.compile(rf'"({"|".join(SUM_ORDER_FIELDS)})": ([^,\n]+)')


@dataclass(frozen=True)
class Case:
    name: str
    report_args: tuple[str, ...] = ()  # more `llmload report` options
    what: str = ""


CASES = (
    Case(
        "demo",
        ("--slo", "ttft_p99=0.5,tpot_p50=50ms,ttft=1"),
        "the demo's campaign (its workload, simulator profile, cold requests, engine facts), "
        "steps 1,2,4 of 3 s, two workers; reported with an SLO and goodput threshold",
    ),
    Case("rate", (), "open loop: --rates 5,10 (Poisson, seeded), one process"),
    Case(
        "session",
        (),
        "sessions: 3 user turns, follow-up lengths, think time, tool rounds; 2 users",
    ),
    Case(
        "trace",
        (),
        "trace replay: 10 s of examples/traces/mooncake.jsonl at 5x, two workers",
    ),
    Case(
        "spans",
        (),
        "engine spans: the simulator's OTLP spans received by the master (--otlp-listen)",
    ),
)


def run_dir(events_root: Path) -> Path:
    """The one run folder (it holds manifest.json) of a case's file store."""
    runs = sorted(p.parent for p in events_root.glob("*/manifest.json"))
    assert len(runs) == 1, f"expected one run in {events_root}, found {runs}"
    return runs[0]


def make_report(run_uri: str, out: Path, report_args: tuple[str, ...] = ()) -> None:
    """`llmload report RUN_URI --out OUT --no-html --quiet ...`, in process."""
    from infra.cli import main

    code = main(["report", run_uri, "--out", str(out), "--no-html", "--quiet", *report_args])
    assert code == 0, f"llmload report {run_uri} exited {code}"


def normalised(name: str, text: str, run_uri: str) -> str:
    """`text` of report file `name` with the run URI it was made from replaced by
    RUN_URI_PLACEHOLDER, as that file spells the URI."""
    if name.endswith(".json"):
        spelled = json.dumps(run_uri)[1:-1]
    elif name.endswith(".md"):
        spelled = run_uri.replace("|", "\\|")
    else:
        spelled = run_uri
    return text.replace(spelled, RUN_URI_PLACEHOLDER)


def _close(got: str, want: str) -> bool:
    """Two spellings of a float that differ only by the order of a sum."""
    try:
        a, b = float(got), float(want)
    except ValueError:
        return False
    return math.isclose(a, b, rel_tol=SUM_ORDER_REL_TOL, abs_tol=0.0)


def _json_sum_order(got: str, want: str) -> str:
    """`got` with each SUM_ORDER_FIELDS value close to `want`'s replaced by `want`'s text
    (only where both files hold those fields in the same order)."""
    theirs = [(m.group(1), m.group(2)) for m in _JSON_FIELD.finditer(want)]
    ours = [(m.group(1), m.group(2)) for m in _JSON_FIELD.finditer(got)]
    if [k for k, _ in theirs] != [k for k, _ in ours]:
        return got
    values = iter(theirs)

    def swap(m: re.Match[str]) -> str:
        _, expected = next(values)
        return f'"{m.group(1)}": {expected}' if _close(m.group(2), expected) else m.group(0)

    return _JSON_FIELD.sub(swap, got)


def _csv_sum_order(got: str, want: str) -> str:
    """`got` with each line that differs from `want`'s only in SUM_ORDER_FIELDS columns, by
    close values, replaced by `want`'s line."""
    got_lines, want_lines = got.splitlines(keepends=True), want.splitlines(keepends=True)
    if not want_lines or len(got_lines) != len(want_lines):
        return got
    header = next(csv.reader(io.StringIO(want_lines[0])))
    tolerant = {i for i, name in enumerate(header) if name in SUM_ORDER_FIELDS}
    out = []
    for ours, theirs in zip(got_lines, want_lines, strict=True):
        if ours != theirs:
            a = next(csv.reader(io.StringIO(ours)), [])
            b = next(csv.reader(io.StringIO(theirs)), [])
            if len(a) == len(b) and all(
                x == y or (i in tolerant and _close(x, y))
                for i, (x, y) in enumerate(zip(a, b, strict=True))
            ):
                ours = theirs
        out.append(ours)
    return "".join(out)


def comparable(name: str, got: str, want: str, run_uri: str) -> str:
    """Report file `name` as made (`got`) from `run_uri`, normalised for comparison with the
    expected text `want` (see the module's docstring: the run URI, the sum-order fields)."""
    got = normalised(name, got, run_uri)
    if name == "summary.json":
        return _json_sum_order(got, want)
    if name == "summary.csv":
        return _csv_sum_order(got, want)
    return got
