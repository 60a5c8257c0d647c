"""Repeats of one plan (analysis/compare/repeats.py): medians across runs and two-level intervals.

Synthetic runs (tests/support/runs.py) whose TTFTs are drawn from a known distribution: the
intervals of the TTFT median contain its true value in most data seeds, the same seed gives
the same report bit for bit, and a figure with too few data says why instead of an interval.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import load_run, summarize_run
from analysis.compare.bootstrap import FIGURES
from analysis.compare.repeats import (
    REPEATS_KIND,
    RepeatFigure,
    Repeats,
    campaign_runs,
    over_runs,
    summarize_repeats,
)
from analysis.compare.repeats_report import write_repeats
from analysis.kernel.errors import UsageError
from analysis.report.summary import Report
from tests.support.runs import RunBuilder

TTFT_LOW, TTFT_HIGH = 0.010, 0.030  # TTFT ~ U(10 ms, 30 ms): its median is 20 ms
TRUE_MEDIAN = (TTFT_LOW + TTFT_HIGH) / 2


def _run(
    events: Path,
    run_id: str,
    rng: np.random.Generator,
    *,
    levels: tuple[int, ...] = (1, 4),
    requests: int = 60,
    simulated: bool = False,
    config: dict[str, object] | None = None,
) -> str:
    """A closed-loop run: per level a 10 s window holding `requests` requests, each with a
    TTFT drawn from U(TTFT_LOW, TTFT_HIGH), then 4 tokens 5 ms apart."""
    b = RunBuilder(run_id, simulated=simulated)
    for step, level in enumerate(levels):
        start = 20.0 * step
        b.add_step(step, level, started_s=start, spawned_s=start, ended_s=start + 11, warmup_s=1)
        for i in range(requests):
            ttft = float(rng.uniform(TTFT_LOW, TTFT_HIGH))
            sent = start + 1.0 + 9.5 * i / requests
            chunks: list[tuple[float, int] | tuple[float, int, str]] = [
                (ttft + 0.005 * k, 1) for k in range(4)
            ]
            b.add_request(sent_s=sent, step=step, concurrency=level, chunks=chunks,
                          output_tokens=4)  # fmt: skip
    if config:
        b.manifest_extra["config"] = config
    return b.write(events)


def _reports(events: Path, data_seed: int, runs: int = 5, simulated: bool = False) -> list[Report]:
    rng = np.random.default_rng(data_seed)
    uris = [_run(events, f"r{data_seed}-{i}", rng, simulated=simulated) for i in range(runs)]
    return [summarize_run(load_run(u, progress=False, chunks=True)) for u in uris]


def _figure(repeats: Repeats, step: str, name: str) -> RepeatFigure:
    (found,) = [f for f in repeats.figures if f.step == step and f.figure == name]
    return found


def test_the_ttft_median_interval_contains_the_truth_in_most_data_seeds(
    events_dir: Path,
) -> None:
    covered, trials = 0, 12
    for data_seed in range(trials):
        repeats = summarize_repeats(_reports(events_dir, data_seed), resamples=400)
        for step in ("c=1", "c=4"):
            f = _figure(repeats, step, "ttft_p50_s")
            assert f.enough and f.runs == 5 and len(f.values) == 5
            assert f.ci_low is not None and f.ci_high is not None
            assert f.median is not None and f.ci_low <= f.median <= f.ci_high
            assert f.median in f.values  # a value some run measured
            covered += f.ci_low <= TRUE_MEDIAN <= f.ci_high
    # 95% intervals: about 23 of 24 cover; a bootstrap of medians runs a little narrow
    assert covered >= 2 * trials - 4, covered


def test_the_same_seed_gives_the_same_report_and_another_seed_another(
    events_dir: Path,
) -> None:
    reports = _reports(events_dir, 99, runs=3)
    a = summarize_repeats(reports, resamples=200, seed=7).to_json()
    b = summarize_repeats(reports, resamples=200, seed=7).to_json()
    c = summarize_repeats(reports, resamples=200, seed=8).to_json()
    assert a == b
    assert a["figures"] != c["figures"]
    assert [f["median"] for f in a["figures"]] == [f["median"] for f in c["figures"]]


def test_a_figure_with_too_few_data_gets_no_interval_and_says_why(
    events_dir: Path,
) -> None:
    rng = np.random.default_rng(1)
    uris = [_run(events_dir, "many", rng), _run(events_dir, "few", rng, requests=10)]
    reports = [summarize_run(load_run(u, progress=False, chunks=True)) for u in uris]
    repeats = summarize_repeats(reports, resamples=100)
    f = _figure(repeats, "c=1", "ttft_p50_s")
    assert not f.enough and f.ci_low is None and f.ci_high is None
    assert f.why.startswith("run few: 10 successful request(s), fewer than 20")
    assert f.median is not None and f.runs == 2  # the point and the runs' values stay
    p99 = _figure(repeats, "c=1", "ttft_p99_s")  # 60 requests: a p99 needs 500
    assert not p99.enough and "p99 needs 500+ samples" in p99.why


def test_steps_not_in_every_run_are_left_out_with_a_warning(
    events_dir: Path,
) -> None:
    rng = np.random.default_rng(2)
    uris = [_run(events_dir, "a", rng), _run(events_dir, "b", rng, levels=(1, 4, 8))]
    reports = [summarize_run(load_run(u, progress=False, chunks=True)) for u in uris]
    repeats = summarize_repeats(reports, resamples=50)
    assert {f.step for f in repeats.figures} == {"c=1", "c=4"}
    assert len(repeats.figures) == 2 * len(FIGURES)
    assert repeats.unmatched == ["c=8"]
    assert "step c=8 is not in every run (only in b)" in repeats.warnings[0]


def test_a_rate_run_with_a_concurrency_run_is_refused(events_dir: Path) -> None:
    rng = np.random.default_rng(3)
    closed = _run(events_dir, "closed", rng)
    b = RunBuilder("open")
    b.add_rate_step(0, 5.0, started_s=0, ended_s=10, warmup_s=1)
    for i in range(30):
        b.add_arrival(step=0, rate=5.0, index=i, intended_s=1 + i * 0.3, chunks=[(0.02, 1)])
    reports = [summarize_run(load_run(u, progress=False, chunks=True))
               for u in (closed, b.write(events_dir))]  # fmt: skip
    with pytest.raises(UsageError, match="mix rate .* and concurrency steps"):
        summarize_repeats(reports)


def test_over_runs_draws_runs_and_takes_the_lower_median_of_their_resamples() -> None:
    resampled = np.array([[1.0, 10.0], [2.0, np.nan], [3.0, 30.0]])  # 3 runs x 2 resamples
    drawn = np.array([[0, 1, 2], [1, 1, 2]])  # resample 0 draws runs 0,1,2; resample 1: 1,1,2
    assert over_runs(resampled, drawn).tolist() == [2.0, 30.0]
    assert np.isnan(over_runs(resampled, np.array([[1, 1, 1], [1, 1, 1]]))[1])


def test_the_files_say_what_they_hold(events_dir: Path, tmp_path: Path) -> None:
    reports = _reports(events_dir, 5, runs=2, simulated=True)
    repeats = summarize_repeats(reports, resamples=100)
    files = write_repeats(repeats, tmp_path / "out")
    assert set(files) == {"repeats.csv", "repeats.json", "repeats.md", "repeats.html"}
    doc = json.loads(files["repeats.json"].read_text())
    assert doc["kind"] == REPEATS_KIND and doc["schema_version"] == "1.0"
    assert doc["simulated"] is True and doc["runs"] == ["r5-0", "r5-1"]
    assert (doc["seed"], doc["resamples"], doc["confidence"]) == (0, 100, 0.95)
    csv = pd.read_csv(files["repeats.csv"])
    assert list(csv.columns[:8]) == [
        "step", "mode", "concurrency", "rate", "figure", "median", "ci_low", "ci_high",
    ]  # fmt: skip
    assert len(csv) == 2 * len(FIGURES)
    row = csv[(csv["step"] == "c=1") & (csv["figure"] == "ttft_p50_s")].iloc[0]
    assert len(json.loads(row["values"])) == 2 and row["enough"]
    assert "SIMULATED" in files["repeats.md"].read_text()
    html = files["repeats.html"].read_text()
    assert 'id="simulated-banner"' in html and 'id="plot-repeats"' in html


def test_campaign_runs_finds_a_campaigns_runs_by_workload_in_run_order(
    events_dir: Path,
) -> None:
    rng = np.random.default_rng(4)
    for run_id, workload, repeat, cid in (
        ("x-2", "short", 2, "camp-1"), ("x-1", "short", 1, "camp-1"),
        ("y-1", "long", 1, "camp-1"), ("z-1", "short", 1, "camp-2"),
    ):  # fmt: skip
        config = {"campaign_id": cid, "repeat": repeat, "workload_name": workload}
        _run(events_dir, run_id, rng, levels=(1,), requests=2, config=config)
    found = campaign_runs(str(events_dir), "camp-1")
    assert found == {
        "short": [f"{events_dir}/x-1", f"{events_dir}/x-2"],
        "long": [f"{events_dir}/y-1"],
    }
    with pytest.raises(UsageError, match="no run under .* belongs to campaign 'nope'"):
        campaign_runs(str(events_dir), "nope")


def test_repeat_is_a_campaign_key_and_an_option_and_tags_reach_the_manifest_config() -> None:
    from infra.campaign.config import parse_campaign
    from infra.campaign.runner import master_command

    minimal = {"target": {"url": "http://h:1"}, "workload": "D(8,4)"}
    assert parse_campaign(minimal).repeat == 1
    assert parse_campaign({**minimal, "repeat": 5}).repeat == 5
    for bad, said in ((0, "must be >= 1, not 0"), (2.5, "must be an integer, not 2.5")):
        with pytest.raises(UsageError, match=f"key 'repeat' {said}"):
            parse_campaign({**minimal, "repeat": bad})
    c = parse_campaign(minimal)
    cmd = master_command(c, c.workload[0], "r1", 1, {"campaign_id": "cid", "repeat": 2})
    metadata = json.loads(cmd[cmd.index("--metadata") + 1])
    assert (metadata["campaign_id"], metadata["repeat"]) == ("cid", 2)


def test_a_bad_repeat_option_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(f"target: {{url: 'http://127.0.0.1:9'}}\nworkload: 'D(8,4)'\n"
                      f"events_uri: {tmp_path / 'runs'}\n")  # fmt: skip
    assert main(["campaign", str(config), "--repeat", "0", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == "llmload: error: --repeat must be between 1 and 1000, not 0\n"
    assert not (tmp_path / "o").exists() and not (tmp_path / "runs").exists()


def test_report_given_several_runs_writes_each_report_and_the_repeats(
    events_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    rng = np.random.default_rng(6)
    uris = [_run(events_dir, f"s{i}", rng) for i in range(3)]
    out = tmp_path / "out"
    status = main(["report", *uris, "--out", str(out), "--resamples", "50", "--no-html"])
    assert status == 0
    assert all((out / f"s{i}" / "summary.json").is_file() for i in range(3))
    assert not (out / "s0" / "report.html").exists()
    assert sorted(p.name for p in out.glob("repeats.*")) == [
        "repeats.csv", "repeats.json", "repeats.md",
    ]  # fmt: skip
    doc = json.loads((out / "repeats.json").read_text())
    assert (doc["runs"], doc["resamples"]) == (["s0", "s1", "s2"], 50)
    assert "repeats of 3 runs: median [95% interval]" in capsys.readouterr().out
    assert main(["report", "--events-uri", str(events_dir), uris[0]]) == 2
    assert "--events-uri goes with --campaign" in capsys.readouterr().err


def test_a_step_whose_requests_all_failed_in_one_run_has_no_interval(events_dir: Path) -> None:
    rng = np.random.default_rng(7)
    good = _run(events_dir, "good", rng, levels=(1,))
    b = RunBuilder("failed")
    b.add_step(0, 1, started_s=0, spawned_s=0, ended_s=11, warmup_s=1)
    for i in range(30):
        b.add_request(sent_s=1.0 + 0.3 * i, step=0, status="error", error_kind="http_5xx",
                      chunks=[])  # fmt: skip
    reports = [summarize_run(load_run(u, progress=False, chunks=True))
               for u in (good, b.write(events_dir))]  # fmt: skip
    repeats = summarize_repeats(reports, resamples=50)
    for f in repeats.figures:
        assert not f.enough and f.ci_low is None, f
        assert "run failed: 0 successful request(s)" in f.why or "no window" in f.why, f.why
