"""Your own locustfile on llmload (docs/extending.md): the two examples, each run by real
Locust processes against a small service of its own kind (tests/support/services.py), with
full reports; and the built-in Responses and Messages adapters against the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis import build_report
from tests.support.chat import ROOT, run_locust, start_sim, unseen_by_server
from tests.support.services import PASSWORD, GenerateService, RagService

STEPS = ("--step-duration", "2", "--step-warmup", "0.5")
RAG = ROOT / "examples" / "rag_locustfile.py"
GENERATE = ROOT / "examples" / "generate_locustfile.py"


def _chunks_per_request(chunks: pd.DataFrame) -> pd.Series:
    return chunks.groupby("request_id")["tokens"].agg(["count", "sum"])


def test_the_rag_example_logs_in_and_reports_like_the_chat_user(tmp_path: Path) -> None:
    with RagService() as rag:
        result = run_locust(rag.url, tmp_path / "runs", "--steps", "1,2", *STEPS,
                            "--workload", "D(12,10)", locustfile=RAG,
                            env={"RAG_PASSWORD": PASSWORD})  # fmt: skip
        truth = {k: v for k, v in rag.truth.items() if not k.startswith("probe-")}
        logins = rag.logins
    assert result.returncode == 0, result.output
    requests, chunks, manifest = result.events()
    assert manifest["status"] == "finished"
    # the preflight's first request went by the user's hooks (login included) and was read
    first = [p for p in manifest["probes"] if p["purpose"] == "first_request"]
    assert [p["outcome"] for p in first] == ["ok"]
    unseen_by_server(requests, truth)
    assert (requests["status"] == "ok").all(), requests["error_detail"].unique()
    assert set(requests["endpoint"]) == {"rag"}
    # one login per user (and the preflight's): 1 + at most 2 users
    assert 2 <= logins <= 3
    ok = requests.set_index("request_id")
    # the service's counts: exact per event (one token an event), the total from its usage
    assert (ok["output_tokens_source"] == "usage").all()
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()
    per = _chunks_per_request(chunks)
    for rid, row in truth.items():
        assert per.loc[rid, "count"] == row["tokens"] == per.loc[rid, "sum"], rid
        assert ok.loc[rid, "prompt_tokens"] == row["question_tokens"]
    assert (ok["first_content_ns"] == ok["first_token_ns"]).all()
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=True)
    steps = [r for r in report.step_rows if r["group"] != "cold"]
    assert [r["concurrency"] for r in steps] == [1, 2]
    for row in steps:
        assert row["ok"] > 0 and row["ttft_p50_s"] > 0 and row["itl_p50_s"] > 0
        assert row["output_tokens_per_s"] > 0
    assert (tmp_path / "report" / "report.html").exists()


def test_a_login_that_fails_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    with RagService() as rag:
        result = run_locust(rag.url, tmp_path / "runs", "--steps", "1", *STEPS,
                            locustfile=RAG, env={"RAG_PASSWORD": "wrong"})  # fmt: skip
    assert result.returncode == 2, result.output
    line = next(x for x in result.output.splitlines() if "llmload: error:" in x)
    assert "RagUser.login failed" in line and "HTTP 401" in line, line
    assert "wrong" not in result.output


def test_the_generate_example_in_open_loop_with_workers(tmp_path: Path) -> None:
    with GenerateService() as gen:
        result = run_locust(gen.url, tmp_path / "runs", "--rates", "4,8", *STEPS,
                            "--workload", "D(8,6)", locustfile=GENERATE, workers=2)  # fmt: skip
        truth = dict(gen.truth)
    assert result.returncode == 0, result.output
    requests, chunks, manifest = result.events()
    sent = requests[requests["status"] != "dropped"]
    assert (sent["status"] == "ok").all(), sent["error_detail"].unique()
    assert set(requests["endpoint"]) == {"generate"}  # dropped arrivals too
    warm = sent[~sent["cold"]]  # the cold requests go closed loop, before the first rate
    assert warm["rate"].notna().all() and set(warm["rate"]) == {4.0, 8.0}
    # no usage, no tokenizer: one token per line, each line an event
    assert (sent["output_tokens_source"] == "events").all()
    per = _chunks_per_request(chunks)
    for rid, row in truth.items():
        if rid.startswith("probe-"):
            continue
        assert per.loc[rid, "count"] == row["tokens"] == sent.set_index("request_id").loc[
            rid, "output_tokens"], rid  # fmt: skip
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=False)
    rates = [r["rate"] for r in report.step_rows if r["group"] != "cold"]
    assert rates == [4.0, 8.0]


def test_the_rag_user_holds_sessions(tmp_path: Path) -> None:
    with RagService() as rag:
        result = run_locust(rag.url, tmp_path / "runs", "--steps", "1", *STEPS, "--turns", "3",
                            "--workload", "D(8,6)", locustfile=RAG,
                            env={"RAG_PASSWORD": PASSWORD})  # fmt: skip
    assert result.returncode == 0, result.output
    requests, _, _ = result.events()
    later = requests[requests["turn"] > 0]
    assert len(later) > 0 and (later["status"] == "ok").all()
    # a later turn's question is the whole conversation (ask.text()): its prompt grows
    first = requests[requests["turn"] == 0].set_index("session_id")["prompt_tokens"]
    for _, row in later.iterrows():
        assert row["prompt_tokens"] > first[row["session_id"]]


def _builtin_run(tmp_path: Path, endpoint: str, *args: str) -> tuple[pd.DataFrame, pd.DataFrame,
                                                                      dict, dict]:  # fmt: skip
    with start_sim(tmp_path / "sim", "--tokens-per-event", "1-3") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--endpoint", endpoint, *STEPS, *args)
        truth = sim.truth()
    assert result.returncode == 0, result.output
    requests, chunks, manifest = result.events()
    unseen_by_server(requests, truth)
    return requests, chunks, manifest, truth


def _assert_chunks_are_the_servers(requests: pd.DataFrame, chunks: pd.DataFrame,
                                   truth: dict) -> None:  # fmt: skip
    """Every answered request has a chunk per output event the server sent (one token each:
    these APIs count no tokens per event, and no tokenizer is given), and its total is the
    server's usage."""
    ok = requests[requests["status"] == "ok"].set_index("request_id")
    assert len(ok) > 0 and (ok["output_tokens_source"] == "events").all()
    per = chunks.groupby("request_id")["tokens"].agg(["count", "sum"])
    for rid in ok.index:
        sent = [e[1] for e in truth[rid]["events"] if e[1] > 0]
        assert ok.loc[rid, "completion_tokens"] == sum(sent) == truth[rid]["completion_tokens"]
        # a tool call's opening (its name, no argument text yet) is output too, as in chat
        opening = 1 if truth[rid]["tool_call"] else 0
        assert per.loc[rid, "count"] == len(sent) + opening == per.loc[rid, "sum"], rid


