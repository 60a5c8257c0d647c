"""Open-loop rate steps across two real worker processes, judged by the server's truth log.

The arrival schedule is seeded, so each run's realised schedule is the same every time: the
tests compare what the server received with the schedule the workers were meant to send
(`locustfiles.traffic.arrivals.Schedule`), and with the rate and distribution asked for.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from locustfiles.traffic.arrivals import Schedule
from tests.support.chat import LocustResult, run_locust, start_sim, unseen_by_server
from tests.support.ks import cv, ks_exponential

RATE = 40.0
DURATION_S = 12.0
WARMUP_S = 1.0


def _run(
    tmp: Path, arrival: str, *extra: str
) -> tuple[LocustResult, pd.DataFrame, dict[str, Any], dict[str, Any]]:
    with start_sim(tmp, "--profile", "tiny") as sim:
        result = run_locust(
            sim.url, tmp / "runs", "--rates", str(RATE), "--arrival", arrival,
            "--step-duration", str(DURATION_S), "--step-warmup", str(WARMUP_S),
            "--cold-requests", "0", "--workload", "D(16,4)", "--seed", "0", *extra,
            workers=2, timeout=120,
        )  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, _chunks, manifest = result.events()
    return result, requests, manifest, truth


def _server_arrivals(
    requests: pd.DataFrame, truth: dict[str, Any], step: dict[str, Any]
) -> list[int]:
    """Server receive times (ns) of the step's requests whose intended time is in the step."""
    sent = requests[requests["status"] != "dropped"]
    unseen = unseen_by_server(sent, truth)  # only requests cut by the run's end may be missing
    rows = sent[(sent["step"] == step["step"]) & ~sent["request_id"].isin(unseen["request_id"])]
    return sorted(truth[r]["arrival_unix_ns"] for r in rows["request_id"])


@pytest.fixture(scope="module")
def poisson(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return _run(tmp_path_factory.mktemp("poisson"), "poisson")


def test_two_workers_send_the_one_global_schedule(poisson: tuple[Any, ...]) -> None:
    _, requests, manifest, _ = poisson
    (step,) = manifest["steps"]
    assert step["rate"] == RATE and step["arrival"] == "poisson"
    assert len(step["share_workers"]) == 2
    rows = requests[requests["step"] == 0]
    assert rows["rate"].eq(RATE).all()
    by_worker = rows.groupby("worker_id")["arrival_index"].apply(set)
    assert len(by_worker) == 2
    for position, worker in enumerate(step["share_workers"]):
        assert all(i % 2 == position for i in by_worker[worker])  # each sent its own share
    indexes = sorted(rows["arrival_index"])
    assert indexes == list(range(len(indexes)))  # every arrival once, none missing
    # exactly the arrivals the schedule has inside the step, each with its row (sent, or
    # `dropped` if its worker, behind its schedule, had not sent it when the run stopped);
    # the rows after the step's end are the arrivals due until the workers heard of it
    length_s = (step["ended_at_ns"] - step["started_at_ns"]) / 1e9
    expected = list(itertools.takewhile(lambda a: a[1] < length_s,
                                        Schedule(RATE, "poisson", 0, 0).arrivals()))  # fmt: skip
    offset_ns = {w["worker_id"]: w["clock_offset_ms"] * 1e6 for w in manifest["workers"]}
    intended_on_master = rows["intended_ns"] - rows["worker_id"].map(offset_ns)
    inside = rows[intended_on_master < step["ended_at_ns"]]
    assert abs(len(inside) - len(expected)) <= 1  # the last may fall either side of the end


def test_merged_arrivals_have_the_rate_and_are_poisson(poisson: tuple[Any, ...]) -> None:
    _, requests, manifest, truth = poisson
    (step,) = manifest["steps"]
    times = _server_arrivals(requests, truth, step)
    span_s = (times[-1] - times[0]) / 1e9
    rate = (len(times) - 1) / span_s
    assert rate == pytest.approx(RATE, rel=0.05)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    d, p = ks_exponential(gaps, rate)
    assert p > 0.01, (d, p)


def test_slip_is_recorded_for_every_request(poisson: tuple[Any, ...]) -> None:
    _, requests, _, _ = poisson
    rows = requests[requests["step"] == 0]
    assert rows["intended_ns"].notna().all() and rows["queued_ns"].eq(0).all()
    slip_ms = (rows["sent_at_ns"] - rows["intended_ns"] - rows["queued_ns"]) / 1e6
    assert (slip_ms >= 0).all()  # nothing is sent before its time
    # how late is the machine's load, not the code's: no bound here (a CI box running other
    # suites beside this one once had a median of 33 ms); the report judges it (next test),
    # bench/ measures it


def test_the_report_gives_the_achieved_rate_and_the_slip(
    poisson: tuple[Any, ...], tmp_path: Path
) -> None:
    from analysis import build_report

    result, requests, manifest, _ = poisson
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=True)
    (row,) = [r for r in report.step_rows if r.get("group") == "step"]
    assert row["mode"] == "rate" and row["rate"] == RATE
    sent = requests[(requests["step"] == 0) & (requests["status"] != "dropped")]
    lo, hi = row["window_start_ns"], row["window_end_ns"]
    in_window = sent[sent["sent_at_ns"].between(lo, hi)]
    assert row["rate_achieved"] == pytest.approx(len(in_window) / row["window_s"])
    slip = sorted(((in_window["sent_at_ns"] - in_window["intended_ns"]) / 1e6).tolist())
    assert row["slip_max_ms"] == pytest.approx(slip[-1], abs=1e-3)
    assert 0 <= row["slip_p50_ms"] <= row["slip_p99_ms"] <= row["slip_max_ms"]
    assert row["requests_dropped"] == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["steps"][0]["slip_p99_ms"] == pytest.approx(row["slip_p99_ms"])
    assert "plot-latency-rate" in (tmp_path / "report" / "report.html").read_text()


