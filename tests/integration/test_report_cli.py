"""`llmload report` and `llmload compare`: files, exit codes 0/2/3, a planted regression."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from infra.cli import main
from tests.support.runs import RunBuilder, known_run


def steady_run(run_id: str, ttft_s: float = 0.1) -> RunBuilder:
    """Two steps (c=1, c=2) of five requests each; TTFT `ttft_s`, then 4 tokens 20 ms apart."""
    b = RunBuilder(run_id)
    for step, conc in enumerate((1, 2)):
        base = 10.0 * step
        b.add_step(step, conc, started_s=base, spawned_s=base, ended_s=base + 10)
        for i in range(5):
            chunks = [(ttft_s + 0.02 * k, 1) for k in range(4)]
            b.add_request(sent_s=base + 1 + i, step=step, concurrency=conc, chunks=chunks)
    return b


def test_report_writes_every_file(events_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    uri = known_run().write(events_dir)
    out = tmp_path / "out"
    code = main(["report", uri, "--out", str(out), "--slo", "ttft_p99=1", "--quiet"])
    assert code == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            "requests.parquet",
            "requests.csv",
            "summary.csv",
            "summary.json",
            "report.md",
            "report.html",
        ]
    )
    assert capsys.readouterr().out == ""


def test_fail_on_slo_exits_3(events_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    uri = known_run().write(events_dir)
    args = ["report", uri, "--out", str(tmp_path / "o"), "--no-html", "--fail-on-slo"]
    assert main([*args, "--slo", "ttft_p99=0.45"]) == 3
    captured = capsys.readouterr()
    assert "SLO failed in step(s) 0, 2" in captured.err
    assert "highest concurrency meeting the SLO: 4" in captured.out
    assert main([*args, "--slo", "ttft_p99=5"]) == 3  # step 2 has no successful request
    assert (
        main(["report", uri, "--out", str(tmp_path / "p"), "--no-html", "--slo", "ttft_p99=0.45"])
        == 0
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft_p98=0.5", "is unknown"),
        ("ttft_p99", "is not name=value"),
        ("ttft_p99=fast", "is not a number"),
        ("error_rate=2", "between 0 and 1"),
    ],
)
def test_bad_slo_exits_2_and_writes_nothing(
    events_dir: Path,
    tmp_path: Path,
    capsys,
    spec: str,
    message: str,  # type: ignore[no-untyped-def]
) -> None:
    uri = known_run().write(events_dir)
    out = tmp_path / "out"
    assert main(["report", uri, "--out", str(out), "--slo", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_unknown_run_exits_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["report", str(tmp_path / "nope" / "run"), "--out", str(tmp_path / "o")]) == 2
    assert "no llmload run at" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_flags_a_planted_regression(events_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    base = steady_run("base").write(events_dir)
    same = steady_run("same").write(events_dir)
    slow = steady_run("slow", ttft_s=0.13).write(events_dir)  # TTFT +30 %

    rule = ["--method", "threshold"]  # five requests a step: the bootstrap has too few
    assert main(["compare", base, same, "--fail-on-regression", *rule]) == 0
    capsys.readouterr()
    out = tmp_path / "cmp"
    code = main(["compare", base, slow, "--out", str(out), "--fail-on-regression", *rule])
    assert code == 3
    assert "regression(s)" in capsys.readouterr().err
    doc = json.loads((out / "compare.json").read_text())
    flagged = {(c["step"], c["metric"]) for c in doc["changes"] if c["regression"]}
    # TTFT and E2E moved by +30 % and +~21 %; TPOT and ITL did not move
    assert ("c=1", "ttft_p50_s") in flagged and ("c=2", "ttft_p99_s") in flagged
    assert not any(m.startswith(("tpot", "itl")) for _, m in flagged)
    ttft = next(c for c in doc["changes"] if (c["step"], c["metric"]) == ("c=1", "ttft_p50_s"))
    assert ttft["change"] == pytest.approx(0.3)
    assert "REGRESSION" in (out / "compare.md").read_text()
    assert main(["compare", base, slow, *rule]) == 0  # flagged, but no --fail-on-regression


def test_compare_accepts_report_directories(events_dir: Path, tmp_path: Path) -> None:
    base = steady_run("base").write(events_dir)
    slow = steady_run("slow", ttft_s=0.2).write(events_dir)
    assert main(["report", base, "--out", str(tmp_path / "a"), "--no-html", "--quiet"]) == 0
    assert main(["report", slow, "--out", str(tmp_path / "b"), "--no-html", "--quiet"]) == 0
    args = ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-on-regression"]
    assert main([*args, "--method", "threshold"]) == 3
    assert main(args) == 2  # the bootstrap needs the runs themselves


def test_fail_on_slo_without_objectives_is_a_usage_error(events_dir: Path, tmp_path: Path) -> None:
    uri = known_run().write(events_dir)
    out = tmp_path / "out"
    assert main(["report", uri, "--out", str(out), "--fail-on-slo", "--slo", "ttft=1"]) == 2
    assert not out.exists()


def test_requests_csv_only_up_to_csv_rows(events_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    uri = known_run().write(events_dir)
    big, forced = tmp_path / "big", tmp_path / "forced"
    assert main(["report", uri, "--out", str(big), "--csv-rows", "2", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert not (big / "requests.csv").exists() and (big / "requests.parquet").exists()
    assert "llmload: warning: requests.csv not written: " in err and "--csv-rows 2" in err
    assert "requests.csv not written" in (big / "report.md").read_text()
    assert main(["report", uri, "--out", str(forced), "--csv-rows", "0", "--quiet"]) == 0
    rows = len((forced / "requests.csv").read_text().splitlines()) - 1
    assert rows == len(pq.read_table(forced / "requests.parquet")) > 2
    assert main(["report", uri, "--out", str(forced), "--csv-rows", "-1", "--quiet"]) == 2
    assert "--csv-rows must be >= 0" in capsys.readouterr().err
