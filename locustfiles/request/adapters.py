"""Stream adapters: how a service's response reads as output, one event at a time.

A stream adapter turns each event's data into a `Delta` (text, reasoning, tool-call pieces,
usage, a finish, the stream's own end, an error). `AdapterState` applies the deltas to the
request's record with the same rules as the built-in chat and completions reader
(stream.py): the first token, tokens per event (the server's count, else the tokenizer's,
else one per event), usage totals, the end of the answer. So every service gets the same
timing, token counting and error kinds.

    class Lines(StreamAdapter):
        framing = "lines"
        def on_event(self, data: bytes) -> Delta | None:
            return Delta(text=data.decode() + "\\n")

Built in: `ResponsesAdapter` (the OpenAI Responses API) and `MessagesAdapter` (Anthropic-style
Messages). Chat and completions keep their typed fast reader (stream.StreamState).

An adapter is made per request (it may keep state across that request's events) and runs on
the worker's event loop: it must not block (no I/O, no sleeping) and should be quick, since
it runs once per event. An exception it raises fails that request as data (docs/extending.md):
`StreamFailure(kind, detail)` with its kind, ValueError, KeyError, IndexError or TypeError as
`malformed_event` (the event is not what the adapter expects), anything else as
`client_error`; the detail names the adapter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from locustfiles.request.record import RequestRecord
from locustfiles.request.stream import (
    StreamFailure,
    StreamState,
    count_of,
    error_text,
    json_object,
    note_cached_tokens,
    tool_call_deltas,
    whole_body,
)
from locustfiles.request.tokenizer import TokenCounter

log = logging.getLogger("llmload.adapters")

Framing = Literal["sse", "lines"]
"""How a response body splits into events: SSE events (their `data`), or text lines."""

_SHAPE_ERRORS = (ValueError, KeyError, IndexError, TypeError, AttributeError)


@dataclass(slots=True)
class Delta:
    """What one event says. Every field is optional; an event that says nothing is None.

    text: answer text. reasoning: reasoning text (thinking). tool_calls: tool-call pieces in
    OpenAI's delta shape (`{"index", "id", "function": {"name", "arguments"}}`: the
    arguments are output). tokens: the output tokens this event carries, when the service
    counts them per event (exact; else the tokenizer counts the text, else one per event).
    output_tokens: the service's count of output tokens so far (cumulative usage; the last
    one is the total). reasoning_tokens: the service's count of the output tokens that were
    reasoning (its usage's details; else llmload counts the reasoning events' tokens).
    prompt_tokens, cached_tokens: the prompt's tokens and the part the
    server's cache served. finish: the answer ended, and why ("stop", "length", "tool_calls",
    ...). done: the stream's own end marker. error: the service reports an error (the
    request fails as `stream_error`). response_id: the service's id of the response.
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish: str | None = None
    done: bool = False
    error: str | None = None
    response_id: str | None = None


class StreamAdapter:
    """Reads one response of a service (one instance per request; subclass it).

    `framing`: "sse" (each event's data, the default) or "lines" (each line of the body,
    without its line end). `on_event` gets each event's data as bytes and returns a Delta,
    several, or None; `on_end` is called when the body ended; `on_body` reads a response
    that was not streamed (`--no-stream`).
    """

    framing: ClassVar[Framing] = "sse"

    def on_event(self, data: bytes) -> Delta | Iterable[Delta] | None:
        raise NotImplementedError

    def on_end(self) -> Delta | None:
        """The body ended cleanly: what that says (a stream whose end is its answer's end
        returns `Delta(finish="stop")`). A stream with neither a finish nor `done` by then is
        `stream_truncated`."""
        return None

    def on_body(self, body: bytes) -> Delta:
        """A whole (not streamed) response (`--no-stream`)."""
        raise StreamFailure("malformed_event", f"{type(self).__name__} reads streams only")


def _name(adapter: StreamAdapter) -> str:
    return type(adapter).__name__


def _adapter_failure(adapter: StreamAdapter, exc: Exception, data: bytes) -> StreamFailure:
    """An adapter's exception as a request's failure (its kind by the exception's class)."""
    if isinstance(exc, StreamFailure):
        return exc
    kind = "malformed_event" if isinstance(exc, _SHAPE_ERRORS) else "client_error"
    if kind == "client_error":
        log.warning("llmload: the stream adapter %s raised", _name(adapter), exc_info=exc)
    return StreamFailure(
        kind, f"the stream adapter {_name(adapter)} raised {type(exc).__name__}: {exc} "
        f"(on {bytes(data[:60])!r})",
    )  # fmt: skip


