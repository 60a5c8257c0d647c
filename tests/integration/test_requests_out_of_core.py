"""The request rows out of core (analysis/steps/outofcore.py, the default of `llmload report`)
against the in-memory reference (`--in-memory`), column by column: every stored golden run
(staircase with cold requests, rate, sessions, trace replay, engine spans: real runs against
the simulator) and a hand-made run of every kind of figure the engine computes (two models,
split or not, clock offsets, a step without a timeline, stalls of the workers' loops that
move the percentiles, error kinds, replayed prompts, cached tokens, new connections, dropped
and queued arrivals, goodput thresholds)."""

from __future__ import annotations

from pathlib import Path

import pytest

import analysis.steps.outofcore
from analysis import build_report, compare_runs, load_run, summarize_run
from analysis.compare.runs import Comparison, compare_reports
from analysis.report.summary import Report
from tests.integration.test_out_of_core import assert_same_reports
from tests.support.runs import RunBuilder, ns
from tests.support.synthetic import write_run

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "events"
COVERED = {"demo", "rate", "session", "spans", "trace"}


def both(uri: str, out: Path, **kwargs: object) -> tuple[Report, Report]:
    disk = build_report(uri, out / "disk", progress=False, html=False, **kwargs)  # type: ignore[arg-type]
    memory = build_report(uri, out / "memory", progress=False, html=False, in_memory=True,
                          **kwargs)  # type: ignore[arg-type]  # fmt: skip
    return disk, memory


@pytest.mark.parametrize("case", sorted(p.name for p in GOLDEN.iterdir()))
def test_every_golden_run_is_the_same_on_disk_and_in_memory(case: str, tmp_path: Path) -> None:
    (run,) = (GOLDEN / case).iterdir()
    disk, memory = both(str(run), tmp_path, slo="ttft_p99=0.5,ttft=0.3,tpot=0.05")
    assert (disk.table.done_ns is None) == (case in COVERED)  # which path it took
    assert memory.table.done_ns is not None
    assert_same_reports(disk, memory)
    timeline, reference = disk.table.timeline_bins(), memory.table.timeline_bins()
    assert timeline.sent == reference.sent and timeline.t0 == reference.t0
    assert (timeline.in_flight == reference.in_flight).all()
    assert (timeline.errors == reference.errors).all()


