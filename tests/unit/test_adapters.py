"""Stream adapters (locustfiles/request/adapters.py): the Responses and Messages streams as the
simulator and vLLM send them, a user's own adapter, and the failures an adapter can cause."""

from __future__ import annotations

import json

import pytest

from infra.simserver.apis import MessagesEncoder, ResponsesEncoder
from infra.simserver.sse import ToolCall
from locustfiles.request.adapters import (
    AdapterState,
    Delta,
    MessagesAdapter,
    ResponsesAdapter,
    StreamAdapter,
    parse_adapted_body,
)
from locustfiles.request.record import RequestRecord
from locustfiles.request.sse import data_of
from locustfiles.request.stream import StreamFailure


def record(endpoint: str = "responses", stream: bool = True) -> RequestRecord:
    return RequestRecord("r", 0, 1, False, "D(1,1)", endpoint, "m", stream, 1, 8, "h")


def datas(blocks: list[bytes]) -> list[bytes]:
    """Each SSE block's data, as the worker's reader gives it."""
    out = []
    for block in blocks:
        data = data_of(block.rstrip(b"\n"))
        assert data is not None, block
        out.append(data)
    return out


def run(state: AdapterState, events: list[bytes]) -> RequestRecord:
    for t, data in enumerate(events, start=1):
        state.on_event(data, t * 10)
    state.record.end_ns = len(events) * 10 + 5
    state.on_end()
    state.record.finish()
    return state.record


def encode(
    encoder: ResponsesEncoder | MessagesEncoder, words: list[bytes], reason: str
) -> list[bytes]:
    blocks = encoder.opening()
    for i, word in enumerate(words, start=1):
        blocks += encoder.deltas(word, i)
    blocks += encoder.closing(reason, len(words), True, b"".join(words).decode())
    return datas(blocks)


@pytest.mark.parametrize("reason, finish", [("stop", "stop"), ("length", "length")])
def test_the_simulators_responses_stream_reads_as_its_text_and_usage(
    reason: str, finish: str
) -> None:
    encoder = ResponsesEncoder("resp_1", "m", 7, None)
    encoder.set_cached(3)
    events = encode(encoder, [b" a", b" b", b" c"], reason)
    rec = run(AdapterState(record(), ResponsesAdapter(), None), events)
    assert rec.status == "ok", rec.error_detail
    assert rec.chunk_kinds == ["content"] * 3 and rec.chunk_tokens == [1, 1, 1]
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (7, 3, 3)
    assert rec.server_request_id == "resp_1"
    # the first output is the first delta, not response.created's event
    assert rec.first_event_ns == 10 and rec.first_token_ns == rec.first_content_ns > 10
    assert rec.events == len(events)
    state = AdapterState(record(), ResponsesAdapter(), None)
    run(state, events)
    assert state.finish_reason == finish


def test_a_responses_function_call_is_a_tool_call() -> None:
    encoder = ResponsesEncoder("resp_2", "m", 4, ToolCall("call_9", "lookup"))
    events = encode(encoder, [b" q", b" r"], "tool_calls")
    rec = record()
    rec.reply_parts = []
    rec = run(AdapterState(rec, ResponsesAdapter(), None), events)
    assert rec.status == "ok" and rec.tool_calls == 1
    assert rec.tool_call_parts == {0: {"id": "call_9", "name": "lookup", "arguments": " q r"}}
    assert rec.chunk_kinds[-2:] == ["tool_call", "tool_call"]


def test_the_simulators_messages_stream_with_ping_and_cached_tokens() -> None:
    encoder = MessagesEncoder("msg_1", "m", 9, None)
    encoder.set_cached(4)
    events = encode(encoder, [b" x", b" y"], "length")
    assert any(json.loads(e)["type"] == "ping" for e in events)
    state = AdapterState(record("messages"), MessagesAdapter(), None)
    rec = run(state, events)
    assert rec.status == "ok", rec.error_detail
    # the prompt is input_tokens plus the tokens read from the cache
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (9, 4, 2)
    assert rec.chunk_tokens == [1, 1] and state.finish_reason == "length" and state.done


def test_messages_thinking_is_reasoning_and_tool_use_a_call() -> None:
    events = [
        b'{"type":"message_start","message":{"id":"m1","usage":{"input_tokens":3,"output_tokens":1}}}',
        b'{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}',
        b'{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"tu1","name":"f","input":{}}}',
        b'{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\":1}"}}',
        b'{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":6}}',
        b'{"type":"message_stop"}',
    ]
    rec = run(AdapterState(record("messages"), MessagesAdapter(), None), events)
    assert rec.status == "ok"
    assert rec.chunk_kinds[:3] == ["reasoning", "tool_call", "tool_call"]
    assert rec.first_token_ns == 30 and rec.first_content_ns is None
    assert rec.tool_call_parts == {0: {"id": "tu1", "name": "f", "arguments": '{"a":1}'}}
    # the output tokens of message_delta: the events carried 3, the rest is placed at the end
    # only with exact counts (here one per event: left out, as for chat)
    assert rec.completion_tokens == 6 and rec.output_tokens == 6


