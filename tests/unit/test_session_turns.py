"""Sessions on the client: spreads, recorded conversations, tool-call deltas, history."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.request.record import RequestRecord
from locustfiles.request.stream import StreamState, parse_body
from locustfiles.traffic.sessions import MAX_TOOL_ROUNDS, TOOLS, Session, Turn
from locustfiles.traffic.spread import parse_spread
from locustfiles.traffic.workloads import parse_workload


# -- spreads ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "integer", "mean"),
    [("2", False, 2.0), ("U(1,3)", False, 2.0), ("N(2,0.1)", False, 2.0), ("exp(2)", False, 2.0),
     ("3", True, 3.0), ("U(2,4)", True, 3.0)],
)  # fmt: skip
def test_spreads_draw_around_their_mean(text: str, integer: bool, mean: float) -> None:
    spread = parse_spread("--x", text, integer=integer)
    rng = random.Random(1)
    draws = [spread.sample(rng) for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(mean, rel=0.05)
    assert min(draws) >= spread.minimum
    if integer:
        assert all(d == int(d) for d in draws)


@pytest.mark.parametrize(
    ("text", "integer", "fragment"),
    [("-1", False, "must be seconds >= 0"), ("0", True, "must be an integer >= 1"),
     ("U(3,1)", False, "U(a,b) needs 0 <= a <= b"), ("N(2,-1)", False, "needs mean >= 0 and sd >= 0"),
     ("exp(2)", True, "not understood"), ("soon", False, "not understood"), ("U(1.5,3)", True, "whole numbers")],
)  # fmt: skip
def test_bad_spreads_are_refused(text: str, integer: bool, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_spread("--x", text, integer=integer)


# -- recorded conversations ---------------------------------------------------------------
def test_sharegpt_and_messages_conversations_are_read_turn_by_turn(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    lines = [
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "a b"},
                           {"from": "gpt", "value": "one two three"}, {"from": "human", "value": "c"}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                      {"role": "tool", "content": "skipped"}]},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    workload = parse_workload(f"conversations:{path}")
    chats = workload.components[0].rows
    assert chats[0].system == "be brief"
    assert chats[0].turns == (("a b", 3), ("c", None))
    assert chats[1].system is None and chats[1].turns == (("x", 1),)
    spec = workload.sampler(0).sample()
    assert spec.conversation in chats and spec.prompt_text == spec.conversation.turns[0][0]


# -- tool-call deltas and cached tokens ---------------------------------------------------
def _event(
    delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
) -> bytes:
    obj: dict[str, Any] = {
        "id": "s",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj).encode()


def test_tool_call_deltas_are_output_and_the_first_is_the_first_token() -> None:
    rec = RequestRecord("r", 0, 1, False, "s", "chat", "m", True, 4, 8, "h")
    rec.reply_parts = []
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(_event({"role": "assistant"}), 5)
    head = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": ""},
    }
    state.on_event(_event({"tool_calls": [head]}), 10)
    state.on_event(_event({"tool_calls": [{"index": 0, "function": {"arguments": " big"}}]}), 20)
    state.on_event(_event({"tool_calls": [{"index": 0, "function": {"arguments": " cat"}}]}), 30)
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    state.on_event(_event({}, "tool_calls", usage), 40)
    state.on_end()
    rec.finish()
    assert rec.first_event_ns == 5 and rec.first_token_ns == 10 and rec.first_content_ns is None
    assert rec.chunk_kinds == ["tool_call"] * 3 and rec.chunk_offsets == [10, 20, 30]
    assert rec.tool_calls == 1
    assert rec.tool_call_parts == {0: {"id": "call_1", "name": "lookup", "arguments": " big cat"}}
    assert rec.cached_tokens == 32 and rec.output_tokens == 3
    assert rec.reply_parts == []  # no content


def test_a_non_streamed_tool_call_and_its_cached_tokens() -> None:
    rec = RequestRecord("r", 0, 1, False, "s", "chat", "m", False, 4, 8, "h")
    rec.end_ns = 99
    body = {"id": "x", "choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "lookup", "arguments": "a b"}}]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}}  # fmt: skip
    parse_body(rec, json.dumps(body).encode(), chat=True, counter=None)
    assert rec.tool_calls == 1 and rec.first_token_ns == 99 and rec.cached_tokens == 0
    assert rec.tool_call_parts == {0: {"id": "c9", "name": "lookup", "arguments": "a b"}}


# -- the session's turns ------------------------------------------------------------------
class FakePrompts:
    def build(self, n: int, rng: random.Random) -> str:
        return " ".join(["first"] * n)

    def text(self, n: int, rng: random.Random) -> str:
        return " ".join(["more"] * n)


def fake_ctx(turns: str = "3", history: int = 0, tool_rate: float = 0.0, workload: str = "D(4,2)",
             followup: str = "D(2,2)") -> Any:  # fmt: skip
    options = SimpleNamespace(
        turns=parse_spread("--turns", turns, integer=True),
        think_time=parse_spread("--think-time", "0"),
        tool_latency=parse_spread("--tool-latency", "0"),
        history=history, tool_rate=tool_rate,
    )  # fmt: skip
    return SimpleNamespace(
        options=options, sampler=parse_workload(workload).sampler(0),
        followup_sampler=parse_workload(followup).sampler(0), prompts=FakePrompts(),
        counter=None, rng=random.Random(0),
    )  # fmt: skip


def server(call_tools: bool = False) -> tuple[list[Turn], Any]:
    """A stand-in for run_one: replies 'r<i>' (2 tokens), or a tool call when tools are offered."""
    sent: list[Turn] = []

    def send(turn: Turn) -> RequestRecord:
        sent.append(turn)
        rec = RequestRecord(f"q{len(sent)}", 0, 1, False, turn.scenario, "chat", "m", True,
                            turn.new_tokens, turn.max_tokens, "h")  # fmt: skip
        turn.apply(rec)
        if call_tools and turn.offer_tools:
            rec.tool_call_parts = {0: {"id": f"c{len(sent)}", "name": "lookup", "arguments": "x y"}}
            rec.tool_calls = 1
        else:
            rec.reply_parts = [f"r{len(sent)} ok"]
        rec.output_tokens = 2
        return rec

    return sent, send


def test_each_turn_resends_the_whole_history() -> None:
    sent, send = server()
    records = Session(fake_ctx(), random.Random(0)).run(send)
    assert [r.turn for r in records] == [0, 1, 2] and {r.session_turns for r in records} == {3}
    assert len({r.session_id for r in records}) == 1
    last = sent[-1].messages
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[0]["content"] == "first first first first" and last[1]["content"] == "r1 ok"
    assert last[-1]["content"] == "more more"
    assert [t.history_tokens for t in sent] == [None, 6, 10]  # (4 + 2), then + (2 + 2)
    assert [t.new_tokens for t in sent] == [4, 2, 2]


def test_a_window_keeps_the_last_turns() -> None:
    sent, send = server()
    Session(fake_ctx(turns="4", history=1), random.Random(0)).run(send)
    assert [m["content"] for m in sent[-1].messages] == ["more more", "r3 ok", "more more"]


def test_a_tool_call_is_answered_by_a_tool_result_turn() -> None:
    sent, send = server(call_tools=True)
    records = Session(fake_ctx(turns="2", tool_rate=1.0), random.Random(0)).run(send)
    kinds = [t.kind for t in sent]
    assert kinds[:2] == ["user", "tool_result"]
    assert len(records) == 2 + MAX_TOOL_ROUNDS  # tools offered every turn, called every time
    assert kinds.count("user") == 2 and kinds.count("tool_result") == MAX_TOOL_ROUNDS
    result = sent[1].messages
    assert result[-2]["tool_calls"][0]["id"] == "c1" and result[-2]["content"] is None
    assert result[-1] == {"role": "tool", "tool_call_id": "c1", "content": "more more"}
    assert not sent[-1].offer_tools  # none offered after MAX_TOOL_ROUNDS
    assert TOOLS[0]["function"]["name"] == "lookup"


def test_a_failed_turn_ends_the_session() -> None:
    sent, send = server()

    def failing(turn: Turn) -> RequestRecord:
        rec = send(turn)
        if turn.index == 1:
            rec.fail("http_5xx", "boom")
        return rec

    records = Session(fake_ctx(turns="5"), random.Random(0)).run(failing)
    assert [r.status for r in records] == ["ok", "error"]


def test_a_recorded_conversation_is_replayed_in_order(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    chat = {"conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a b c"},
                              {"from": "human", "value": "q2"}, {"from": "gpt", "value": "d"}]}  # fmt: skip
    path.write_text(json.dumps(chat) + "\n")
    sent, send = server()
    Session(fake_ctx(workload=f"conversations:{path}"), random.Random(0)).run(send)
    assert [t.messages[-1]["content"] for t in sent] == ["q1", "q2"]
    assert [t.max_tokens for t in sent] == [3, 1]
    assert sent[1].messages[1] == {"role": "assistant", "content": "r1 ok"}