def every_kind() -> RunBuilder:
    b = RunBuilder("kinds", workers=("w1", "w2", "w3"))
    b.manifest_extra["workers"] = [
        {"worker_id": "w1", "host": "a", "pid": 1, "clock_offset_ms": 250.0},
        {"worker_id": "w2", "host": "a", "pid": 2, "clock_offset_ms": -40.0},
        {"worker_id": "w3", "host": "b", "pid": 3, "clock_offset_ms": None},
    ]
    # shared prefixes of 64 tokens in 16-token blocks: the implied cache share per step
    b.manifest_extra["config"] = {"users": 8, "prefix_tokens": 64, "prefix_groups": 2,
                                  "engine_block_size": 16}  # fmt: skip
    b.add_step(0, 4, started_s=10, spawned_s=10, ended_s=30, warmup_s=2)
    b.add_rate_step(1, 6.0, started_s=30, ended_s=40, warmup_s=0, max_concurrency=2,
                    over_cap="drop")  # fmt: skip
    # step 2 has no timeline: its window is its requests' span
    b.add_request(sent_s=0.5, cold=True, worker="w1", chunks=[(0.4, 1), (0.5, 2)], end_s=0.6)
    b.add_request(sent_s=1.5, cold=True, worker="w2", chunks=[(0.3, 1)], end_s=0.4,
                  model="m-b")  # fmt: skip
    for i in range(40):
        worker = ("w1", "w2", "w3")[i % 3]
        model = "m-a" if i % 4 else "m-b"
        status, kind = "ok", None
        if i % 11 == 5:
            status, kind = "error", ("http_5xx", "timeout", "weird_kind")[i % 3]
        elif i == 13:
            status, kind = "cancelled", "cancelled"
        first = 0.3 if i == 6 else 0.05 + 0.011 * (i % 7)  # request 6: the slowest TTFT
        chunks = [(first, 1 + i % 2), (first + 0.02 * (1 + i % 5), 1), (first + 0.15, 2 + i % 3)]
        extra: dict[str, object] = {
            "worker_stall_ns": {3: ns(0.008), 6: ns(0.05), 17: ns(0.008)}.get(i, 0),
            "coalesced_events": i % 3,
            "cached_tokens": 32 if i % 2 else None,
            "client_delay_ns": 100_000 * (1 + i % 9),
            "connect_new": i < 6,
            "connect_ns": 900_000 + 10_000 * i if i < 6 else None,
            "output_tokens_source": "events" if i == 7 else "usage",
        }
        if i == 9:
            extra["scenario"] = "dataset:prompts.jsonl"
        b.add_request(sent_s=11.0 + 0.45 * i, step=0, concurrency=4, worker=worker,
                      chunks=chunks if status == "ok" else chunks[:1], end_s=first + 0.2,
                      status=status, error_kind=kind, model=model,
                      prompt_tokens=100 + (i % 5) * 30, prompt_tokens_requested=100 + (i % 3) * 40,
                      **extra)  # fmt: skip
    for i in range(24):
        b.add_arrival(step=1, rate=6.0, index=i, intended_s=30.2 + i / 2.5, slip_s=0.0007 * i,
                      queued_s=0.01 * (i % 4), max_concurrency=2, dropped=i % 7 == 3,
                      chunks=[(0.04, 1), (0.09, 1), (0.1 + 0.001 * i, 1)], end_s=0.15,
                      worker=("w1", "w2")[i % 2])  # fmt: skip
    for i in range(8):
        b.add_request(sent_s=45.0 + 0.3 * i, step=2, concurrency=8, worker="w3",
                      chunks=[(0.1, 1), (0.2 + 0.01 * i, 1)], end_s=0.3)  # fmt: skip
    for worker in ("w1", "w2", "w3"):
        for second in range(12, 50, 2):
            b.add_sample(worker, at_s=float(second), cpu=20.0 + second % 7 + (worker == "w2") * 70,
                         lags_us=[200, 300 + second, 7_000 if second % 10 == 0 else 400])  # fmt: skip
    # the stalls of requests 3 and 6 (step 0, w1's loop) inside their TTFT: the TTFT p99 (of
    # request 6) could have been 50 ms less; request 17's worker (w3) has no stall rows
    b.add_stall("w1", start_s=11.0 + 0.45 * 3 + 0.01, length_s=0.008)
    b.add_stall("w1", start_s=11.0 + 0.45 * 6 + 0.1, length_s=0.05)
    b.add_stall("w1", start_s=5.0, length_s=0.02)  # before anything of step 0
    return b


@pytest.mark.parametrize("by", [None, "model"])
def test_every_kind_of_figure_is_the_same(tmp_path: Path, by: str | None) -> None:
    uri = every_kind().write(tmp_path / "ev", parts_per_worker=2)
    disk, memory = both(uri, tmp_path, slo="ttft_p99=0.3,ttft=0.1,e2e=0.3", by=by)
    assert disk.table.done_ns is None
    assert_same_reports(disk, memory)
    rows = disk.step_rows
    assert {r.get("model") for r in rows} == ({"m-a", "m-b", "tiny-llama"} if by else {None})
    first = [r for r in rows if r["step"] == 0]
    assert any(r["stall_moved_pct"] > 0 for r in first), first  # the ASOF join moved something
    assert any(r["errors_other"] for r in first) and any(r["cached_tokens_pct"] > 0 for r in first)
    assert all(r["cached_implied_pct"] > 0 for r in first if r["ok"])
    rate = [r for r in rows if r["step"] == 1]
    assert sum(r["requests_dropped"] for r in rate) > 0 and sum(r["requests_queued"] for r in rate)
    assert any("no step timeline for step(s) 2" in w for w in disk.warnings)
    if by is None:
        assert any("asked for 3 models" in w for w in disk.warnings)