def test_an_error_event_fails_the_request_as_stream_error() -> None:
    for adapter, event in (
        (
            MessagesAdapter(),
            b'{"type":"error","error":{"type":"overloaded_error","message":"busy"}}',
        ),
        (ResponsesAdapter(), b'{"type":"error","code":"x","message":"bad thing"}'),
        (ResponsesAdapter(), b'{"type":"response.failed","response":{"error":{"message":"oom"}}}'),
    ):
        state = AdapterState(record(), adapter, None)
        with pytest.raises(StreamFailure) as failed:
            state.on_event(event, 1)
        assert failed.value.kind == "stream_error"
        assert failed.value.detail in ("busy", "bad thing", "oom")


def test_a_stream_that_stops_before_its_end_is_truncated() -> None:
    encoder = MessagesEncoder("msg_1", "m", 9, None)
    events = encode(encoder, [b" x"], "stop")[:-2]  # no message_delta, no message_stop
    state = AdapterState(record("messages"), MessagesAdapter(), None)
    with pytest.raises(StreamFailure) as failed:
        run(state, events)
    assert failed.value.kind == "stream_truncated"


class Boom(StreamAdapter):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def on_event(self, data: bytes) -> Delta | None:
        raise self.exc


@pytest.mark.parametrize("exc, kind", [(KeyError("text"), "malformed_event"),
                                       (ValueError("no"), "malformed_event"),
                                       (RuntimeError("bug"), "client_error"),
                                       (StreamFailure("stream_error", "said so"), "stream_error")])  # fmt: skip
def test_an_adapter_that_raises_fails_its_request_as_data(exc: Exception, kind: str) -> None:
    state = AdapterState(record("rag"), Boom(exc), None)
    with pytest.raises(StreamFailure) as failed:
        state.on_event(b'{"kind":"token"}', 1)
    assert failed.value.kind == kind
    if kind != "stream_error":
        assert "Boom raised" in failed.value.detail and "kind" in failed.value.detail


class Exact(StreamAdapter):
    framing = "lines"

    def on_event(self, data: bytes) -> list[Delta]:
        text, tokens = data.decode().split("|")
        return [Delta(text=text, tokens=int(tokens))]

    def on_end(self) -> Delta:
        return Delta(finish="stop")


def test_a_users_adapter_with_exact_counts_and_an_end_of_its_own() -> None:
    rec = run(AdapterState(record("lines"), Exact(), None), [b"a|2", b"|1", b"b c|3"])
    assert rec.status == "ok"
    # an event with tokens and no text is a chunk of 0 characters, as usage-only tokens are
    assert rec.chunk_tokens == [2, 1, 3] and rec.chunk_chars == [1, 0, 3]
    assert rec.output_tokens_source == "usage" and rec.output_tokens == 6


def test_a_count_that_is_no_count_is_invalid_usage() -> None:
    class Bad(StreamAdapter):
        def on_event(self, data: bytes) -> Delta:
            return Delta(text="x", tokens="3")  # type: ignore[arg-type]

    with pytest.raises(StreamFailure) as failed:
        AdapterState(record("x"), Bad(), None).on_event(b"{}", 1)
    assert failed.value.kind == "invalid_usage"


@pytest.mark.parametrize("encoder, adapter", [
    (ResponsesEncoder("resp_3", "m", 5, None), ResponsesAdapter()),
    (MessagesEncoder("msg_3", "m", 5, None), MessagesAdapter()),
    (ResponsesEncoder("resp_4", "m", 5, ToolCall("c1", "lookup")), ResponsesAdapter()),
    (MessagesEncoder("msg_4", "m", 5, ToolCall("c1", "lookup")), MessagesAdapter()),
])  # fmt: skip
def test_whole_bodies_read_as_the_streams_do(encoder: ResponsesEncoder | MessagesEncoder,
                                             adapter: StreamAdapter) -> None:  # fmt: skip
    reason = "tool_calls" if encoder.tool_call else "stop"
    body = json.dumps(encoder.whole(reason, 4, " a b c d")).encode()
    rec = record(stream=False)
    rec.end_ns = 100
    parse_adapted_body(rec, body, adapter, None)
    rec.finish()
    assert (rec.prompt_tokens, rec.completion_tokens, rec.output_tokens) == (5, 4, 4)
    assert rec.first_token_ns == 100
    assert rec.tool_calls == (1 if encoder.tool_call else None)
    assert rec.first_content_ns == (None if encoder.tool_call else 100)