def test_the_responses_endpoint_against_the_simulator(tmp_path: Path) -> None:
    requests, chunks, manifest, truth = _builtin_run(tmp_path, "responses", "--steps", "1,2",
                                                     "--workload", "D(16,12)")  # fmt: skip
    assert set(requests["endpoint"]) == {"responses"}
    assert (requests["status"] == "ok").all(), requests["error_detail"].unique()
    assert {t["path"] for t in truth.values()} == {"/v1/responses"}
    ok = requests.set_index("request_id")
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()  # calibrated, input_tokens
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()  # ignore_eos probed and honoured
    _assert_chunks_are_the_servers(requests, chunks, truth)
    assert manifest["status"] == "finished"


def test_the_messages_endpoint_with_tool_calls_in_sessions(tmp_path: Path) -> None:
    requests, chunks, _, truth = _builtin_run(
        tmp_path, "messages", "--steps", "2", "--turns", "3", "--tool-rate", "1",
        "--workload", "D(16,8)",
    )  # fmt: skip
    assert set(requests["endpoint"]) == {"messages"}
    assert (requests["status"] == "ok").all(), requests["error_detail"].unique()
    assert {t["path"] for t in truth.values() if t["request_id"][:6] != "probe-"} >= {
        "/v1/messages"
    }
    called = requests[requests["tool_calls"] > 0]
    results = requests[requests["turn_kind"] == "tool_result"]
    assert len(called) > 0 and len(results) > 0  # tool_use blocks read, results sent back
    _assert_chunks_are_the_servers(requests, chunks, truth)
    # ping events count as events, never as output
    assert (requests["events"] > requests.set_index("request_id").index.map(
        chunks.groupby("request_id").size()).to_numpy()).all()  # fmt: skip