class AdapterState(StreamState):
    """StreamState for a service read by a StreamAdapter: its deltas, the same rules."""

    __slots__ = ("adapter", "exact")

    def __init__(
        self, record: RequestRecord, adapter: StreamAdapter, counter: TokenCounter | None
    ) -> None:
        super().__init__(record, False, counter)
        self.adapter = adapter
        self.exact = False  # the adapter counts each event's tokens (Delta.tokens)

    def on_event(self, data: bytes | str, t: int) -> None:
        rec = self.record
        rec.events += 1
        if rec.first_event_ns is None:
            rec.first_event_ns = t
        raw = data.encode() if isinstance(data, str) else data
        try:
            said = self.adapter.on_event(raw)
        except Exception as exc:  # the adapter's failure is this request's, as data
            raise _adapter_failure(self.adapter, exc, raw) from None
        if said is None:
            return
        if isinstance(said, Delta):
            self.apply(said, t)
            return
        for delta in said:
            self.apply(delta, t)

    def on_end(self) -> None:
        rec = self.record
        try:
            said = self.adapter.on_end()
        except Exception as exc:
            raise _adapter_failure(self.adapter, exc, b"(the body's end)") from None
        if said is not None:
            self.apply(said, rec.end_ns or rec.last_token_ns or 0)
        super().on_end()

    def apply(self, delta: Delta, t: int) -> None:
        """One delta onto the record (stream.py's rules)."""
        rec = self.record
        if delta.error:
            raise StreamFailure("stream_error", str(delta.error)[:200])
        if delta.response_id is not None and rec.server_request_id is None:
            rec.server_request_id = str(delta.response_id)
        usage_delta = None
        if delta.output_tokens is not None:
            usage_delta = self._completion(_int("output_tokens", delta.output_tokens))
        if delta.tokens is not None:
            self.exact = True
        if self.exact:  # events counted one by one: a total says nothing of this event
            usage_delta = None
        if delta.prompt_tokens is not None:
            rec.prompt_tokens = _count("prompt_tokens", delta.prompt_tokens)
        if delta.cached_tokens is not None:
            note_cached_tokens(rec, _int("cached_tokens", delta.cached_tokens))
        if delta.reasoning_tokens is not None:
            rec.usage_reasoning_tokens = _count("reasoning_tokens", delta.reasoning_tokens)
        calls = tool_call_deltas(rec, delta.tool_calls) if delta.tool_calls else ""
        if delta.done:
            self.done = True
        tokens = None if delta.tokens is None else _count("tokens", delta.tokens)
        self._output(delta.text or "", delta.reasoning or "", calls, delta.finish, usage_delta,
                     t, tokens)  # fmt: skip


def _int(name: str, value: Any) -> int:
    """A count an adapter gave is an int, else the request is `invalid_usage` (its range is
    checked where it is used: stream.count_of)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise StreamFailure("invalid_usage", f"{name} {value!r} is not a token count")
    return value


def _count(name: str, value: Any) -> int:
    """An int in the row's range (stream.count_of), else `invalid_usage`."""
    return count_of(name, _int(name, value))


def parse_adapted_body(
    record: RequestRecord, body: bytes, adapter: StreamAdapter, counter: TokenCounter | None
) -> None:
    """A response that was not streamed, read by its adapter (stream.parse_body's rules:
    TTFT = E2E, no chunk rows)."""
    try:
        delta = adapter.on_body(body)
    except Exception as exc:
        raise _adapter_failure(adapter, exc, body) from None
    if delta.error:
        raise StreamFailure("stream_error", str(delta.error)[:200])
    if delta.response_id is not None:
        record.server_request_id = record.server_request_id or str(delta.response_id)
    if delta.tool_calls:
        tool_call_deltas(record, delta.tool_calls)
    if delta.text and record.reply_parts is not None:
        record.reply_parts.append(delta.text)
    if delta.prompt_tokens is not None:
        record.prompt_tokens = _count("prompt_tokens", delta.prompt_tokens)
    if delta.cached_tokens is not None:
        note_cached_tokens(record, _int("cached_tokens", delta.cached_tokens))
    if delta.reasoning_tokens is not None:
        record.usage_reasoning_tokens = _count("reasoning_tokens", delta.reasoning_tokens)
    if delta.output_tokens is not None:
        record.completion_tokens = _count("output_tokens", delta.output_tokens)
        record.output_tokens_source = "usage"
    elif counter is not None:
        record.chunk_tokens = []
        record.output_tokens = counter.count(delta.text + delta.reasoning)
        record.output_tokens_source = "tokenizer"
        if delta.reasoning:
            record.reasoning_tokens = counter.count(delta.reasoning)
    whole_body(record, delta.text, delta.reasoning)