class Pieces:
    """A non-chunked response whose reads return these pieces (sse.body_reads' fallback)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def read1(self, n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def test_lines_framing_splits_every_way_a_body_can_be_read() -> None:
    import random

    from locustfiles.request.sse import EventTooLong, lines

    body = b"one\r\ntwo\n\nthree four\nlast"
    want = [b"one", b"two", b"", b"three four", b"last"]
    rng = random.Random(5)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(body)), k=rng.randint(0, 6)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        got = [d for datas, _ in lines(Pieces(pieces)) for d in datas]
        assert got == want, pieces
    with pytest.raises(EventTooLong):
        list(lines(Pieces([b"x" * 50, b"y" * 60]), max_line_bytes=100))


def test_chat_history_in_the_responses_and_messages_shapes() -> None:
    from locustfiles.run.body import anthropic_messages, endpoint_tools, responses_input
    from locustfiles.traffic.sessions import TOOLS

    history = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"query":"x"}'}},
            {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "not json"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "x is 1"},
        {"role": "tool", "tool_call_id": "c2", "content": "x is 2"},
    ]  # fmt: skip
    instructions, items = responses_input(history)
    assert instructions == "be brief"
    assert [i.get("type", i.get("role")) for i in items] == [
        "user",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert items[1]["call_id"] == "c1" and items[1]["arguments"] == '{"query":"x"}'
    system, turns = anthropic_messages(history)
    assert system == "be brief" and [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["input"] for b in turns[1]["content"]] == [{"query": "x"}, {}]
    assert [b["tool_use_id"] for b in turns[2]["content"]] == ["c1", "c2"]  # one user turn
    assert endpoint_tools("messages", TOOLS)[0]["input_schema"]["required"] == ["query"]
    assert endpoint_tools("responses", TOOLS)[0]["name"] == "lookup"


def test_continuous_usage_on_is_refused_for_the_apis_without_it() -> None:
    from analysis.kernel.errors import UsageError
    from locustfiles.options.options import from_parsed
    from tests.support.options import parsed_options

    for endpoint in ("responses", "messages"):
        with pytest.raises(UsageError, match=f"the {endpoint} API has no such stream option"):
            from_parsed(parsed_options(endpoint=endpoint, continuous_usage="on"))
        options = from_parsed(parsed_options(endpoint=endpoint))
        assert options.path == f"/v1/{endpoint}"
    assert from_parsed(parsed_options(endpoint="completions", continuous_usage="on")).path == (
        "/v1/completions"
    )


@pytest.mark.parametrize("encoder, adapter", [
    (ResponsesEncoder("resp_5", "m", 5, None, reasoning=2), ResponsesAdapter()),
    (MessagesEncoder("msg_5", "m", 5, None, reasoning=2), MessagesAdapter()),
])  # fmt: skip
def test_a_reasoning_phase_streams_before_the_answer(encoder: ResponsesEncoder | MessagesEncoder,
                                                    adapter: StreamAdapter) -> None:  # fmt: skip
    """The simulator's reasoning phase (`--reasoning-tokens`): reasoning deltas, then the
    answer's item or block at index 1; read as reasoning chunks, then content."""
    blocks = encoder.opening()
    words = [b" r1", b" r2", b" a1", b" a2", b" a3"]
    for i, word in enumerate(words, start=1):
        blocks += encoder.deltas(word, i, reasoning=i <= 2)
    blocks += encoder.closing("stop", 5, True, " a1 a2 a3")
    events = datas(blocks)
    rec = run(AdapterState(record(), adapter, None), events)
    assert rec.status == "ok", rec.error_detail
    assert rec.chunk_kinds == ["reasoning", "reasoning", "content", "content", "content"]
    assert rec.first_token_ns < rec.first_content_ns and rec.completion_tokens == 5
    assert (
        rec.first_reasoning_ns == rec.first_token_ns and rec.first_answer_ns == rec.first_content_ns
    )
    assert rec.reasoning_tokens == 2  # the Responses API's usage details, else the events'
    last = json.loads(events[-2] if isinstance(encoder, MessagesEncoder) else events[-1])
    if isinstance(encoder, ResponsesEncoder):  # the reasoning item, then the message
        output = last["response"]["output"]
        assert [o["type"] for o in output] == ["reasoning", "message"]
        assert output[0]["content"][0]["text"] == " r1 r2"
        assert last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
    body = encoder.whole("stop", 5, " a1 a2 a3", " r1 r2")
    whole = record(stream=False)
    whole.end_ns = 9
    parse_adapted_body(whole, json.dumps(body).encode(), type(adapter)(), None)
    assert whole.completion_tokens == 5 and whole.first_content_ns == 9
    whole.finish()
    assert whole.first_reasoning_ns == whole.first_answer_ns == 9
    # the Responses API counts them; Messages' thinking, whole and without a tokenizer: unknown
    assert whole.reasoning_tokens == (2 if isinstance(encoder, ResponsesEncoder) else None)
