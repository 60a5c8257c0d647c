"""`llmload report` out of core (the default: analysis/derive/chunkfacts.py on the DuckDB engine)
gives the figures of the in-memory numpy path (`in_memory=True`), column by column: on a run
of 1.1M chunk rows, on open-loop and session runs, and on the same impossible timelines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import build_report
from analysis.derive.chunkfacts import _BIN_S, EngineChunkFacts
from analysis.kernel.errors import InvalidTimelineError, UsageError
from analysis.report.summary import Report
from tests.support.runs import RunBuilder, known_run, ns
from tests.support.synthetic import write_run


def assert_same_frames(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert list(a.columns) == list(b.columns), what
    assert len(a) == len(b), what
    for column in a.columns:
        x, y = a[column], b[column]
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            xs = pd.to_numeric(x, errors="coerce").to_numpy(np.float64, na_value=np.nan)
            ys = pd.to_numeric(y, errors="coerce").to_numpy(np.float64, na_value=np.nan)
            assert np.array_equal(np.isnan(xs), np.isnan(ys)), (what, column)
            assert np.allclose(xs, ys, rtol=1e-12, atol=0, equal_nan=True), (what, column)
        else:
            assert x.astype(str).tolist() == y.astype(str).tolist(), (what, column)


def assert_same_reports(out_of_core: Report, in_memory: Report) -> None:
    assert_same_frames(out_of_core.summary, in_memory.summary, "summary")
    # the engine writes requests.parquet in its own row order: the rows are compared by id
    mine, theirs = (r.per_request.sort_values("request_id", ignore_index=True)
                    for r in (out_of_core, in_memory))  # fmt: skip
    assert_same_frames(mine, theirs, "per request")
    for mine, theirs in zip(out_of_core.table.curves, in_memory.table.curves, strict=True):
        for metric, curve in theirs.items():
            if metric in ("itl", "icl"):  # the plots' curves: the histogram's bins, at most one
                # bin below (analysis/derive/chunkfacts.py), never above
                assert np.array_equal(np.isnan(mine[metric]), np.isnan(curve)), metric
                gap = (curve - mine[metric])[~np.isnan(curve)]
                assert ((gap >= -1e-12) & (gap < _BIN_S + 1e-12)).all(), metric
                continue
            assert np.allclose(mine[metric], curve, rtol=1e-12, atol=0, equal_nan=True), metric
    assert out_of_core.warnings == in_memory.warnings
    assert (out_of_core.sessions is None) == (in_memory.sessions is None)
    if in_memory.sessions is not None:
        assert out_of_core.sessions is not None
        assert_same_frames(out_of_core.sessions, in_memory.sessions, "sessions")
        assert_same_frames(pd.DataFrame(out_of_core.turns), pd.DataFrame(in_memory.turns), "turns")


def both(uri: str, tmp_path: Path, **kwargs: object) -> tuple[Report, Report]:
    a = build_report(uri, tmp_path / "ooc", progress=False, html=False, memory_limit="512MB",
                     **kwargs)  # type: ignore[arg-type]  # fmt: skip
    b = build_report(uri, tmp_path / "mem", progress=False, html=False, in_memory=True,
                     **kwargs)  # type: ignore[arg-type]  # fmt: skip
    return a, b


def test_a_million_chunk_rows_out_of_core_equal_the_numpy_path(tmp_path: Path) -> None:
    run = write_run(tmp_path / "ev", 110_000, 10, workers=4, parts=3)
    out_of_core, in_memory = both(str(run), tmp_path, slo="ttft_p99=0.25,itl_p99=0.1,itl=0.03")
    assert int(in_memory.per_request["chunk_count"].sum()) >= 1_000_000
    assert out_of_core.summary["itl_p99_s"].notna().all()
    assert_same_reports(out_of_core, in_memory)


def test_the_known_runs_are_the_same_out_of_core(tmp_path: Path) -> None:
    for builder in (known_run("k1"), known_run("k2", simulated=True)):
        uri = builder.write(tmp_path / "ev", parts_per_worker=2)
        assert_same_reports(*both(uri, tmp_path / builder.run_id, slo="ttft_p99=1,itl=0.5"))


def test_rate_steps_sessions_orphans_and_zero_token_chunks(tmp_path: Path) -> None:
    b = RunBuilder("mixed", workers=("w1", "w2"))
    b.add_rate_step(0, 5.0, started_s=0, ended_s=10, warmup_s=1, max_concurrency=2)
    for i in range(12):
        b.add_arrival(step=0, rate=5.0, index=i, intended_s=1.0 + 0.7 * i, slip_s=0.001 * i,
                      chunks=[(0.05, 0), (0.1, 2), (0.1 + 0.01 * i, 0), (0.3, 1)],
                      dropped=(i == 5))  # fmt: skip
    b.add_step(1, 2, started_s=10, spawned_s=10, ended_s=30, warmup_s=1)
    b.add_session("s1", step=1, started_s=12.0, planned=2, turns=[
        {"chunks": [(0.1, 3, "tool_call")], "tool_calls": 1, "prompt_tokens": 120},
        {"kind": "tool_result", "wait_s": 0.5, "chunks": [(0.1, 2), (0.4, 1)]},
    ])  # fmt: skip
    b.write(tmp_path / "ev")
    b.write(tmp_path / "ev2")
    part = tmp_path / "ev2" / "mixed" / "chunks" / "worker=w1" / "part-000000.parquet"
    table = pq.read_table(part)
    orphan = table.slice(0, 1).set_column(
        table.schema.get_field_index("request_id"), "request_id", pa.array(["no-such-request"])
    )
    pq.write_table(pa.concat_tables([table, orphan.cast(table.schema)]), part)
    for events in ("ev", "ev2"):
        uri = f"{tmp_path / events}/mixed"
        a, m = both(uri, tmp_path / events)
        assert_same_reports(a, m)
    assert any("chunk row(s) belong to no request row" in w for w in a.warnings)


@pytest.mark.parametrize("others_faster", [False, True])
def test_the_second_pass_reads_the_other_workers_only_for_bins_they_did_not_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others_faster: bool
) -> None:
    """The first worker's histogram names the bins the others keep in their first pass: where
    their samples fall there too, the second pass reads the first worker only; where they fall
    elsewhere (faster workers: below the first's bins), it reads every worker again. The
    figures are the same."""
    passes: list[int] = []
    summaries = EngineChunkFacts._summaries

    def spy(self: EngineChunkFacts, groups: int) -> object:
        out = summaries(self, groups)
        passes.append(self.second_pass_batches)
        return out

    monkeypatch.setattr(EngineChunkFacts, "_summaries", spy)
    b = RunBuilder("band", workers=("w1", "w2", "w3"))
    b.add_step(0, 4, started_s=0, spawned_s=0, ended_s=80)
    rng = np.random.default_rng(7)
    for w, worker in enumerate(b.workers):
        low = 5 if others_faster and w else 40  # gaps of whole ms: few bins, each full
        for i in range(300):
            offsets = 0.05 + np.cumsum(rng.integers(low, low + 10, 8) * 1e-3)
            chunks = [(float(o), int(rng.integers(1, 4))) for o in offsets]
            b.add_request(sent_s=1.0 + 0.2 * i, chunks=chunks, end_s=float(offsets[-1]) + 0.01,
                          worker=worker, concurrency=4)  # fmt: skip
    uri = b.write(tmp_path / "ev")
    assert_same_reports(*both(uri, tmp_path))
    assert passes == [3 if others_faster else 1]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"offset_ns": -1}, "a chunk offset_ns is negative"),
        ({"tokens": -1}, "a chunk has a negative token count"),
        ({"seq": 0}, "two chunks share one seq number"),
        ({"offset_ns": 50_000_000}, "tokens out of order (chunk offsets decrease)"),
        ({"offset_ns": 600_000_000}, "a chunk arrives after the end of the response"),
    ],
)
def test_an_impossible_timeline_is_refused_the_same_way(
    tmp_path: Path, change: dict[str, int], reason: str
) -> None:
    b = RunBuilder("bad")
    b.add_step(0, 1, started_s=0, spawned_s=0, ended_s=10)
    b.add_request(step=0, concurrency=1, sent_s=1.0, chunks=[(0.1, 1), (0.2, 1)], end_s=0.3)
    b.add_request(step=0, concurrency=1, sent_s=2.0, chunks=[(0.1, 1), (0.3, 1)], end_s=0.5)
    b.chunks[-1].update(change)  # the second request's last chunk (its row says otherwise)
    uri = b.write(tmp_path / "ev")
    errors = []
    for in_memory in (False, True):
        with pytest.raises(InvalidTimelineError) as caught:
            build_report(uri, tmp_path / str(in_memory), progress=False, html=False,
                         in_memory=in_memory)  # fmt: skip
        errors.append((caught.value.reason, caught.value.request_ids))
    assert errors[0] == errors[1] and errors[0][0] == reason


def test_a_bad_memory_limit_is_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--memory-limit 'lots' is not a size"):
        build_report(str(tmp_path / "nothing"), tmp_path / "out", memory_limit="lots")
    assert not (tmp_path / "out").exists()


def test_a_worker_taken_in_slices_gives_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices of whole requests (a hash of the id) bound one window's rows; one slice or many,
    the same report."""
    import analysis.derive.chunkfacts

    run = write_run(tmp_path / "ev", 3_000, 10, workers=2, parts=2)
    monkeypatch.setattr(analysis.derive.chunkfacts, "WINDOW_ROW_BYTES", 2**18)  # 512MB: 2,048 rows
    assert_same_reports(*both(str(run), tmp_path, slo="itl_p99=0.1"))  # 15,000 rows a worker


def _slicing(monkeypatch: pytest.MonkeyPatch) -> list[list[str] | None]:
    """Each sliced batch's slicing as the engine chose it: parts (lists) or a hash (None)."""
    import analysis.derive.chunkfacts as chunkfacts

    chosen: list[list[str] | None] = []
    real = chunkfacts.TableChunkFacts._part_slices

    def spy(
        self: chunkfacts.TableChunkFacts, paths: list[str], most: int
    ) -> list[list[str]] | None:
        got = real(self, paths, most)
        chosen.append(got)
        return got

    monkeypatch.setattr(chunkfacts.TableChunkFacts, "_part_slices", spy)
    monkeypatch.setattr(chunkfacts, "WINDOW_ROW_BYTES", 2**18)  # 1,000 rows (the least)
    return chosen


def test_a_worker_whose_requests_lie_in_one_part_each_is_sliced_by_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink writes a request's chunks together: a worker's parts are then read a group of
    parts at a time (each part read once a pass, not once per slice), with the same figures."""
    run = write_run(tmp_path / "ev", 3_000, 10, workers=2, parts=20)  # 750 rows a part
    chosen = _slicing(monkeypatch)
    assert_same_reports(*both(str(run), tmp_path, slo="itl_p99=0.1"))
    assert chosen and all(c is not None for c in chosen), chosen
    for slices in chosen:
        # 15,000 rows a worker, slices of 1,000 rows at most: one 750-row part each
        assert slices is not None and len(slices) == 20
        assert len({p for s in slices for p in s}) == sum(len(s) for s in slices)


def test_a_request_split_across_parts_is_sliced_by_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose parts split requests (rows shuffled across its parts): the slices are
    whole requests by a hash of the id again, and the figures the same."""
    run = write_run(tmp_path / "ev", 3_000, 10, workers=2, parts=20)
    folder = sorted((run / "chunks").iterdir())[0]
    parts = sorted(folder.glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(p) for p in parts])
    order = np.random.default_rng(1).permutation(len(table))
    shuffled = table.take(order)
    size = -(-len(table) // len(parts))
    for i, path in enumerate(parts):
        pq.write_table(shuffled.slice(i * size, size), path)
    chosen = _slicing(monkeypatch)
    assert_same_reports(*both(str(run), tmp_path, slo="itl_p99=0.1"))
    assert None in chosen and any(c is not None for c in chosen), chosen


def test_request_rows_stay_on_disk_whatever_the_limit(tmp_path: Path) -> None:
    """The request rows stay on disk too (analysis/steps/outofcore.py): a limit far under
    their size earns no advice to raise it, and the report is the same."""
    run = write_run(tmp_path / "ev", 20_000, 2, workers=2, parts=1)
    tight = build_report(str(run), tmp_path / "tight", progress=False, html=False,
                         memory_limit="1MB")  # fmt: skip
    roomy = build_report(str(run), tmp_path / "roomy", progress=False, html=False)
    assert not [w for w in tight.warnings + roomy.warnings if "--memory-limit" in w]
    assert tight.table.done_ns is None  # taken out of core: no per-request array in memory
    assert_same_frames(tight.summary, roomy.summary, "summary")


def test_reasoning_answers_hand_computed_on_both_paths(tmp_path: Path) -> None:
    """TTFO, TTFR and the reasoning and answer tokens (schema 1.5) of four answers: one that
    reasons then answers, one that reasons then calls a tool, one without reasoning, one cut
    during its reasoning (no answer: no TTFO); the SLO keys judge them."""
    b = RunBuilder("reasoning")
    b.add_step(0, 4, started_s=0, spawned_s=0, ended_s=10, warmup_s=0)
    b.add_request(sent_s=1.0, chunks=[(0.1, 2, "reasoning"), (0.3, 1, "reasoning"),
                                      (0.5, 2), (0.6, 1)])  # fmt: skip
    b.add_request(sent_s=2.0, chunks=[(0.2, 4, "reasoning"), (0.4, 2, "tool_call")])
    b.add_request(sent_s=3.0, chunks=[(0.3, 1), (0.35, 1)], first_answer_ns=ns(0.3),
                  reasoning_tokens=0)  # fmt: skip
    b.add_request(sent_s=4.0, chunks=[(0.1, 3, "reasoning")])
    uri = b.write(tmp_path / "ev")
    out_of_core, in_memory = both(uri, tmp_path, slo="ttfo_p99=0.45,ttfr_p50=0.2,ttfo=0.45")
    assert_same_reports(out_of_core, in_memory)
    row = in_memory.summary.iloc[0]
    # TTFO over the three answers 0.5, 0.4, 0.3; TTFR over the three that reasoned 0.1, 0.2, 0.1
    assert (row["ttfo_mean_s"], row["ttfo_p50_s"], row["ttfo_p90_s"]) == pytest.approx(
        (0.4, 0.4, 0.5)
    )
    assert (row["ttfr_mean_s"], row["ttfr_p50_s"], row["ttfr_max_s"]) == pytest.approx(
        (0.4 / 3, 0.1, 0.2)
    )
    assert row["ttft_p50_s"] == pytest.approx(0.1)  # the first token of any kind, as before
    # reasoning 3, 4, 0, 3; answers 3, 2, 2, 0
    assert (row["reasoning_tokens_mean"], row["answer_tokens_mean"]) == pytest.approx((2.5, 1.75))
    assert row["requests_reasoning"] == 3
    assert row["slo_pass"] == False and row["slo_failures"] == "ttfo_p99 0.5 > 0.45"  # noqa: E712
    assert row["good"] == 3  # the answer at 0.5 s is not good; the one without an answer is
    per = in_memory.per_request.sort_values("sent_at_ns")
    assert per["answer_tokens"].tolist() == [3, 2, 2, 0]
    assert per["ttfo_s"].isna().tolist() == [False, False, False, True]


def test_checked_answers_hand_computed_on_both_paths(tmp_path: Path) -> None:
    """The valid share (schema 1.5 output_valid) of five answers: three valid, one invalid,
    one unchecked, and a failed request; goodput leaves the invalid one out, with or without
    per-request thresholds; `valid_share` is an objective of at least."""
    b = RunBuilder("checked")
    b.add_step(0, 4, started_s=0, spawned_s=0, ended_s=10, warmup_s=0)
    for i, valid in enumerate([True, True, False, True, None]):
        b.add_request(sent_s=1.0 + i, chunks=[(0.1 * (i + 1), 1), (0.8, 1)], output_valid=valid,
                      output_invalid_reason=None if valid is not False else "the answer is not JSON")  # fmt: skip
    b.add_request(sent_s=7.0, status="error", error_kind="http_5xx", end_s=0.05)
    uri = b.write(tmp_path / "ev")
    for slo, good in (("valid_share=0.9,ttft=0.35", 2), ("valid_share=0.75", 4)):
        out_of_core, in_memory = both(uri, tmp_path / str(good), slo=slo)
        assert_same_reports(out_of_core, in_memory)
        row = in_memory.summary.iloc[0]
        assert (row["requests_checked"], row["requests_invalid"]) == (4, 1)
        assert row["valid_share"] == pytest.approx(0.75)
        # within ttft <= 0.35: the valid answers at 0.1 and 0.2 (the one at 0.3 is invalid);
        # without thresholds: every ok answer not found invalid, the unchecked one too
        assert row["good"] == good, slo
        passed = slo.startswith("valid_share=0.75")
        assert row["slo_pass"] == passed, row["slo_failures"]
        if not passed:
            assert row["slo_failures"] == "valid_share 0.75 < 0.9"
    assert any("1 of 4 checked answer(s) were invalid" in w for w in in_memory.warnings)
    per = in_memory.per_request.sort_values("sent_at_ns")
    assert per["output_valid"].tolist()[:5] == [True, True, False, True, None]
    md = (tmp_path / "4" / "mem" / "report.md").read_text()
    assert "## Valid outputs" in md and "75.0%" in md
