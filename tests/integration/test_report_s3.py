"""The same hand-computed run read back from a real S3 server (SeaweedFS), a part missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import build_report
from analysis.kernel.storage import open_store
from tests.integration.test_report_summary import EXPECTED, SLO, assert_row
from tests.support.runs import known_run
from tests.support.store import S3Target


def test_report_from_seaweedfs_matches_the_local_one(s3_target: S3Target, tmp_path: Path) -> None:
    uri = known_run("s3run").write(s3_target.uri, parts_per_worker=2)
    assert uri == f"{s3_target.uri}/s3run"
    report = build_report(uri, tmp_path / "out", slo=SLO, progress=False, html=False)
    assert report.completeness.complete
    assert report.completeness.parts_read == 8
    for actual, expected in zip(report.table.rows, EXPECTED, strict=True):
        assert_row(actual, expected)


def test_missing_and_corrupt_parts_on_s3(s3_target: S3Target, tmp_path: Path) -> None:
    uri = known_run("s3gaps").write(s3_target.uri, parts_per_worker=2)
    store = open_store(uri)
    store.delete("chunks/worker=w2/part-000001.parquet")
    store.put("requests/worker=w1/part-000000.parquet", b"garbage", overwrite=True)
    report = build_report(uri, tmp_path / "out", progress=False, html=False)
    c = report.completeness
    assert c.missing_parts == ["chunks/worker=w2/part-000001.parquet"]
    assert list(c.corrupt_parts) == ["requests/worker=w1/part-000000.parquet"]
    assert c.rows_read["requests"] < c.rows_expected["requests"]
    assert any("could not be read" in w for w in report.warnings)


def test_unknown_s3_run_is_a_usage_error(s3_target: S3Target) -> None:
    from analysis import UsageError, load_run

    with pytest.raises(UsageError, match="no llmload run at"):
        load_run(f"{s3_target.uri}/no-such-run")