@pytest.mark.slow
def test_gamma_arrivals_have_the_asked_burstiness(tmp_path: Path) -> None:
    _, requests, manifest, truth = _run(tmp_path, "gamma:2")
    (step,) = manifest["steps"]
    assert step["arrival"] == "gamma:2"
    times = _server_arrivals(requests, truth, step)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    assert cv(gaps) == pytest.approx(2.0, rel=0.15)
    assert (len(times) - 1) / ((times[-1] - times[0]) / 1e9) == pytest.approx(RATE, rel=0.15)


@pytest.mark.slow
def test_a_worker_that_joins_gets_a_share_at_the_next_step(tmp_path: Path) -> None:
    """One worker at the start; a second joins during step 0: step 1 is shared by both."""
    import os
    import subprocess
    import threading
    import time

    from infra.ports import free_port
    from tests.support.chat import BIN, LOCUSTFILE, reap, start_worker

    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with start_sim(tmp_path, "--profile", "tiny") as sim:
        first = start_worker(port, env)
        late: list[subprocess.Popen[str]] = []
        timer = threading.Timer(4.0, lambda: late.append(start_worker(port, env)))
        timer.start()
        try:
            master = subprocess.run(
                [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                 "--host", sim.url, "--events-uri", str(tmp_path / "runs"),
                 "--spool-dir", str(tmp_path / "spool"), "--master", "--master-bind-host",
                 "127.0.0.1", "--master-bind-port", str(port), "--expect-workers", "1",
                 "--rates", "20,20", "--arrival", "constant", "--step-duration", "8",
                 "--step-warmup", "1", "--cold-requests", "0", "--workload", "D(16,4)"],
                capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, env=env,
            )  # fmt: skip
        finally:
            timer.cancel()
            for proc in [first, *late]:
                try:
                    proc.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    reap(proc)
        truth = sim.truth()
        del time
    assert master.returncode == 0, master.stderr[-3000:]
    result = LocustResult(0, "", tmp_path / "runs")
    requests, _, manifest = result.events()
    first_step, second_step = manifest["steps"]
    assert len(first_step["share_workers"]) == 1 and len(second_step["share_workers"]) == 2
    assert first_step["share_workers"][0] in second_step["share_workers"]
    rows = requests[requests["step"] == 1]
    assert rows["worker_id"].nunique() == 2
    indexes = sorted(rows["arrival_index"])
    assert indexes == list(range(len(indexes)))  # the new share: nothing lost, nothing twice
    unseen_by_server(requests, truth)


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_over_the_cap_arrivals_wait_or_are_dropped(tmp_path: Path) -> None:
    """Requests of about 0.4 s at 20/s need 8 in flight: a cap of 2 makes the rest wait, or drop."""
    slow = ("--decode-base-ms", "20", "--decode-per-seq-us", "0", "--decode-per-kv-token-ns", "0")
    outcomes = {}
    for over_cap in ("drop", "wait"):
        work = tmp_path / over_cap
        with start_sim(work, *slow) as sim:
            result = run_locust(
                sim.url, work / "runs", "--rates", "20", "--arrival", "constant",
                "--max-concurrency", "2", "--over-cap", over_cap, "--step-duration", "4",
                "--step-warmup", "0.5", "--cold-requests", "0", "--workload", "D(16,20)",
                timeout=90,
            )  # fmt: skip
            truth = sim.truth()
        assert result.returncode == 0, result.output[-3000:]
        requests, _, _ = result.events()
        outcomes[over_cap] = (requests, truth)
    dropped_run, truth = outcomes["drop"]
    dropped = dropped_run[dropped_run["status"] == "dropped"]
    sent = dropped_run[dropped_run["status"] != "dropped"]
    assert len(dropped) > len(sent) > 0  # most arrivals find both slots taken
    assert not set(dropped["request_id"]) & set(truth)  # a dropped arrival never reached it
    unseen_by_server(sent, truth)
    assert dropped["intended_ns"].notna().all() and dropped["end_ns"].isna().all()
    waited_run, _ = outcomes["wait"]
    stopped = waited_run[waited_run["status"] == "dropped"]  # still waiting at the end only
    assert stopped["error_detail"].str.contains("when the run stopped").all()
    queued = waited_run[waited_run["status"] == "ok"]["queued_ns"]
    assert (queued > 0).mean() > 0.5  # most waited for a slot
    assert queued.max() > 1e9  # and the queue grew: 20/s in, about 5/s out
