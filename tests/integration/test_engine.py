"""The out-of-core engine (analysis/read/engine.py) and `llmload sql`, against the numpy path.

The engine's per-request metrics and ITL samples are compared column by column with
analysis/derive/metrics.py (the plain numpy computation the reports use) on a run of more than a
million chunk rows; `llmload sql` runs as a real subprocess on a local run and on a run in a
real SeaweedFS.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from analysis.derive.metrics import compute_request_metrics
from analysis.read.engine import Engine
from analysis.read.load import load_run
from tests.support.chat import BIN
from tests.support.runs import known_run
from tests.support.store import S3Target
from tests.support.synthetic import write_run

METRIC_COLUMNS = ("ttfe_s", "ttft_s", "tpot_s", "e2e_s", "itl_mean_s", "icl_mean_s",
                  "output_tokens_per_s", "chunk_count", "chunk_tokens")  # fmt: skip


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """110,000 requests of 10 chunks: 1.1M chunk rows, 4 workers, 3 parts each."""
    return write_run(tmp_path_factory.mktemp("engine"), 110_000, 10, workers=4, parts=3)


def test_request_metrics_equal_the_numpy_path_on_a_million_chunk_rows(big_run: Path) -> None:
    run = load_run(str(big_run), progress=False)
    assert len(run.chunks) >= 1_000_000
    expected = compute_request_metrics(run.requests, run.chunks)
    ids = run.requests["request_id"].to_numpy()
    with Engine(memory_limit="256MB", threads=2) as engine:
        engine.attach([str(big_run)])
        columns = ", ".join(METRIC_COLUMNS)
        got = engine.sql(f"SELECT request_id, {columns} FROM request_metrics").to_pandas()
        itl = engine.sql("SELECT request_id, value_s, weight FROM itl_samples").to_pandas()
    got = got.set_index("request_id").loc[ids]
    assert len(got) == len(ids)
    for column in METRIC_COLUMNS:
        want = expected.per_request[column].to_numpy(np.float64)
        have = got[column].to_numpy(np.float64)
        assert np.array_equal(np.isnan(want), np.isnan(have)), column
        assert np.allclose(have, want, rtol=1e-12, atol=0, equal_nan=True), column
    # the per-token ITL samples, one by one: same request, value and weight
    want_itl = pd.DataFrame({"request_id": ids[expected.itl.request],
                             "value_s": expected.itl.value_s, "weight": expected.itl.weight})  # fmt: skip
    order = ["request_id", "value_s", "weight"]
    want_itl = want_itl.sort_values(order, ignore_index=True)
    itl = itl.sort_values(order, ignore_index=True)
    assert len(itl) == len(want_itl)
    assert (itl["request_id"].to_numpy() == want_itl["request_id"].to_numpy()).all()
    assert np.array_equal(itl["weight"].to_numpy(np.float64), want_itl["weight"].to_numpy())
    assert np.allclose(itl["value_s"], want_itl["value_s"], rtol=1e-12, atol=1e-15)


def test_two_runs_at_once_and_a_bounded_memory(tmp_path: Path) -> None:
    a = known_run("ra").write(str(tmp_path / "ev"))
    b = known_run("rb").write(str(tmp_path / "ev"))
    with Engine(memory_limit="64MB", threads=1) as engine:
        engine.attach([a, b])
        rows = engine.sql("SELECT run_id, count(*) AS n FROM requests GROUP BY run_id")
        counts = {r["run_id"]: r["n"] for r in rows.to_pylist()}
        limit = engine.sql("SELECT current_setting('memory_limit') AS m").to_pylist()[0]["m"]
    assert set(counts) == {"ra", "rb"} and counts["ra"] == counts["rb"] > 0
    number, unit = limit.split()
    assert unit == "MiB" and 50 < float(number) <= 64, limit  # 64 MB, as DuckDB states it


def _sql(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "llmload"), "sql", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)  # fmt: skip


def test_llmload_sql_prints_and_writes_a_local_run(big_run: Path, tmp_path: Path) -> None:
    query = ("SELECT step, count(*) AS n, nearest_rank(list(ttft_s), 0.99) AS ttft_p99 "
             "FROM request_metrics WHERE status = 'ok' AND NOT cold GROUP BY step ORDER BY step")  # fmt: skip
    shown = _sql(str(big_run), query)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["step", "n", "ttft_p99"] and len(lines) == 2 + 6
    run = load_run(str(big_run), progress=False)
    ok = run.requests[(run.requests["status"] == "ok") & ~run.requests["cold"].astype(bool)]
    ttft = ok["first_token_ns"].to_numpy(np.float64) / 1e9
    step0 = np.sort(ttft[ok["step"].to_numpy() == 0])
    want = step0[int(np.ceil(0.99 * len(step0) - 1e-9 * len(step0))) - 1]
    step, n, p99 = lines[2].split()
    assert (int(step), int(n)) == (0, len(step0)) and float(p99) == pytest.approx(want, rel=1e-5)
    out = tmp_path / "itl.parquet"
    wrote = _sql(str(big_run), "SELECT * FROM itl_samples", "--out", str(out))
    assert wrote.returncode == 0, wrote.stderr
    assert pq.read_metadata(out).num_rows == int(compute_request_metrics(
        run.requests, run.chunks).itl.value_s.size)  # fmt: skip
    csv = tmp_path / "slow.csv"
    slowest = _sql(str(big_run), "SELECT request_id, e2e_s FROM request_metrics ORDER BY e2e_s "
                   "DESC LIMIT 20", "--out", str(csv))  # fmt: skip
    assert slowest.returncode == 0 and len(csv.read_text().splitlines()) == 21


def test_llmload_sql_on_a_run_in_seaweedfs(s3_target: S3Target, tmp_path: Path) -> None:
    local = known_run("sqlrun").write(str(tmp_path / "ev"), parts_per_worker=2)
    remote = known_run("sqlrun").write(s3_target.uri, parts_per_worker=2)
    query = "SELECT request_id, ttft_s, itl_mean_s, chunk_count FROM request_metrics ORDER BY 1"
    here, there = _sql(local, query, "--limit", "1000"), _sql(remote, query, "--limit", "1000")
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert there.stdout == here.stdout and len(here.stdout.splitlines()) > 3


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("{run}", "SELECT nope FROM requests"), "the query failed: Binder Error"),
        (("{run}",), "give one or more RUN_URIs and then a query"),
        (("{run}", "SELECT 1", "--memory-limit", "lots"), "--memory-limit 'lots' is not a size"),
        (("{run}", "SELECT 1", "--out", "x.json"), "give a file ending in .csv or .parquet"),
        (("nowhere/r9", "SELECT 1"), "no llmload run at nowhere/r9"),
    ],
    ids=["bad-query", "no-query", "bad-memory-limit", "bad-out", "no-run"],
)
def test_llmload_sql_bad_input_is_one_line(
    args: tuple[str, ...], fragment: str, tmp_path: Path
) -> None:
    run = known_run("r1").write(str(tmp_path / "ev"))
    out = _sql(*(a.replace("{run}", run) for a in args), cwd=tmp_path)
    errors = [line for line in out.stderr.splitlines() if line.startswith("llmload: error: ")]
    assert out.returncode == 2 and len(errors) == 1 and fragment in errors[0], out.stderr
    assert "Traceback" not in out.stderr


def test_every_query_in_the_docs_runs(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "docs" / "reports.md").read_text()
    section = text.split("## Query the events", 1)[1]
    queries = [block.split("```", 1)[0] for block in section.split("```sql\n")[1:]]
    assert len(queries) == 5
    a = known_run("baseline-1").write(str(tmp_path / "ev"))
    b = known_run("candidate-2").write(str(tmp_path / "ev"))
    with Engine(memory_limit="256MB", threads=1) as engine:
        engine.attach([a, b])
        for query in queries:
            assert engine.sql(query).num_rows > 0, query
