"""The stream rules: first event vs first token, token sources, totals, finish, failures."""

from __future__ import annotations

import json

import pytest

from locustfiles.request.record import RequestRecord
from locustfiles.request.stream import StreamFailure, StreamState, parse_body
from locustfiles.request.tokenizer import TokenCounter


def record(stream: bool = True) -> RequestRecord:
    return RequestRecord("r", 0, 1, False, "D(1,1)", "chat", "m", stream, 1, 8, "h")


def chunk(content: str = "", reasoning: str = "", finish: str | None = None, usage: dict | None = None,
          role: bool = False) -> bytes:  # fmt: skip
    delta: dict = {"role": "assistant"} if role else {}
    if content:
        delta["content"] = content
    if reasoning:
        delta["reasoning_content"] = reasoning
    obj: dict = {"id": "srv-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj).encode()


def test_role_chunk_is_first_event_not_first_token_and_reasoning_counts_as_token() -> None:
    rec = record()
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(chunk(role=True), 10)
    state.on_event(chunk(reasoning="think"), 20)
    state.on_event(chunk(content="Hi"), 30)
    state.on_event(chunk(content=" there", finish="stop"), 40)
    state.on_end()  # no [DONE]: complete after a finish reason
    rec.finish()
    assert (rec.first_event_ns, rec.first_token_ns, rec.first_content_ns, rec.last_token_ns) == (
        10,
        20,
        30,
        40,
    )
    assert rec.chunk_kinds == ["reasoning", "content", "content"]
    assert rec.output_tokens_source == "events" and rec.output_tokens == 3
    assert rec.server_request_id == "srv-1"


def test_reasoning_then_answer_times_and_counts_apart() -> None:
    """TTFR at the first reasoning event, TTFO at the first answer (content or tool call);
    the reasoning events' tokens counted apart, the server's own count preferred."""
    rec = record()
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(chunk(role=True), 10)
    state.on_event(chunk(reasoning="think"), 20)
    state.on_event(chunk(reasoning="more"), 25)
    state.on_event(chunk(content="Hi", finish="stop"), 30)
    state.on_end()
    rec.finish()
    assert (rec.first_token_ns, rec.first_reasoning_ns, rec.first_answer_ns) == (20, 20, 30)
    assert (rec.reasoning_tokens, rec.output_tokens) == (2, 3)
    served = record()
    state = StreamState(served, chat=True, counter=None)
    state.on_event(chunk(reasoning="think"), 20)
    state.on_event(chunk(content="Hi", finish="stop"), 30)
    state.on_event(
        chunk(
            usage={
                "completion_tokens": 9,
                "prompt_tokens": 1,
                "completion_tokens_details": {"reasoning_tokens": 6},
            }
        ),
        31,
    )
    state.on_end()
    served.finish()
    assert (served.reasoning_tokens, served.output_tokens, served.status) == (6, 9, "ok")
    plain = record()
    state = StreamState(plain, chat=True, counter=None)
    state.on_event(chunk(content="Hi", finish="stop"), 30)
    state.on_end()
    plain.finish()
    assert (plain.first_reasoning_ns, plain.first_answer_ns, plain.reasoning_tokens) == (
        None, 30, 0)  # fmt: skip


def test_a_reply_cut_in_its_reasoning_has_no_answer_time_and_more_reasoning_is_invalid() -> None:
    rec = record()
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(chunk(reasoning="think", finish="length"), 20)
    state.on_end()
    rec.finish()
    assert (rec.first_reasoning_ns, rec.first_answer_ns, rec.reasoning_tokens) == (20, None, 1)
    wrong = record()
    state = StreamState(wrong, chat=True, counter=None)
    state.on_event(
        chunk(
            content="Hi",
            finish="stop",
            usage={"completion_tokens": 1, "completion_tokens_details": {"reasoning_tokens": 4}},
        ),
        30,
    )
    state.on_end()
    wrong.finish()
    assert (wrong.status, wrong.error_kind) == ("error", "invalid_usage")
    assert "4 reasoning tokens of 1 output tokens" in wrong.error_detail


def test_a_whole_body_with_reasoning_times_both_at_its_end() -> None:
    rec = record(stream=False)
    rec.end_ns = 50
    body = {
        "choices": [{"message": {"reasoning_content": "hmm", "content": "Hi"}}],
        "usage": {"completion_tokens": 7, "completion_tokens_details": {"reasoning_tokens": 5}},
    }
    parse_body(rec, json.dumps(body).encode(), True, None)
    rec.finish()
    assert (rec.first_reasoning_ns, rec.first_answer_ns, rec.first_token_ns) == (50, 50, 50)
    assert (rec.reasoning_tokens, rec.output_tokens) == (5, 7)


def test_continuous_usage_gives_exact_tokens_per_event_and_totals() -> None:
    rec = record()
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(chunk(content="a b", usage={"prompt_tokens": 5, "completion_tokens": 2}), 1)
    state.on_event(chunk(content="c d e", usage={"prompt_tokens": 5, "completion_tokens": 5}), 2)
    state.on_event(chunk(finish="length", usage={"prompt_tokens": 5, "completion_tokens": 5}), 3)
    state.on_event(b"[DONE]", 4)
    state.on_end()
    rec.finish()
    assert rec.chunk_tokens == [2, 3]
    assert rec.output_tokens_source == "usage"
    assert (rec.prompt_tokens, rec.output_tokens, rec.events) == (5, 5, 4)


def test_tokenizer_counts_event_text_when_usage_is_only_at_the_end() -> None:
    counter = TokenCounter(lambda text: text.split(), "words")
    rec = record()
    state = StreamState(rec, chat=True, counter=counter)
    state.on_event(chunk(content="a b c"), 1)
    state.on_event(chunk(content=" d", finish="stop"), 2)
    state.on_event(
        json.dumps({"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 1}}).encode(),
        3,
    )
    state.on_end()
    rec.finish()
    assert rec.chunk_tokens == [3, 1] and rec.output_tokens_source == "tokenizer"
    assert rec.output_tokens == 4  # the server's total wins


@pytest.mark.parametrize(
    ("data", "kind"),
    [(b"{not json", "malformed_event"), (b"[1, 2]", "malformed_event"),
     (b'{"error": {"message": "boom"}}', "stream_error"),
     (b'{"choices": ["x"]}', "malformed_event")],
)  # fmt: skip
def test_bad_events_are_failures_with_a_kind(data: bytes, kind: str) -> None:
    with pytest.raises(StreamFailure) as info:
        StreamState(record(), chat=True, counter=None).on_event(data, 1)
    assert info.value.kind == kind


def test_a_stream_ending_without_finish_is_truncated() -> None:
    state = StreamState(record(), chat=True, counter=None)
    state.on_event(chunk(content="x"), 1)
    with pytest.raises(StreamFailure, match="without a finish reason after 1 output events"):
        state.on_end()


def test_non_streaming_body_sets_ttft_to_e2e_and_no_tpot() -> None:
    rec = record(stream=False)
    rec.end_ns = 500
    body = {
        "id": "x",
        "choices": [{"message": {"content": "hello"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 7},
    }
    parse_body(rec, json.dumps(body).encode(), chat=True, counter=None)
    rec.finish()
    assert rec.first_token_ns == 500 and rec.last_token_ns is None
    assert rec.output_tokens == 7 and rec.chunk_offsets == []


def test_tokens_without_text_are_placed_at_the_event_that_reported_them() -> None:
    # continuous usage: the finish event reports one more token (end of sequence) and no text
    rec = record()
    state = StreamState(rec, chat=True, counter=None)
    state.on_event(chunk(content="a b", usage={"completion_tokens": 2}), 10)
    state.on_event(chunk(finish="stop", usage={"completion_tokens": 3}), 30)
    state.on_end()
    rec.finish()
    assert (
        rec.chunk_tokens == [2, 1] and rec.chunk_chars == [3, 0] and rec.chunk_offsets == [10, 30]
    )
    assert rec.last_token_ns == 30 and rec.output_tokens == 3


def test_final_usage_remainder_goes_to_the_finish_event_only_when_counts_are_exact() -> None:
    counter = TokenCounter(lambda text: text.split(), "words")
    final_usage = json.dumps({"choices": [], "usage": {"completion_tokens": 4}}).encode()
    rec = record()
    state = StreamState(rec, chat=True, counter=counter)
    state.on_event(chunk(content="a b c"), 10)
    state.on_event(chunk(finish="stop"), 20)
    state.on_event(final_usage, 25)
    state.on_end()
    assert rec.chunk_tokens == [3, 1] and rec.chunk_offsets == [10, 20]
    # one token per event: the remainder's arrival is unknown, so nothing is invented
    rec2 = record()
    state2 = StreamState(rec2, chat=True, counter=None)
    state2.on_event(chunk(content="a b c"), 10)
    state2.on_event(chunk(finish="stop"), 20)
    state2.on_event(final_usage, 25)
    state2.on_end()
    rec2.finish()
    assert rec2.chunk_tokens == [1] and rec2.output_tokens == 4


def test_usage_only_at_the_end_is_not_mistaken_for_textless_tokens() -> None:
    counter = TokenCounter(lambda text: text.split(), "words")
    rec = record()
    state = StreamState(rec, chat=True, counter=counter)
    state.on_event(chunk(content="a b"), 10)
    state.on_event(chunk(content="c", finish="stop", usage={"completion_tokens": 3}), 20)
    state.on_end()
    assert rec.chunk_tokens == [2, 1]


def test_an_answer_that_was_only_an_end_of_sequence_token_has_its_token_placed() -> None:
    """The model's first token was EOS: no event carries text, usage counts 1. The token is
    placed at the finish event, so chunk tokens still add up to usage; there is no TTFT."""
    final_usage = json.dumps({"choices": [], "usage": {"completion_tokens": 1}}).encode()
    for counter in (None, TokenCounter(lambda text: text.split(), "words")):
        rec = record()
        state = StreamState(rec, chat=True, counter=counter)
        state.on_event(chunk(role=True), 10)
        state.on_event(chunk(finish="stop"), 20)
        state.on_event(final_usage, 25)
        state.on_end()
        rec.finish()
        assert rec.chunk_tokens == [1] and rec.chunk_offsets == [20] and rec.chunk_chars == [0]
        assert rec.first_token_ns is None and rec.output_tokens == 1
        assert rec.output_tokens_source == "usage"


def test_events_the_fast_decoder_refuses_parse_as_the_standard_one_would() -> None:
    """orjson first (stream._loads); NaN, integers past 64 bits and invalid UTF-8 fall back to
    the standard decoder on the text decoded with replacement, exactly as before."""
    rec = record()
    state = StreamState(rec, chat=True, counter=None)
    base = {"id": "srv-1", "choices": [{"index": 0, "delta": {"content": "Hi\ufffd"}}]}
    odd = json.dumps({**base, "score": float("nan"), "seed": 2**70})  # both json-only
    state.on_event(odd.encode(), 10)
    text = json.dumps(base).replace("\\ufffd", "")
    bad_utf8 = text.replace('"Hi"', '"Hi\xff"').encode("latin-1")  # one byte no UTF-8 allows
    state.on_event(bad_utf8, 20)
    assert rec.chunk_offsets == [10, 20] and rec.events == 2
    with pytest.raises(StreamFailure, match="event is not JSON: 'not json"):
        state.on_event(b"not json at all", 30)
    with pytest.raises(StreamFailure, match="event nests too deeply"):
        state.on_event(b"[" * 100_000, 40)


ODD_EVENTS = [
    {"id": "srv-1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"choices": [{"delta": {"reasoning_content": "think"}}], "usage": {"completion_tokens": 1}},
    {"choices": [{"delta": {"reasoning": "more"}}], "usage": {"completion_tokens": True}},
    {"choices": [{"delta": {"content": "Hi"}}], "usage": {"completion_tokens": 3.0}},
    {"choices": [{"delta": {"content": "a"}}], "usage": {"completion_tokens": "5"}},
    {"choices": [{"delta": {"content": "b"}}], "usage": {"prompt_tokens": None}},
    {"choices": [{"delta": {"content": "c"}}], "usage": {}},
    {"choices": [{"delta": {"content": "d"}}], "usage": None, "error": None},
    {"choices": [], "usage": {"completion_tokens": 9, "prompt_tokens": 4,
                              "prompt_tokens_details": {"cached_tokens": 2}}},
    {"choices": None, "usage": {"prompt_tokens_details": {"cached_tokens": True}}},
    {"choices": [{"delta": None}]},
    {"choices": [{"delta": {}}], "id": 5, "extra": {"nested": [1, 2]}},
    {"choices": [{"delta": {"content": None}, "finish_reason": ""}]},
    {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call-1", "function":
                 {"name": "get", "arguments": "{\"a\""}}]}}]},
    {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
    {"choices": [{"delta": {"tool_calls": [{"function": None}]}}]},
    {"choices": [{"delta": {"tool_calls": "x"}}]},
    {"choices": [{"delta": {"tool_calls": [1]}}]},
    {"choices": [{"delta": {"content": 5}}]},
    {"choices": ["x"]},
    {"choices": [None]},
    {"error": ""},
    {"error": "overloaded"},
    {"error": {"message": "boom"}},
    {"choices": [{"text": "completion text", "delta": {"content": "e"}}]},
    {"choices": [{"delta": {"content": "f"}, "finish_reason": "stop"}],
     "usage": {"completion_tokens": 12, "prompt_tokens": 4}},
]  # fmt: skip


def _run_events(chat: bool, events: list[bytes]) -> tuple[list[str | None], dict]:
    import dataclasses

    rec = record()
    rec.reply_parts = []
    state = StreamState(rec, chat=chat, counter=None)
    outcomes: list[str | None] = []
    for i, data in enumerate(events):
        try:
            state.on_event(data, 10 * (i + 1))
            outcomes.append(None)
        except Exception as exc:  # the same failures, of the same kind, either way
            outcomes.append(f"{type(exc).__name__}: {getattr(exc, 'kind', '')} {exc}")
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
    fields.update(finish_reason=state.finish_reason, finish_t=state.finish_t, done=state.done)
    return outcomes, fields


@pytest.mark.parametrize("chat", [True, False])
def test_the_typed_decoder_reads_every_event_as_the_general_path_does(
    chat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgspec's typed decoder takes the usual chunk shape; whatever it refuses (a bool or a
    float for a count, a number for text, a choice that is not an object) goes the general
    way. Both must leave the same record, event by event, and fail the same events."""
    from locustfiles.request import stream

    assert stream._typed is not None  # a dependency: the fast path is what runs
    events = [json.dumps(e).encode() for e in ODD_EVENTS] + [b"[DONE]"]
    typed = _run_events(chat, events)
    monkeypatch.setattr(stream, "_typed", None)
    general = _run_events(chat, events)
    assert typed[0] == general[0]
    assert typed[1] == general[1]
    assert sum(o is None for o in typed[0]) > len(events) // 2  # most events are output
