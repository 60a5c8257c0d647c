"""A capacity search in a campaign: the master's exit status 3 (even the lowest level missed
the SLO) is a complete run, reported, and the campaign exits 3 after every workload; the
line that says what the search found. The Locust master is a stand-in process here."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import infra.campaign.report as campaign_report
import infra.campaign.runner as runner
from analysis.kernel.slo import Slo, parse_slo
from infra.campaign import CampaignError, parse_campaign
from infra.campaign.report import describe, report_run, search_line
from infra.cli import main
from tests.support.runs import known_run

SEARCH: dict[str, Any] = {
    "target": {"url": "http://127.0.0.1:8000"},
    "workload": "D(16,8)",
    "rates": [1, 2, 4],
    "search": "rate",
    "slo": "ttft_p99=0.5",
    "workers": 1,
}


@dataclass
class FakeReport:
    """What the campaign reads of a report after a run."""

    manifest: dict[str, Any]
    slo: Slo = field(default_factory=lambda: parse_slo("ttft_p99=0.5"))
    warnings: list[str] = field(default_factory=list)
    slo_failed: bool = False


def _search(status: str, result: float | None, **more: Any) -> dict[str, Any]:
    probes = [
        {"step": 0, "level": 1.0, "phase": "coarse", "passed": status != "lowest_failed",
         "failures": [] if status != "lowest_failed" else ["ttft_p99 0.61 > 0.5"]},
    ]  # fmt: skip
    return {
        "mode": "rate", "slo": "ttft_p99=0.5", "precision": 0.05, "min_requests": 100,
        "status": status, "probes": probes,
        "result": None if result is None else {"level": result, "step": 3}, **more,
    }  # fmt: skip


def _report(search: dict[str, Any] | None) -> Any:
    return FakeReport({"search": search})


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        (None, None),
        (_search("found", 6.5), "capacity search: highest rate meeting the SLO: 6.5 requests/s"),
        (_search("all_passed", 4.0), "capacity search: highest rate meeting the SLO: 4 requests/s (the highest level tried: the capacity is above it; add higher levels)"),
        (_search("lowest_failed", None), "capacity search: even the lowest level (1 requests/s) missed the SLO ttft_p99=0.5 (ttft_p99 0.61 > 0.5)"),
        (_search("stopped", 2.0), "capacity search: highest rate meeting the SLO: 2 requests/s so far: the search did not finish (status stopped)"),
        ({**_search("found", 8), "mode": "concurrency"}, "capacity search: highest concurrency meeting the SLO: 8"),
        ({"status": "lowest_failed"}, "capacity search: even the lowest level (none) missed the SLO ttft_p99=0.5"),
    ],
)  # fmt: skip
def test_search_line_says_what_the_search_found(
    search: dict[str, Any] | None, expected: str | None
) -> None:
    assert search_line(_report(search)) == expected


def _stand_in(monkeypatch: pytest.MonkeyPatch, master_exit: int) -> None:
    """A master that exits with `master_exit` at once, a worker that exits 0."""
    exit_with = [sys.executable, "-c", f"import sys; sys.exit({master_exit})"]
    monkeypatch.setattr(runner, "master_command", lambda *args: exit_with)
    monkeypatch.setattr(runner, "worker_command", lambda *args: [sys.executable, "-c", "pass"])


@pytest.mark.parametrize("search", ["rate", "off"])
def test_master_exit_3_completes_a_search_and_fails_any_other_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, search: str
) -> None:
    _stand_in(monkeypatch, 3)
    campaign = parse_campaign({**SEARCH, "search": search})
    env: dict[str, str] = {}

    def run() -> int:
        return runner.run_workload(campaign, campaign.workload[0], "r1", tmp_path, env, print)

    if search == "off":
        with pytest.raises(CampaignError, match="exited with status 3"):
            run()
    else:
        assert run() == runner.EXIT_SEARCH_LOWEST_FAILED


def test_a_master_that_fails_otherwise_still_fails_a_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(monkeypatch, 1)
    campaign = parse_campaign(SEARCH)
    with pytest.raises(CampaignError, match="exited with status 1"):
        runner.run_workload(
            campaign, campaign.workload[0], "r1", tmp_path / "logs", {}, lambda line: None
        )


def test_a_failed_master_is_named_in_its_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master's `llmload: error:` lines lead the campaign's error, whatever its log's
    tail holds (Locust prints its tables after them)."""
    said = "llmload: error: run r1: no worker confirmed its events (w on h)"
    code = f"import sys; print({said!r}); print('table\\n' * 40); sys.exit(1)"
    monkeypatch.setattr(runner, "master_command", lambda *a: [sys.executable, "-c", code])
    monkeypatch.setattr(runner, "worker_command", lambda *args: [sys.executable, "-c", "pass"])
    campaign = parse_campaign(SEARCH)
    with pytest.raises(CampaignError) as failed:
        runner.run_workload(
            campaign, campaign.workload[0], "r1", tmp_path / "logs", {}, lambda line: None
        )
    first = str(failed.value).splitlines()[0]
    assert first.startswith("the Locust master of run r1 exited with status 1: run r1: no ")
    assert "confirmed its events (w on h); log " in first


def _campaign_file(tmp_path: Path, workloads: int) -> Path:
    specs = ", ".join(f"{{name: w{i}, spec: 'D(16,8)'}}" for i in range(workloads))
    path = tmp_path / "c.yaml"
    path.write_text(
        "target: {url: 'http://127.0.0.1:8000'}\n"
        f"workload: [{specs}]\n"
        "rates: [1, 2, 4]\nsearch: rate\nslo: ttft_p99=0.5\nworkers: 1\n"
        f"events_uri: {tmp_path / 'runs'}\n"
    )
    return path


