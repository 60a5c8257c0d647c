"""Multi-turn sessions and agent tool rounds against the simulated engine and its prefix cache.

The engine's parameters make the cache effect predictable (docs/simserver.md): a turn's
prefill costs PREFILL_US per uncached prompt token, and a turn that resends the previous
prompt and reply finds every full block of them cached.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.support.chat import LocustResult, run_locust, start_sim, unseen_by_server

PREFILL_US = 200
SIM = ("--prefill-per-token-us", str(PREFILL_US), "--decode-base-ms", "5", "--decode-per-seq-us",
       "0", "--decode-per-kv-token-ns", "0", "--block-size", "16")  # fmt: skip
RUN = ("--step-duration", "8", "--step-warmup", "0.5", "--cold-requests", "0")


def _run(
    tmp: Path, *args: str, sim: tuple[str, ...] = SIM
) -> tuple[LocustResult, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    with start_sim(tmp, *sim) as server:
        result = run_locust(server.url, tmp / "runs", *RUN, *args, timeout=120)
        truth = server.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, chunks, _ = result.events()
    return result, requests, chunks, truth


@pytest.fixture(scope="module")
def conversation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return _run(tmp_path_factory.mktemp("conv"), "--steps", "1", "--turns", "3",
                "--workload", "D(512,16)", "--followup-workload", "D(32,16)")  # fmt: skip


def test_rows_carry_their_session_and_turn(conversation: tuple[Any, ...]) -> None:
    _, requests, _, truth = conversation
    assert requests["session_id"].notna().all()
    sessions = requests.groupby("session_id")
    # every session ends whole: the last step's sessions in flight finish before the run
    # ends (before, the run's end cut their last turns: status aborted, no usage)
    complete = [g for _, g in sessions if len(g) == 3 and g["status"].eq("ok").all()]
    assert len(complete) >= 5 and len(complete) == sessions.ngroups
    for group in complete:
        ordered = group.sort_values("sent_at_ns")
        assert ordered["turn"].tolist() == [0, 1, 2]
        assert ordered["session_turns"].eq(3).all() and ordered["turn_kind"].eq("user").all()
        assert ordered["wait_ns"].iloc[0] == 0
        # every turn resends the conversation: the server counts prompt + replies + new message
        prompts = ordered["prompt_tokens"].tolist()
        outputs = ordered["output_tokens"].tolist()
        assert (
            prompts[1] == prompts[0] + outputs[0] + 32
            and prompts[2] == prompts[1] + outputs[1] + 32
        )
        assert ordered["history_tokens"].tolist()[1:] == [
            prompts[0] + outputs[0],
            prompts[1] + outputs[1],
        ]
    unseen = unseen_by_server(requests, truth)  # only turns cut by the run's end may be missing
    assert len(unseen) <= 2  # (a turn per session in flight at the end)
    for row in requests[requests["status"] == "ok"].itertuples():
        assert row.cached_tokens == truth[row.request_id]["cached_tokens"]


def test_the_report_gives_ttft_and_cached_tokens_by_turn(
    conversation: tuple[Any, ...], tmp_path: Path
) -> None:
    from analysis import build_report

    result, _, _, _ = conversation
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=True)
    turns = {row["turn"]: row for row in report.turns}
    assert set(turns) == {0, 1, 2}
    assert turns[1]["cached_tokens_mean"] >= 512
    assert turns[0]["ttft_p50_s"] > turns[1]["ttft_p50_s"]
    assert "plot-turns" in (tmp_path / "report" / "report.html").read_text()


def test_later_turns_are_faster_by_the_prefill_the_cache_saves(
    conversation: tuple[Any, ...],
) -> None:
    _, requests, _, _ = conversation
    ok = requests[requests["status"] == "ok"].copy()
    ok["ttft_s"] = ok["first_token_ns"] / 1e9
    ok["uncached"] = ok["prompt_tokens"] - ok["cached_tokens"]
    first, later = ok[ok["turn"] == 0], ok[ok["turn"].isin([1, 2])]
    assert later["cached_tokens"].min() >= 512  # the first message and reply are cached
    predicted = PREFILL_US / 1e6 * (first["uncached"].median() - later["uncached"].median())
    measured = first["ttft_s"].median() - later["ttft_s"].median()
    assert predicted > 0.09  # 480 tokens of prefill saved
    assert measured == pytest.approx(predicted, rel=0.2)


def test_an_agent_session_waits_for_its_tools_apart_from_model_time(tmp_path: Path) -> None:
    result, requests, chunks, truth = _run(
        tmp_path, "--steps", "2", "--turns", "2", "--tool-rate", "1", "--tool-latency", "0.2",
        "--workload", "D(32,12)", "--think-time", "0.05",
        sim=(*SIM, "--tool-call-rate", "0.5"),
    )  # fmt: skip
    tool_results = requests[requests["turn_kind"] == "tool_result"]
    users = requests[(requests["turn_kind"] == "user") & (requests["turn"] > 0)]
    assert len(tool_results) >= 5 and len(users) >= 5
    # each waits at least its own time, and typically about that (a sleep may wake late on a
    # busy machine: the medians, not every row, tell the two waits apart)
    assert tool_results["wait_ns"].ge(0.2e9).all() and tool_results["wait_ns"].median() < 0.3e9
    assert users["wait_ns"].ge(0.05e9).all() and users["wait_ns"].median() < 0.1e9
    unseen_by_server(requests, truth)
    called = requests[(requests["tool_calls"] > 0) & (requests["status"] == "ok")]
    assert len(called) >= 5
    for row in called.itertuples():
        assert truth[row.request_id]["tool_call"] is True
        assert row.output_tokens == truth[row.request_id]["completion_tokens"]
        kinds = chunks[chunks["request_id"] == row.request_id]["kind"]
        assert set(kinds) == {"tool_call"} and len(kinds) == row.output_tokens
        assert (
            row.first_token_ns is not None and row.first_content_ns != row.first_content_ns
        )  # NaN
    # the report's session table: tool waits and think times apart from model time
    from analysis import build_report

    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=True)
    sessions = report.sessions
    assert sessions is not None and (tmp_path / "report" / "sessions.csv").is_file()
    done = sessions[sessions["status"] == "complete"].set_index("session_id")
    assert len(done) >= 3
    for session_id, row in done.iterrows():
        turns = requests[requests["session_id"] == session_id]
        assert row["turns"] == len(turns)
        assert row["tool_rounds"] == (turns["turn_kind"] == "tool_result").sum()
        tools = turns.loc[turns["turn_kind"] == "tool_result", "wait_ns"].sum() / 1e9
        assert row["tool_wait_s"] == pytest.approx(tools)
        assert row["model_s"] == pytest.approx(turns["end_ns"].sum() / 1e9)
        assert row["session_e2e_s"] >= row["model_s"] + row["tool_wait_s"] + row["think_s"] - 1e-3
    # a tool result follows each completed call, in the same session, as the next turn
    for row in called[called["status"] == "ok"].itertuples():
        following = requests[
            (requests["session_id"] == row.session_id) & (requests["turn"] == row.turn + 1)
        ]
        if len(following):
            assert following["turn_kind"].iloc[0] == "tool_result"


def test_a_recorded_conversation_is_replayed_turn_by_turn(tmp_path: Path) -> None:
    chats = [
        [("what is a cat", "a small animal that purrs"), ("and a dog", "a loyal friend"),
         ("thanks", "welcome")],
        [("name three colours", "red green blue"), ("one more", "yellow")],
    ]  # fmt: skip
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(
        json.dumps({"conversations": [m for q, a in chat for m in
                                      ({"from": "human", "value": q}, {"from": "gpt", "value": a})]}) + "\n"
        for chat in chats
    ))  # fmt: skip
    _, requests, _, _ = _run(tmp_path, "--steps", "1", "--workload", f"conversations:{path}",
                             "--store-prompts")  # fmt: skip
    by_first = {chat[0][0]: chat for chat in chats}
    replayed = 0
    for _, group in requests.groupby("session_id"):
        ordered = group.sort_values("turn")
        messages = [json.loads(text) for text in ordered["prompt_text"]]
        chat = by_first[messages[0][-1]["content"]]
        assert ordered["session_turns"].iloc[0] == len(chat)
        for k, (row, sent) in enumerate(zip(ordered.itertuples(), messages, strict=True)):
            assert sent[-1] == {"role": "user", "content": chat[k][0]}  # the recorded question
            assert row.max_tokens == len(chat[k][1].split())  # its recorded reply's length
            assert [m["role"] for m in sent] == ["user", "assistant"] * k + ["user"]
        replayed += len(ordered) == len(chat)
    assert replayed >= 4


@pytest.mark.slow  # long (10-20 s): `make test-slow` keeps the default suite near 10 min
def test_open_loop_arrivals_start_sessions(tmp_path: Path) -> None:
    """Rate steps with sessions: each arrival starts one; the last step's drain lets the
    sessions in flight finish (before, the run's end cut them), and their later turns keep
    their session's step and rate."""
    result, requests, _, truth = _run(
        tmp_path, "--rates", "6", "--arrival", "constant", "--turns", "3", "--think-time", "0.3",
        "--workload", "D(16,4)",
    )  # fmt: skip
    unseen_by_server(requests, truth)
    first = requests[requests["turn"] == 0]
    later = requests[requests["turn"] > 0]
    assert first["intended_ns"].notna().all() and later["intended_ns"].isna().all()
    assert later["rate"].eq(6.0).all() and len(later) > len(first)
    # each arrival one session: arrival indexes are the sessions, in order, none twice
    assert first["arrival_index"].is_unique
    assert sorted(first["arrival_index"]) == list(range(len(first)))
    from analysis import build_report

    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=False)
    sessions = report.sessions
    assert sessions is not None
    statuses = sessions["status"].value_counts().to_dict()
    assert statuses.get("complete", 0) >= 20 and set(statuses) == {"complete"}  # none cut
    (row,) = [r for r in report.step_rows if r.get("group") == "step"]
    assert row["rate_achieved"] == pytest.approx(6.0, rel=0.1)  # sessions started per second