# -- the OpenAI Responses API ---------------------------------------------------------------


_RESPONSES_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


class ResponsesAdapter(StreamAdapter):
    """`POST /v1/responses` with `stream: true`: typed events (`type` in each event's data).

    Output: `response.output_text.delta` (answer), `response.reasoning_text.delta` and
    `response.reasoning_summary_text.delta` (reasoning), `response.function_call_arguments
    .delta` (a tool call's arguments; its name from `response.output_item.added`). The end:
    `response.completed` (finish "stop", or "tool_calls" when a call was made) or
    `response.incomplete` (its reason: "length" for max_output_tokens), with the usage;
    `response.failed` and `error` events fail the request (`stream_error`). Other events
    (created, in_progress, *.done, content_part.*) say nothing."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}  # output item id -> tool-call index

    def on_event(self, data: bytes) -> Delta | None:
        obj = json_object(data)
        kind = obj.get("type")
        if kind == "response.output_text.delta":
            return Delta(text=obj["delta"])
        if kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            return Delta(reasoning=obj["delta"])
        if kind == "response.function_call_arguments.delta":
            index = self.calls.setdefault(str(obj.get("item_id")), len(self.calls))
            return Delta(tool_calls=[{"index": index, "function": {"arguments": obj["delta"]}}])
        if kind == "response.output_item.added":
            item = obj.get("item") or {}
            if item.get("type") == "function_call":
                index = self.calls.setdefault(str(item.get("id")), len(self.calls))
                piece = {"index": index, "id": item.get("call_id") or item.get("id") or "",
                         "function": {"name": item.get("name") or "",
                                      "arguments": item.get("arguments") or ""}}  # fmt: skip
                return Delta(tool_calls=[piece])
            return None
        if kind == "response.created":
            response = obj.get("response") or {}
            return Delta(response_id=response.get("id"))
        if kind in ("response.completed", "response.incomplete"):
            return self._end(obj.get("response") or {}, kind == "response.completed")
        if kind == "response.failed":
            response = obj.get("response") or {}
            return Delta(error=error_text(response.get("error") or "response.failed"))
        if kind == "error":
            return Delta(error=error_text(obj.get("error") or obj.get("message") or obj))
        return None

    def _end(self, response: dict[str, Any], completed: bool) -> Delta:
        usage = response.get("usage") or {}
        details = usage.get("input_tokens_details") or {}
        if completed:
            finish = "tool_calls" if self.calls else "stop"
        else:
            reason = (response.get("incomplete_details") or {}).get("reason")
            finish = _RESPONSES_FINISH.get(str(reason), str(reason or "incomplete"))
        output_details = usage.get("output_tokens_details") or {}
        return Delta(output_tokens=usage.get("output_tokens"),
                     reasoning_tokens=output_details.get("reasoning_tokens"),
                     prompt_tokens=usage.get("input_tokens"),
                     cached_tokens=details.get("cached_tokens"), finish=finish,
                     done=True)  # fmt: skip

    def on_body(self, body: bytes) -> Delta:
        obj = json_object(body)
        if obj.get("error"):
            return Delta(error=error_text(obj["error"]))
        text, reasoning = "", ""
        calls: list[dict[str, Any]] = []
        for item in obj["output"]:
            kind = item.get("type")
            if kind == "message":
                text += "".join(p.get("text") or "" for p in item.get("content") or []
                                if p.get("type") == "output_text")  # fmt: skip
            elif kind == "reasoning":
                parts = [*(item.get("content") or []), *(item.get("summary") or [])]
                reasoning += "".join(p.get("text") or "" for p in parts)
            elif kind == "function_call":
                calls.append({"index": len(calls), "id": item.get("call_id") or "",
                              "function": {"name": item.get("name") or "",
                                           "arguments": item.get("arguments") or ""}})  # fmt: skip
        self.calls = {str(i): i for i in range(len(calls))}
        end = self._end(obj, obj.get("status") != "incomplete")
        end.text, end.reasoning, end.tool_calls = text, reasoning, calls or None
        end.response_id = obj.get("id")
        return end


# -- Anthropic-style Messages ------------------------------------------------------------------

_MESSAGES_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                    "tool_use": "tool_calls"}  # fmt: skip


def _prompt_tokens(usage: dict[str, Any]) -> int | None:
    """The prompt's tokens of an Anthropic usage: `input_tokens` leaves out the tokens read
    from the cache and those written to it, which are the prompt's too."""
    value = usage.get("input_tokens")
    if not isinstance(value, int) or isinstance(value, bool):
        return value  # not a count: AdapterState judges it
    for name in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        more = usage.get(name)
        if isinstance(more, int) and not isinstance(more, bool):
            value += more
    return value


