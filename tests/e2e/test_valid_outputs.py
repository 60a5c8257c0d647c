"""Valid outputs under load, against the simulator's truth: `--response-format` and tool
calls checked on every answer; `llmload sim --invalid-rate` breaks some on purpose, and
the truth log says which (issue 38)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import build_report
from tests.support.chat import TRIP_SCHEMA, run_locust, start_sim

STEPS = ("--steps", "2", "--step-duration", "4", "--step-warmup", "1", "--cold-requests", "0")


def _checked(requests: pd.DataFrame, truth: dict, tool_calls: bool) -> pd.DataFrame:
    ok = requests[requests["status"] == "ok"].set_index("request_id")
    for rid, row in ok.iterrows():
        said = truth[rid]
        if tool_calls and not said["tool_call"]:  # an answer in text: nothing to check
            assert pd.isna(row["output_valid"]), rid
            continue
        assert row["output_valid"] == said["output_valid"], (rid, said["invalid"],
                                                             row["output_invalid_reason"])  # fmt: skip
        if said["output_valid"]:
            assert pd.isna(row["output_invalid_reason"])
        else:
            assert "is not JSON" in row["output_invalid_reason"], row["output_invalid_reason"]
    return ok


def test_structured_answers_are_checked_against_the_truth(tmp_path: Path) -> None:
    schema = tmp_path / "trip.json"
    schema.write_text(json.dumps(TRIP_SCHEMA))
    for endpoint in ("chat", "responses"):
        with start_sim(tmp_path / endpoint / "sim", "--invalid-rate", "0.25") as sim:
            result = run_locust(sim.url, tmp_path / endpoint / "runs", "--endpoint", endpoint,
                                *STEPS, "--workload", "D(8,64)",
                                "--response-format", f"json_schema:{schema}")  # fmt: skip
            truth = sim.truth()
        assert result.returncode == 0, result.output[-3000:]
        requests, _, manifest = result.events()
        assert manifest["config"]["response_format"] == f"json_schema:{schema}"
        assert manifest["config"]["ignore_eos"] == "off"  # the grammar ends each answer
        ok = _checked(requests, truth, tool_calls=False)
        assert ok["output_valid"].notna().all() and len(ok) > 10
        invalid = int((~ok["output_valid"].astype(bool)).sum())
        assert 0 < invalid < len(ok), endpoint  # a quarter broken, seeded
        report = build_report(str(result.run_dir()), tmp_path / endpoint / "report",
                              progress=False, html=True, slo="valid_share=0.99")  # fmt: skip
        (row,) = [r for r in report.step_rows if r["group"] == "step"]
        steady = ok[ok.index.isin(report.per_request.loc[report.per_request["steady"],
                                                          "request_id"])]  # fmt: skip
        assert row["requests_checked"] == len(steady) == row["ok"]
        assert row["requests_invalid"] == int((~steady["output_valid"].astype(bool)).sum())
        assert row["valid_share"] < 0.99 and row["slo_pass"] is False
        assert row["good"] == row["ok"] - row["requests_invalid"]  # goodput: valid only
        assert "## Valid outputs" in (tmp_path / endpoint / "report" / "report.md").read_text()


def test_tool_call_arguments_are_checked_against_the_truth(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", "--invalid-rate", "0.25", "--tool-call-rate", "1") as sim:
        result = run_locust(sim.url, tmp_path / "runs", *STEPS, "--workload", "D(8,32)",
                            "--turns", "2", "--tool-rate", "1", "--tool-latency", "0")  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, _, _ = result.events()
    ok = _checked(requests, truth, tool_calls=True)
    calls = ok[ok["tool_calls"] > 0]
    assert len(calls) > 5 and calls["output_valid"].notna().all()
    assert 0 < int((~calls["output_valid"].astype(bool)).sum()) < len(calls)
