"""The validity verdict (analysis/judge/verdict.py) on hand-made runs whose every cause is known,
and `llmload report --fail-on-invalid`'s exit status."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import UsageError, build_report
from analysis.judge.verdict import EXIT_INVALID, INVALID, parse_limits
from analysis.kernel.storage import open_store
from tests.integration.test_report_workers import health_run
from tests.support.runs import RunBuilder

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra", "report", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip


def stalled_run(stall_ms: float, run_id: str = "stalled") -> RunBuilder:
    """40 requests in one step: 20 with TTFT 100 ms; 20 with TTFT 200 ms, each of which
    overlapped a stall of `stall_ms` of its worker."""
    b = RunBuilder(run_id)
    b.add_step(0, 4, started_s=0, spawned_s=0, ended_s=50)
    for i in range(40):
        slow = i >= 20
        first = 0.2 if slow else 0.1
        b.add_request(sent_s=1.0 + i, chunks=[(first, 1), (first + 0.1, 1)],
                      worker_stall_ns=int(stall_ms * 1e6) if slow else 0)  # fmt: skip
    return b


def test_a_saturated_worker_makes_its_step_and_the_run_client_limited(tmp_path: Path) -> None:
    report = build_report(health_run().write(tmp_path / "ev"), tmp_path / "out", progress=False)
    step0, step1 = report.table.rows
    assert step0["verdict"] == "valid" and step0["verdict_reasons"] == ""
    assert step1["verdict"] == "client-limited"
    assert "CPU reached 95% (limit 80%)" in step1["verdict_reasons"]
    # 5% of its probes were 8 ms late: a p99 of 8 ms, but a p90 of 0.1 ms: not saturated by lag
    assert "loop-lag" not in step1["verdict_reasons"]
    lagging = build_report(health_run().write(tmp_path / "ev2"), tmp_path / "out2",
                           progress=False, html=False, validity="cpu=99,lag_ms=0.1")  # fmt: skip
    assert "loop-lag p90 was 0.1 ms (limit 0.1 ms)" in lagging.table.rows[1]["verdict_reasons"]
    assert report.verdict is not None and report.verdict.verdict == "client-limited"
    # step 0's stall touched 1 request of 6 whose TTFTs are all equal: no percentile moved,
    # so it is a note, not a warning
    assert step0["stall_moved_pct"] == 0.0
    assert not [w for w in report.warnings if "overlapped a stall" in w]
    assert [n for n in report.notes if n.startswith("step 0: 1 request(s) (16.7%) overlapped")]
    doc = json.loads(report.files["summary.json"].read_text())
    assert doc["schema_version"] == "1.6"
    assert doc["verdict"]["verdict"] == "client-limited" and doc["verdict"]["limits"]["cpu"] == 80
    assert doc["notes"] and doc["steps"][1]["verdict"] == "client-limited"
    with report.files["summary.csv"].open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["verdict"] for r in rows] == ["valid", "client-limited"]
    assert {r["run_verdict"] for r in rows} == {"client-limited"}
    first = report.files["report.md"].read_text().splitlines()[0]
    assert first == "# llmload report: health · verdict: CLIENT-LIMITED"
    assert "verdict: CLIENT-LIMITED</h1>" in report.files["report.html"].read_text()


def test_limits_are_options(tmp_path: Path) -> None:
    uri = health_run().write(tmp_path / "ev")
    report = build_report(uri, tmp_path / "out", progress=False, html=False,
                          validity="cpu=99")  # fmt: skip
    assert report.verdict is not None and report.verdict.verdict == "valid"
    with pytest.raises(UsageError, match="--validity entry 'cpus=9'"):
        parse_limits("cpus=9")
    with pytest.raises(UsageError, match="must be a number >= 0"):
        parse_limits("moved=-1")
    assert parse_limits("stalled=10%")["stalled"] == pytest.approx(0.1)


def test_a_stall_warns_only_when_it_could_move_a_reported_figure(tmp_path: Path) -> None:
    # 50 ms stalls on 20 of the 40 requests: their TTFT could fall from 200 to 150 ms (p99
    # -25%), and their TPOT (one gap of 100 ms) to 50 ms: the TPOT p50 falls by half
    big = build_report(stalled_run(50).write(tmp_path / "a"), tmp_path / "oa", progress=False,
                       html=False)  # fmt: skip
    row = big.table.rows[0]
    assert row["stall_moved_pct"] == pytest.approx(50.0)
    assert row["stall_moved_figure"] == "tpot_p50"
    assert row["verdict"] == "client-limited"  # 50% of the requests, moving a figure 25%
    warned = [w for w in big.warnings if "overlapped a stall" in w]
    assert warned == [row["verdict_reasons"]] or "at most they moved" in row["verdict_reasons"]
    # 0.5 ms stalls: at most 0.5% of the TPOT: a note, and the step stays valid
    small = build_report(stalled_run(0.5).write(tmp_path / "b"), tmp_path / "ob", progress=False,
                         html=False)  # fmt: skip
    row = small.table.rows[0]
    assert 0 < row["stall_moved_pct"] < 1 and row["verdict"] == "valid"
    assert not [w for w in small.warnings if "overlapped a stall" in w]
    assert any("overlapped a stall" in n for n in small.notes)


def test_rejections_and_timeouts_make_a_step_server_overloaded(tmp_path: Path) -> None:
    b = RunBuilder("overloaded")
    b.add_step(0, 8, started_s=0, spawned_s=0, ended_s=50)
    for i in range(40):
        kind = "queue_rejected" if i % 10 == 0 else ("ttft_timeout" if i == 5 else None)
        b.add_request(sent_s=1.0 + i, chunks=[(0.1, 1), (0.2, 1)],
                      **({"status": "error", "error_kind": kind, "end_s": 0.3} if kind else {}))  # fmt: skip
    report = build_report(b.write(tmp_path / "ev"), tmp_path / "out", progress=False, html=False)
    row = report.table.rows[0]
    assert row["verdict"] == "server-overloaded"
    assert (
        "5 of 40 request(s) (12.5%) were rejected (429/503) or timed out" in row["verdict_reasons"]
    )
    assert report.verdict is not None and report.verdict.verdict == "server-overloaded"


def failed_run(run_id: str = "failed") -> RunBuilder:
    """Step 0: ten requests, all ok; step 1: twelve, every one an error that is no overload
    (a page instead of a stream: stream_truncated; two refused: http_4xx_other)."""
    b = RunBuilder(run_id)
    b.add_step(0, 2, started_s=0, spawned_s=0, ended_s=20)
    b.add_step(1, 4, started_s=20, spawned_s=20, ended_s=40)
    for i in range(10):
        b.add_request(sent_s=1.0 + i, chunks=[(0.1, 1), (0.2, 1)])
    for i in range(12):
        kind = "http_4xx_other" if i < 2 else "stream_truncated"
        b.add_request(sent_s=21.0 + i, step=1, concurrency=4, status="error", error_kind=kind,
                      end_s=0.01)  # fmt: skip
    return b


def test_a_step_where_nothing_succeeded_is_failed_never_valid(tmp_path: Path) -> None:
    """Issue 36: a server answering every request 200 text/html gave a `valid` report."""
    report = build_report(failed_run().write(tmp_path / "ev"), tmp_path / "out", progress=False,
                          html=False)  # fmt: skip
    steps = [r for r in report.table.rows if r["group"] == "step"]
    assert [r["verdict"] for r in steps] == ["valid", "failed"]
    assert (
        "none of its 12 request(s) succeeded (most: stream_truncated, 10)"
        in steps[1]["verdict_reasons"]
    )
    assert report.verdict is not None and report.verdict.verdict == "failed"
    run = str(tmp_path / "ev" / "failed")
    assert _cli(run, "--out", str(tmp_path / "a"), "--quiet").returncode == 0  # step 0 measured
    assert _cli(run, "--out", str(tmp_path / "b"), "--quiet", "--fail-on-invalid").returncode == (
        EXIT_INVALID
    )


def test_fail_on_invalid_alone_means_the_invalid_verdicts() -> None:
    import argparse

    from infra.commands.report import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["report", "r", "--fail-on-invalid"])
    assert tuple(args.fail_on_invalid.split(",")) == INVALID


def test_a_report_with_no_successful_request_exits_1_after_writing(tmp_path: Path) -> None:
    """Issue 36: a report over zero requests (the requests parts gone, the manifest kept), or
    over requests that all failed, exited 0."""
    b = failed_run("allfailed")
    b.requests = [r for r in b.requests if r["status"] != "ok"]
    run = b.write(tmp_path / "ev")
    done = _cli(str(run), "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 1, done.stderr
    assert "no step holds a successful request (12 request(s) in the steps' windows)" in (
        done.stderr
    )
    assert (tmp_path / "out" / "report.md").is_file()  # written: it says why
    parts = list((tmp_path / "ev" / "allfailed" / "requests").rglob("*.parquet"))
    assert parts
    for part in parts:
        part.unlink()
    for index in (tmp_path / "ev" / "allfailed").rglob("index/*"):
        index.unlink()
    empty = _cli(str(run), "--out", str(tmp_path / "empty"), "--quiet")
    assert empty.returncode == 1 and "(0 request(s)" in empty.stderr, empty.stderr


def test_a_missing_part_is_incomplete_and_fails_on_invalid(tmp_path: Path) -> None:
    b = RunBuilder("gaps", workers=("w1",))
    b.add_step(0, 2, started_s=0, spawned_s=0, ended_s=50)
    for i in range(8):
        b.add_request(sent_s=1.0 + i, chunks=[(0.1, 1), (0.2, 1)], worker="w1")
    uri = b.write(tmp_path / "ev", parts_per_worker=2)
    whole = _cli(uri, "--out", str(tmp_path / "o1"), "--quiet", "--fail-on-invalid")
    assert whole.returncode == 0, whole.stderr
    open_store(uri).delete("chunks/worker=w1/part-000001.parquet")
    cut = _cli(uri, "--out", str(tmp_path / "o2"), "--fail-on-invalid")
    assert cut.returncode == EXIT_INVALID == 4, cut.stdout + cut.stderr
    assert "verdict: incomplete: events are incomplete (1 problem(s)" in cut.stdout
    assert "the run's verdict is incomplete (--fail-on-invalid)" in cut.stderr
    doc = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert doc["verdict"]["verdict"] == "incomplete"
    assert doc["steps"][0]["verdict"] == "incomplete"
    # only the verdicts named fail: an incomplete run passes --fail-on-invalid server-overloaded
    named = _cli(uri, "--out", str(tmp_path / "o3"), "--quiet",
                 "--fail-on-invalid", "server-overloaded")  # fmt: skip
    assert named.returncode == 0, named.stderr
    bad = _cli(uri, "--out", str(tmp_path / "o4"), "--fail-on-invalid", "broken")
    assert bad.returncode == 2 and "--fail-on-invalid 'broken'" in bad.stderr
    assert not (tmp_path / "o4").exists()


def test_a_run_with_no_recorded_end_is_incomplete(tmp_path: Path) -> None:
    b = RunBuilder("running")
    b.add_step(0, 2, started_s=0, spawned_s=0, ended_s=50)
    for i in range(5):
        b.add_request(sent_s=1.0 + i, chunks=[(0.1, 1), (0.2, 1)])
    b.manifest_extra["status"] = "running"
    report = build_report(b.write(tmp_path / "ev"), tmp_path / "out", progress=False, html=False)
    assert report.verdict is not None and report.verdict.verdict == "incomplete"
    assert "no recorded end (status running)" in report.verdict.reasons[0]
