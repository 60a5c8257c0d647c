"""Tool calls from the simulator over real sockets: the streamed and whole shapes, the rate
and `tool_choice` rules, and follow-up requests carrying tool calls and tool results."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.support.sim import RunningSim, SimFactory, request, stream_request

CHAT = "/v1/chat/completions"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def _body(content: str = "what is the weather", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "tools": TOOLS, **extra}


def _whole(sim: RunningSim, body: dict[str, Any]) -> dict[str, Any]:
    status, _, raw = request(sim.port, "POST", CHAT, body)
    assert status == 200, raw
    return json.loads(raw)


def _is_tool_call(sim: RunningSim, **extra: Any) -> bool:
    choice = _whole(sim, _body(max_tokens=2, **extra))["choices"][0]
    return choice["finish_reason"] == "tool_calls"


def test_streamed_tool_call_shape(sim: RunningSim) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = _body(max_tokens=6, ignore_eos=True, stream=True, stream_options=options,
                 tool_choice="required")  # fmt: skip
    stream = stream_request(sim.port, body)
    assert stream.complete and stream.events[-1] == b"[DONE]"
    events = stream.json_events()
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # the first generated token opens the call: id, type, name and the arguments' first token
    opening = events[1]["choices"][0]["delta"]
    call = opening["tool_calls"][0]
    assert CALL_ID.fullmatch(call.pop("id"))
    first_words = call["function"].pop("arguments")
    assert call == {"index": 0, "type": "function", "function": {"name": "get_weather"}}
    assert first_words == "{" and events[1]["usage"]["completion_tokens"] == 1
    deltas = [e["choices"][0]["delta"] for e in events[2:-2]]
    assert len(deltas) == 5  # one token per event, as for content
    arguments = first_words
    for n, delta in enumerate(deltas, start=2):
        assert list(delta) == ["tool_calls"]
        (part,) = delta["tool_calls"]
        assert part["index"] == 0 and list(part["function"]) == ["arguments"]
        arguments += part["function"]["arguments"]
        assert events[n]["usage"]["completion_tokens"] == n
    # the arguments are JSON of the tool's parameters (`{"type": "object"}`: an object),
    # padded with spaces to the 6 tokens ignore_eos asks for (infra/simserver/structured.py)
    assert json.loads(arguments) == {} and arguments == "{}    "
    finish = events[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "tool_calls"
    usage = events[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens"] == 4


def test_whole_tool_call_shape(sim: RunningSim) -> None:
    choice_of = {"type": "function", "function": {"name": "get_time"}}
    answer = _whole(sim, _body(max_tokens=5, ignore_eos=True, tool_choice=choice_of))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    (call,) = message["tool_calls"]
    assert CALL_ID.fullmatch(call["id"]) and call["type"] == "function"
    assert call["function"]["name"] == "get_time"  # the named function, not the first tool
    assert json.loads(call["function"]["arguments"]) == {}  # JSON of the tool's parameters
    assert answer["usage"]["completion_tokens"] == 5


def test_rate_and_tool_choice(sim_factory: SimFactory) -> None:
    never = sim_factory("--tool-call-rate", "0")
    assert not any(_is_tool_call(never) for _ in range(5))
    assert _is_tool_call(never, tool_choice="required")
    always = sim_factory("--tool-call-rate", "1")
    assert all(_is_tool_call(always) for _ in range(5))
    assert not _is_tool_call(always, tool_choice="none")
    plain = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert _whole(always, plain)["choices"][0]["finish_reason"] != "tool_calls"  # no tools
    half = sim_factory()  # default 0.5, seeded
    drawn = [_is_tool_call(half) for _ in range(30)]
    assert 5 <= sum(drawn) <= 25
    for bad in (
        {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [{"type": "function", "function": {}}]},
        {"tools": [], "tool_choice": "required"},
    ):
        status, _, _ = request(always.port, "POST", CHAT, {**_body(max_tokens=2), **bad})
        assert status == 400, bad


def test_follow_up_with_tool_messages_is_counted_and_cached(
    sim_factory: SimFactory, tmp_path: Path
) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = sim_factory("--tool-call-rate", "1", "--truth-log", str(truth))
    question = " ".join(f"q{i}" for i in range(20))
    first = _whole(sim, _body(question, max_tokens=12, ignore_eos=True))
    (call,) = first["choices"][0]["message"]["tool_calls"]
    follow_up = {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny twenty degrees"},
        ],
        "max_tokens": 3,
        "ignore_eos": True,
        "tools": TOOLS,
        "tool_choice": "none",
    }
    answer = _whole(sim, follow_up)
    # 20 question words + the arguments' one word (`{}` and spaces) + 3 tool-result words;
    # the first turn's first block (16 question words) is cached: its second block went on
    # with the generated tokens, which the resent arguments do not spell the same way
    assert answer["usage"]["prompt_tokens"] == 24
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    assert answer["choices"][0]["message"]["content"]
    bad = {**follow_up, "messages": [follow_up["messages"][0],
           {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]}  # fmt: skip
    assert request(sim.port, "POST", CHAT, bad)[0] == 400
    sim.stop()
    records = [json.loads(line) for line in truth.read_text().splitlines()]
    finished = [r for r in records if r["outcome"] == "finished"]
    assert [(r["tool_call"], r["finish_reason"]) for r in finished] == [
        (True, "tool_calls"),
        (False, "length"),
    ]
    assert [r["cached_tokens"] for r in finished] == [0, 16]