def test_a_request_id_twice_is_refused_the_same_way(tmp_path: Path) -> None:
    b = RunBuilder("twice", workers=("w1", "w2"))
    b.add_step(0, 1, started_s=0, spawned_s=0, ended_s=10)
    b.add_request(sent_s=1.0, worker="w1", chunks=[(0.1, 1)], request_id="same")
    b.add_request(sent_s=2.0, worker="w2", chunks=[(0.1, 1)], request_id="same")
    uri = b.write(tmp_path / "ev")
    messages = []
    for in_memory in (False, True):
        with pytest.raises(Exception) as caught:
            build_report(uri, tmp_path / str(in_memory), progress=False, html=False,
                         in_memory=in_memory)  # fmt: skip
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "request id same appears in more than one" in messages[0]


def _decisions(result: Comparison) -> list[tuple[object, ...]]:
    """Each change's step, metric, verdict and reason, its values and interval to 1e-9 (the
    means' last bits: tests/golden/cases.py)."""

    def close(value: float | None) -> object:
        return None if value is None else pytest.approx(value, rel=1e-9, nan_ok=True)

    return [(c.step, c.metric, c.verdict, c.why, close(c.a), close(c.b), close(c.ci_low),
             close(c.ci_high)) for c in result.changes]  # fmt: skip


def test_compare_decides_as_the_in_memory_bootstrap(tmp_path: Path) -> None:
    """compare's bootstrap out of core (each step drawn from the engine: every request of a
    step under BOOTSTRAP_SAMPLE) gives the in-memory bootstrap's intervals and verdicts."""
    a = write_run(tmp_path / "a", 12_000, 3, workers=2, parts=2, seed=1)
    b = write_run(tmp_path / "b", 12_000, 3, workers=2, parts=2, seed=2)
    disk = compare_runs(str(a), str(b), resamples=200)
    memory = compare_reports(
        summarize_run(load_run(str(a), chunks=True), None),
        summarize_run(load_run(str(b), chunks=True), None),
        run_a=str(a), run_b=str(b), resamples=200,
    )  # fmt: skip
    assert [c for c in disk.changes if c.method == "bootstrap"]
    assert any(c.ci_low is not None for c in disk.changes)
    assert _decisions(disk) == _decisions(memory)


def test_compare_of_steps_larger_than_the_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of more requests than BOOTSTRAP_SAMPLE resamples a seeded sample of them: the
    figures stay exact, the intervals come from the sample, the same for the same seed."""
    a = write_run(tmp_path / "a", 12_000, 3, workers=2, parts=2, seed=1)
    b = write_run(tmp_path / "b", 12_000, 3, workers=2, parts=2, seed=2)
    full = compare_runs(str(a), str(b), resamples=200)
    monkeypatch.setattr(analysis.steps.outofcore, "BOOTSTRAP_SAMPLE", 300)
    first, again = (compare_runs(str(a), str(b), resamples=200) for _ in range(2))
    assert _decisions(first) == _decisions(again)
    # to the last bit: the sample's ITL samples are resampled in one order, whatever order the
    # engine's threads gave them in
    assert [(c.a, c.b, c.ci_low, c.ci_high) for c in first.changes] == [
        (c.a, c.b, c.ci_low, c.ci_high) for c in again.changes
    ]
    assert [(c.a, c.b) for c in first.changes] == [(c.a, c.b) for c in full.changes]  # exact
    assert _decisions(first) != _decisions(full)  # drawn from fewer requests
    run = load_run(str(a), chunks=False, requests=False)
    report = summarize_run(run, None, bootstrap=(10, 0))
    assert report.disk_steps is not None
    for step in report.disk_steps.values():
        assert step.requests > 1_000 and 100 < len(step.done_ns) < 600