def test_the_builtin_endpoints_ask_the_simulator_in_their_own_shapes(tmp_path: Path) -> None:
    """The simulator's truth says what it parsed: its prompt tokens equal the request's."""
    for endpoint in ("responses", "messages"):
        requests, _, _, truth = _builtin_run(tmp_path / endpoint, endpoint, "--steps", "1",
                                             "--no-stream", "--workload", "D(10,5)")  # fmt: skip
        ok = requests[requests["status"] == "ok"].set_index("request_id")
        assert len(ok) > 0 and (ok["completion_tokens"] == 5).all()
        for rid in ok.index:
            assert truth[rid]["prompt_tokens"] == ok.loc[rid, "prompt_tokens"]
            assert truth[rid]["stream"] is False
        assert json.dumps(sorted(set(requests["endpoint"]))) == json.dumps([endpoint])


def test_the_simulators_reasoning_phase_on_every_endpoint(tmp_path: Path) -> None:
    """`llmload sim --reasoning-tokens 3`: each answer's first three tokens are reasoning
    (chat's reasoning_content, the Responses API's reasoning_text deltas, Messages' thinking),
    read as reasoning chunks before the content; the first token is the first reasoning one,
    the first content comes after."""
    for endpoint in ("chat", "responses", "messages"):
        with start_sim(tmp_path / endpoint / "sim", "--reasoning-tokens", "3") as sim:
            result = run_locust(sim.url, tmp_path / endpoint / "runs", "--endpoint", endpoint,
                                "--steps", "1", *STEPS, "--workload", "D(8,7)")  # fmt: skip
            truth = sim.truth()
        assert result.returncode == 0, result.output
        requests, chunks, _ = result.events()
        ok = requests[requests["status"] == "ok"].set_index("request_id")
        assert len(ok) > 0 and (ok["completion_tokens"] == 7).all(), endpoint
        kinds = chunks.sort_values(["request_id", "seq"]).groupby("request_id")["kind"].apply(list)
        for rid in ok.index:
            assert truth[rid]["reasoning_tokens"] == 3
            assert kinds[rid] == ["reasoning"] * 3 + ["content"] * 4, (endpoint, kinds[rid])
        # the same instant only when the two events came in one read
        after = ok["first_content_ns"] - ok["first_token_ns"]
        assert (after >= 0).all() and (after > 0).any(), endpoint
        assert (ok.loc[after == 0, "coalesced_events"] > 0).all(), endpoint
        # schema 1.5: TTFR is the first token here, TTFO the first content; the reasoning's
        # tokens as the truth log says (the usage's details on chat and responses, the
        # thinking events' own on messages)
        assert (ok["first_reasoning_ns"] == ok["first_token_ns"]).all(), endpoint
        assert (ok["first_answer_ns"] == ok["first_content_ns"]).all(), endpoint
        assert (ok["reasoning_tokens"] == 3).all(), endpoint
        report = build_report(str(result.run_dir()), tmp_path / endpoint / "report",
                              progress=False, html=True, slo="ttfo_p99=60,ttfr=60")  # fmt: skip
        (row,) = [r for r in report.step_rows if r["group"] == "step"]
        assert row["requests_reasoning"] == row["ok"] > 0, endpoint
        assert (row["reasoning_tokens_mean"], row["answer_tokens_mean"]) == (3, 4), endpoint
        assert row["ttfr_p50_s"] == row["ttft_p50_s"] < row["ttfo_p50_s"], endpoint
        assert row["slo_pass"] is True and row["good"] == row["ok"], endpoint
        for name in ("report.md", "report.html"):
            text = (tmp_path / endpoint / "report" / name).read_text()
            assert "TTFO p99 ms" in text and "reasoning tokens mean" in text, (endpoint, name)
