"""Issue 23, part 3, done when: a two-model run reports both models apart.

A simulator serves two model ids, the second three times as costly per token; a headless run
of two worker processes asks for `--model fast:0.5,slow:0.5`; the report split by model has
both models' rows in every step, the slow model's TTFT and TPOT higher, and each model's
request count equal to the server's truth log. A model the server does not serve stops the
run before any load (exit 2, naming it)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from analysis.render.build import build_report
from tests.support.chat import run_locust, start_sim, unseen_by_server

pytestmark = pytest.mark.slow  # long (10-35 s a test): `make test-slow`

SIM = ("--served-models", "fast,slow", "--model-cost", "slow:3", "--decode-base-ms", "4")


def test_a_two_model_run_reports_both_models_apart(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", *SIM) as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--model", "fast:0.5,slow:0.5", "--steps", "2,4",
            "--step-duration", "4", "--step-warmup", "0.5", "--cold-requests", "2",
            "--workload", "D(16,12)", "--ignore-eos", "on", "--seed", "3",
            workers=2, timeout=120,
        )  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, _chunks, manifest = result.events()
    assert manifest["target"]["models"] == {"fast": 0.5, "slow": 0.5}
    assert set(requests["model"]) == {"fast", "slow"}
    unseen = unseen_by_server(requests, truth)
    seen = requests[~requests["request_id"].isin(unseen["request_id"])]
    by_truth = collections.Counter(row["model"] for row in truth.values())
    assert dict(collections.Counter(seen["model"])) == dict(by_truth)

    mixed = build_report(str(result.run_dir()), tmp_path / "mixed", progress=False, html=False)
    assert any("--by model" in w for w in mixed.warnings)
    assert "model" not in mixed.table.rows[0]

    report = build_report(str(result.run_dir()), tmp_path / "out", progress=False, by="model")
    rows = report.table.rows
    cold = [r["model"] for r in rows if r["group"] == "cold"]
    assert sorted(cold) == sorted(set(cold)) and set(cold) <= {"fast", "slow"}
    steps = [r for r in rows if r["group"] == "step"]
    assert [(r["step"], r["model"]) for r in steps] == [
        (0, "fast"), (0, "slow"), (1, "fast"), (1, "slow")
    ]  # fmt: skip
    for fast, slow in zip(steps[::2], steps[1::2], strict=True):
        assert fast["ok"] > 5 and slow["ok"] > 5, (fast["ok"], slow["ok"])
        assert slow["tpot_p50_s"] > 1.5 * fast["tpot_p50_s"]
        assert slow["ttft_p50_s"] > fast["ttft_p50_s"]
    for model in ("fast", "slow"):  # every request tagged with a step, per model
        tagged = sum(r["requests_total"] for r in rows if r["model"] == model)
        sent = requests[(requests["model"] == model) & (requests["status"] != "dropped")]
        assert tagged == len(sent)
    in_memory = build_report(str(result.run_dir()), tmp_path / "mem", progress=False,
                             html=False, in_memory=True, by="model")  # fmt: skip
    for one, other in zip(rows, in_memory.table.rows, strict=True):  # the same figures
        assert (one["model"], one["ok"], one["output_tokens_per_s"], one["itl_p50_s"]) == (
            other["model"],
            other["ok"],
            other["output_tokens_per_s"],
            other["itl_p50_s"],
        )
    summary = (tmp_path / "out" / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("group,model,step,")
    assert "fast" in (tmp_path / "out" / "report.md").read_text()


def test_a_model_not_served_stops_the_run(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", *SIM) as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--model", "fast:0.5,nope:0.5", "--steps", "1",
            "--step-duration", "2", "--step-warmup", "0.5", "--cold-requests", "0", timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.output[-3000:]
    assert "--model 'nope' is not served" in result.output
