"""What an answer is made of, against vLLM: reasoning apart from the answer, and valid
structured outputs (issue 38).

One server serves the module: the tiny Llama built with `--head-dim-64 --think` (its
vocabulary has `<think>` and `</think>` as tokens of their own, and JSON's punctuation), under
`--reasoning-parser qwen3` with structured outputs enabled during reasoning
(`--structured-outputs-config {"enable_in_reasoning": true}`).

A random model never crosses a reasoning parser's boundary by itself. Here a grammar makes it
do so where the test says: `structured_outputs.regex` spells `<think>`, up to 24 letters of
reasoning, `</think>`, then the answer's letters; the corpus has no `<`, so each marker can
only be its one token, which is what the parser looks for. So every answer reasons, then
answers, and vLLM's own usage counts the reasoning (`completion_tokens_details.reasoning_tokens`).

Needs vLLM and the engine environment, as tests/engine/test_vllm.py; skipped elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from analysis import build_report
from infra.engines.vllm_serve import VllmServe
from tests.engine.test_vllm import (  # noqa: F401  (pytestmark: the same skips and mark)
    STEPS,
    build_tiny_model,
    pytestmark,
)
from tests.support.chat import TRIP_SCHEMA, run_locust

THINK_REGEX = "<think>[a-z ]{4,24}</think>[a-z ]{4,}"
"""Reasoning of 4 to 24 letters and spaces between the markers, then an answer of letters."""


@pytest.fixture(scope="module")
def think_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory, "tiny-llama-hd64-think", "--head-dim-64", "--think")


@pytest.fixture(scope="module")
def server(think_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServe]:
    flags = ("--reasoning-parser", "qwen3",
             "--structured-outputs-config", json.dumps({"enable_in_reasoning": True}))  # fmt: skip
    with VllmServe(think_model, tmp_path_factory.mktemp("vllm"), max_num_seqs=4,
                   extra_args=flags) as srv:  # fmt: skip
        yield srv


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_reasoning_then_answer_on_vllms_reasoning_parser(
    server: VllmServe, think_model: Path, tmp_path: Path, endpoint: str
) -> None:
    """Every answer reasons (the parser's `reasoning` deltas, the Responses API's reasoning
    text), then answers: TTFR is the first token, TTFO comes after it, `reasoning_tokens`
    is vLLM's own count, and the report's reasoning columns and SLO keys hold them."""
    extra = json.dumps({"structured_outputs": {"regex": THINK_REGEX}})
    result = run_locust(server.url, tmp_path / "runs", "--endpoint", endpoint,
                        "--model", server.model_id, *STEPS, "--workload", "D(16,40)",
                        "--tokenizer", str(think_model), "--extra-body", extra,
                        timeout=240)  # fmt: skip
    assert result.returncode == 0, result.output[-4000:] + "\n--- vLLM ---\n" + server.log_tail()
    requests, chunks, _ = result.events()
    failed = requests[~requests["status"].isin(["ok", "aborted"])]
    assert failed.empty, failed[["status", "error_kind", "error_detail"]].to_string()
    ok = requests[requests["status"] == "ok"].set_index("request_id")
    assert len(ok) > 5
    # reasoning first, then the answer, on every request
    assert (ok["first_reasoning_ns"] == ok["first_token_ns"]).all()
    after = ok["first_answer_ns"] - ok["first_reasoning_ns"]
    assert (after >= 0).all() and (after > 0).any()
    # the same instant only when the two events came in one socket read (tiny model: often)
    assert (ok.loc[after == 0, "coalesced_events"] > 0).all()
    assert (ok["first_answer_ns"] == ok["first_content_ns"]).all()
    # vLLM's own count of the reasoning (the tokens between the markers): 1 to 24 letters
    assert ok["reasoning_tokens"].between(1, 24).all(), ok["reasoning_tokens"].describe()
    assert (ok["reasoning_tokens"] < ok["output_tokens"]).all()
    kinds = chunks.sort_values(["request_id", "seq"]).groupby("request_id")["kind"].apply(list)
    for rid in ok.index:
        seen = kinds[rid]
        first_content = seen.index("content")
        assert set(seen[:first_content]) == {"reasoning"}, seen
        assert "reasoning" not in seen[first_content:], seen
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False,
                          html=False, slo="ttfo_p99=60,ttfr_p99=60,ttfo=60")  # fmt: skip
    steps = [r for r in report.step_rows if r["group"] == "step"]
    for row in steps:
        assert row["requests_reasoning"] == row["ok"] > 0
        assert row["ttfr_p50_s"] == row["ttft_p50_s"] <= row["ttfo_p50_s"]
        assert 1 <= row["reasoning_tokens_mean"] <= 24 < row["answer_tokens_mean"] + 24
        assert row["slo_pass"] is True and row["good"] == row["ok"]
    assert "## Reasoning" in (tmp_path / "report" / "report.md").read_text()


def test_structured_outputs_are_all_valid_json_of_the_schema(
    server: VllmServe, think_model: Path, tmp_path: Path
) -> None:
    """`--response-format json_schema:FILE` against vLLM's structured outputs (xgrammar) on
    the tiny random model: every answer is JSON the schema validates, checked on the worker
    (`output_valid` true on every ok row), so the valid share is 1 and goodput counts them
    all. Thinking is off for these requests (`chat_template_kwargs`), so the answer is content."""
    schema = tmp_path / "trip.json"
    schema.write_text(json.dumps(TRIP_SCHEMA))
    extra = json.dumps({"chat_template_kwargs": {"enable_thinking": False}})
    result = run_locust(server.url, tmp_path / "runs", "--model", server.model_id, *STEPS,
                        "--workload", "D(16,128)", "--tokenizer", str(think_model),
                        "--response-format", f"json_schema:{schema}", "--extra-body", extra,
                        timeout=240)  # fmt: skip
    assert result.returncode == 0, result.output[-4000:] + "\n--- vLLM ---\n" + server.log_tail()
    requests, _, manifest = result.events()
    assert manifest["config"]["ignore_eos"] == "off"  # the grammar ends each answer
    failed = requests[~requests["status"].isin(["ok", "aborted"])]
    assert failed.empty, failed[["status", "error_kind", "error_detail"]].to_string()
    ok = requests[requests["status"] == "ok"]
    assert len(ok) > 5
    bad = ok[ok["output_valid"] != True]  # noqa: E712
    assert bad.empty, bad[["output_valid", "output_invalid_reason"]].to_string()
    assert (ok["output_tokens"] < ok["max_tokens"]).all()  # each ended with its JSON
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False,
                          html=False, slo="valid_share=1")  # fmt: skip
    for row in (r for r in report.step_rows if r["group"] == "step"):
        assert row["requests_checked"] == row["ok"] > 0 and row["requests_invalid"] == 0
        assert row["valid_share"] == 1.0 and row["slo_pass"] is True
        assert row["good"] == row["ok"]