class MessagesAdapter(StreamAdapter):
    """`POST /v1/messages` with `stream: true` (Anthropic-style): `content_block_delta` of
    `text_delta` (answer), `thinking_delta` (reasoning) and `input_json_delta` (a tool call's
    arguments, its name from `content_block_start`); `message_start` (the id, the prompt's
    tokens), `message_delta` (the stop reason and the output tokens so far), `message_stop`
    (the end); `ping` counts as nothing; an `error` event fails the request (`stream_error`)."""

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}  # content block index -> tool-call index

    def on_event(self, data: bytes) -> Delta | None:
        obj = json_object(data)
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta":
                return Delta(text=delta["text"])
            if dtype == "thinking_delta":
                return Delta(reasoning=delta["thinking"])
            if dtype == "input_json_delta":
                index = self.blocks.setdefault(int(obj.get("index", 0)), len(self.blocks))
                return Delta(tool_calls=[{"index": index,
                                          "function": {"arguments": delta["partial_json"]}}])  # fmt: skip
            return None  # signature_delta, citations: no output
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = self.blocks.setdefault(int(obj.get("index", 0)), len(self.blocks))
                piece = {"index": index, "id": block.get("id") or "",
                         "function": {"name": block.get("name") or "", "arguments": ""}}  # fmt: skip
                return Delta(tool_calls=[piece])
            return None
        if kind == "message_start":
            message = obj.get("message") or {}
            usage = message.get("usage") or {}
            return Delta(response_id=message.get("id"), prompt_tokens=_prompt_tokens(usage),
                         cached_tokens=usage.get("cache_read_input_tokens"))  # fmt: skip
        if kind == "message_delta":
            reason = (obj.get("delta") or {}).get("stop_reason")
            usage = obj.get("usage") or {}
            return Delta(output_tokens=usage.get("output_tokens"),
                         finish=_MESSAGES_FINISH.get(reason, reason) if reason else None)  # fmt: skip
        if kind == "message_stop":
            return Delta(done=True)
        if kind == "error":
            return Delta(error=error_text(obj.get("error") or obj))
        return None  # ping, content_block_stop

    def on_body(self, body: bytes) -> Delta:
        obj = json_object(body)
        if obj.get("type") == "error" or obj.get("error"):
            return Delta(error=error_text(obj.get("error") or obj))
        text, reasoning = "", ""
        calls: list[dict[str, Any]] = []
        for block in obj["content"]:
            kind = block.get("type")
            if kind == "text":
                text += block.get("text") or ""
            elif kind == "thinking":
                reasoning += block.get("thinking") or ""
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {}, separators=(",", ":"))
                calls.append({"index": len(calls), "id": block.get("id") or "",
                              "function": {"name": block.get("name") or "",
                                           "arguments": arguments}})  # fmt: skip
        usage = obj.get("usage") or {}
        reason = obj.get("stop_reason")
        return Delta(text=text, reasoning=reasoning, tool_calls=calls or None,
                     output_tokens=usage.get("output_tokens"),
                     prompt_tokens=_prompt_tokens(usage),
                     cached_tokens=usage.get("cache_read_input_tokens"),
                     finish=_MESSAGES_FINISH.get(reason, reason) if reason else "stop",
                     done=True, response_id=obj.get("id"))  # fmt: skip


BUILTIN_ADAPTERS: dict[str, type[StreamAdapter]] = {
    "responses": ResponsesAdapter,
    "messages": MessagesAdapter,
}
"""The built-in adapters by `--endpoint` (the rows' `endpoint`); chat and completions are read
by stream.StreamState."""