def test_campaign_reports_every_workload_then_exits_3_when_the_lowest_level_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    statuses = iter([3, 0])  # the first workload's search fails at its lowest level
    searches = iter([_search("lowest_failed", None), _search("found", 2.5)])
    reported: list[str] = []

    def master(*args: Any) -> list[str]:
        return [sys.executable, "-c", f"import sys; sys.exit({next(statuses)})"]

    def report_run(run_uri: str, out_dir: Path, slo: str) -> Any:
        reported.append(run_uri)
        return _report(next(searches))

    monkeypatch.setattr(runner, "master_command", master)
    monkeypatch.setattr(runner, "worker_command", lambda *args: [sys.executable, "-c", "pass"])
    monkeypatch.setattr(runner, "report_run", report_run)
    monkeypatch.setattr(campaign_report, "describe", lambda report, label="": label)
    status = main(["campaign", str(_campaign_file(tmp_path, 2)), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert status == 3 and len(reported) == 2  # the second workload ran after the failure
    assert (
        "llmload campaign: capacity search: even the lowest level (1 requests/s) missed the "
        "SLO ttft_p99=0.5 (ttft_p99 0.61 > 0.5)\n"
    ) in out
    assert (
        "llmload campaign: capacity search: highest rate meeting the SLO: 2.5 requests/s\n" in out
    )
    assert "llmload: capacity search: even the lowest level missed the SLO in campaign-" in err
    assert err.count("-w0") == 1 and "-w1" not in err  # names the failed run, not the other


def test_campaign_exits_0_when_the_search_found_a_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stand_in(monkeypatch, 0)
    monkeypatch.setattr(runner, "report_run", lambda *a: _report(_search("found", 4.0)))
    monkeypatch.setattr(campaign_report, "describe", lambda report, label="": label)
    assert main(["campaign", str(_campaign_file(tmp_path, 1)), "--out", str(tmp_path)]) == 0
    assert "capacity search: highest rate meeting the SLO: 4 requests/s" in capsys.readouterr().out


def test_exit_3_without_a_search_record_is_still_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(monkeypatch, 3)
    monkeypatch.setattr(runner, "report_run", lambda *a: _report(None))
    lines: list[str] = []
    campaign = parse_campaign({**SEARCH, "events_uri": str(tmp_path / "runs")})
    (result,) = runner.run_campaign(campaign, tmp_path / "out", echo=lines.append)
    assert result.lowest_failed and result.master_status == 3 and result.search is None
    assert lines[-1] == (
        "capacity search: even the lowest level (1 requests/s) missed the SLO ttft_p99=0.5 "
        "(master exit status 3)"
    )


def test_describe_says_what_the_search_found_instead_of_the_step_verdict(
    events_dir: Path, tmp_path: Path
) -> None:
    run = known_run("searched")
    run.manifest_extra["search"] = {**_search("found", 2), "mode": "concurrency"}
    report = report_run(run.write(events_dir), tmp_path / "out", "ttft_p99=0.45")
    text = describe(report, label="workload a: ")
    assert text.startswith("workload a: run searched\n")
    assert "\ncapacity search: highest concurrency meeting the SLO: 2\n" in text
    assert "SLO FAILED" not in text  # levels above the capacity fail by design
    plain = describe(report_run(known_run().write(events_dir), tmp_path / "o2", "ttft_p99=0.45"))
    assert "SLO FAILED; highest concurrency meeting it: " in plain


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_worker_that_fails_while_its_master_ends_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master exits 0, then its worker exits 2: the run fails naming the worker."""
    ended = tmp_path / "master-ended"
    # The master leaves a mark and exits 0; the worker exits 2 half a second after that
    # mark, so the master's end is seen first (the branch after _wait_for_master).
    monkeypatch.setattr(
        runner, "master_command", lambda *a: _python(f"open({str(ended)!r}, 'w').close()")
    )
    monkeypatch.setattr(runner, "worker_command", lambda *a: _python(
        "import os, sys, time\n"
        f"while not os.path.exists({str(ended)!r}): time.sleep(0.05)\n"
        "time.sleep(0.5); print('cannot start: no tokenizer here'); sys.exit(2)"
    ))  # fmt: skip
    campaign = parse_campaign({**SEARCH, "search": "off"})
    with pytest.raises(CampaignError) as caught:
        runner.run_workload(campaign, campaign.workload[0], "r1", tmp_path / "logs", {}, print)
    message = str(caught.value)
    assert message.startswith("worker-1 of run r1 exited with status 2; log "), message
    assert str(tmp_path / "logs" / "worker-1.log") in message
    assert "cannot start: no tokenizer here" in message  # the worker's own last lines
    assert "during the run" not in message


def test_a_worker_that_fails_during_the_run_fails_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker exits 2 while the master still runs: the run fails without waiting for it."""
    monkeypatch.setattr(runner, "master_command", lambda *a: _python("import time; time.sleep(20)"))
    monkeypatch.setattr(runner, "worker_command", lambda *a: _python(
        "import sys; print('lost the master'); sys.exit(2)"
    ))  # fmt: skip
    campaign = parse_campaign({**SEARCH, "search": "off", "workers": 2})
    with pytest.raises(CampaignError) as caught:
        runner.run_workload(campaign, campaign.workload[0], "r1", tmp_path / "logs", {}, print)
    message = str(caught.value)
    assert " exited with status 2 during the run; log " in message, message
    assert message.split(" ", 1)[0] in ("worker-1", "worker-2")
    assert "lost the master" in message
    assert "the Locust master" not in message
