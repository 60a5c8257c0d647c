"""Turn a response's SSE events (or a non-streamed body) into a RequestRecord.

Pure logic, no I/O: `client.py` reads the socket and calls `on_event(data, offset_ns)` for
each event with the time it arrived. Rules (docs/events.md):

- first event = any event; first token = first event with non-empty content, reasoning
  content or a tool-call delta (its argument text is output, chunk kind `tool_call`);
  first content = first event with non-empty visible content;
- tokens per output event: the delta of `usage.completion_tokens` when the event carries
  usage (continuous usage stats), else the tokenizer's count of the delta text, else 1;
  the request records the weakest source it had to use;
- totals prefer the server's `usage`, taken from whichever event carries it;
- `[DONE]` is noted, never required: a stream that ends after a finish reason is complete.

Decoding: msgspec's typed decoder reads the usual chunk shape into structs (`_on_chunk`);
whatever it refuses goes to orjson, then the standard decoder (`_loads`), with the same
rules: both ways leave the same record (tests/unit/test_stream.py).
"""

from __future__ import annotations

import json
from typing import Any, Final

from analysis.kernel.schema import REQUESTS_SCHEMA, int_max
from locustfiles.request.record import RequestRecord
from locustfiles.request.tokenizer import TokenCounter

_decode = json.JSONDecoder().decode

TOKENS_MAX: Final = int_max(REQUESTS_SCHEMA, "completion_tokens")
"""The largest token count a row holds; a usage count beyond it (or below 0) is no count."""


def count_of(name: str, value: int) -> int:
    """A usage count checked where it enters: out of range, the request is `invalid_usage`
    (its row kept, with the value in the detail), never a row the sink must refuse."""
    if 0 <= value <= TOKENS_MAX:
        return value
    raise StreamFailure(
        "invalid_usage", f"usage.{name} {value} is not a token count (0..{TOKENS_MAX})"
    )


try:  # the fast decoder (optional): a third of the standard one's time on a chunk event
    import orjson

    _fast: Any = orjson.loads
    _FastError: Any = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - orjson is a dependency; a bare install still works
    _fast = None
    _FastError = ValueError


try:  # the typed decoder (optional): the chunk shape straight into slotted objects
    import msgspec

    class _Delta(msgspec.Struct, gc=False):  # never in a cycle: no garbage-collector tracking
        content: str | None = None
        reasoning_content: str | None = None
        reasoning: str | None = None
        tool_calls: Any = None

    class _Choice(msgspec.Struct, gc=False):
        delta: _Delta | None = None
        text: str | None = None
        finish_reason: str | None = None

    class _Usage(msgspec.Struct, gc=False):
        completion_tokens: int | None = None
        prompt_tokens: int | None = None
        prompt_tokens_details: Any = None
        completion_tokens_details: Any = None

    class _Chunk(msgspec.Struct, gc=False):
        id: Any = None
        choices: list[_Choice] | None = None
        usage: _Usage | None = None
        error: Any = None

    _typed: Any = msgspec.json.Decoder(_Chunk).decode
    # ValidationError is a DecodeError; msgspec before 0.19 raised UnicodeDecodeError (a
    # ValueError) for invalid UTF-8
    _TypedError: Any = (msgspec.DecodeError, ValueError, RecursionError)
except ImportError:  # pragma: no cover - msgspec is a dependency; a bare install still works
    _typed = None
    _TypedError = ValueError


def _text(data: bytes | str) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _loads(data: bytes | str) -> Any:
    """An event's JSON. orjson first; whatever it refuses (NaN or Infinity, integers beyond 64
    bits, invalid UTF-8, nesting past its limit) the standard decoder then judges, on the
    text decoded with replacement, as before: so odd servers parse exactly as they did."""
    if _fast is not None:
        try:
            return _fast(data)
        except _FastError:
            pass
    text = _text(data)
    try:
        return _decode(text)
    except ValueError:
        raise StreamFailure("malformed_event", f"event is not JSON: {text[:80]!r}") from None
    except RecursionError:
        raise StreamFailure("malformed_event", "event nests too deeply") from None


def json_object(data: bytes | str) -> dict[str, Any]:
    """An event's data as a JSON object (`_loads`); anything else is `malformed_event`."""
    obj = _loads(data)
    if not isinstance(obj, dict):
        raise StreamFailure("malformed_event", f"event is not a JSON object: {_text(data)[:80]!r}")
    return obj


def error_text(err: Any) -> str:
    """What an error object in a stream says: its message, else its type, else itself."""
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)
    return str(err)


class StreamFailure(Exception):
    """The stream cannot be trusted from here on (kind is an error kind of schema v1)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class StreamState:
    """Accumulates one streamed response into `record`."""

    __slots__ = ("chat", "counter", "done", "finish_reason", "finish_t", "record", "usage_tokens")

    def __init__(self, record: RequestRecord, chat: bool, counter: TokenCounter | None) -> None:
        self.record = record
        self.chat = chat
        self.counter = counter
        self.done = False  # saw [DONE]
        self.finish_reason: str | None = None
        self.usage_tokens = 0  # completion_tokens seen so far in usage
        self.finish_t: int | None = None  # arrival of the event that carried the finish reason

    @property
    def output_events(self) -> int:
        return len(self.record.chunk_offsets)

    def on_event(self, data: bytes | str, t: int) -> None:
        rec = self.record
        rec.events += 1
        if rec.first_event_ns is None:
            rec.first_event_ns = t
        if data == b"[DONE]" or data == "[DONE]":
            self.done = True
            return
        if _typed is not None:
            try:
                chunk = _typed(data)
            except _TypedError:  # not the usual shape: the general path judges it
                pass
            else:
                self._on_chunk(chunk, t)
                return
        obj = json_object(data)
        if obj.get("error"):
            raise StreamFailure("stream_error", error_text(obj["error"]))
        if rec.server_request_id is None and isinstance(obj.get("id"), str):
            rec.server_request_id = obj["id"]
        usage_delta = None
        usage = obj.get("usage")
        if usage:
            ct = usage.get("completion_tokens")
            if isinstance(ct, int) and not isinstance(ct, bool):
                usage_delta = self._completion(ct)
            pt = usage.get("prompt_tokens")
            if isinstance(pt, int) and not isinstance(pt, bool):
                rec.prompt_tokens = count_of("prompt_tokens", pt)
            _note_cached(rec, usage)
            _note_reasoning(rec, usage)
        choices = obj.get("choices")
        if not choices:
            return
        try:
            choice = choices[0]
            calls = ""
            if self.chat:
                delta = choice.get("delta") or {}
                content = delta.get("content") or ""
                reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
                if delta.get("tool_calls"):
                    calls = tool_call_deltas(rec, delta["tool_calls"])
            else:
                content = choice.get("text") or ""
                reasoning = ""
            finish = choice.get("finish_reason")
        except (AttributeError, TypeError, IndexError):
            raise StreamFailure(
                "malformed_event", f"unexpected chunk shape: {_text(data)[:80]!r}"
            ) from None
        self._output(content, reasoning, calls, finish, usage_delta, t)

    def _on_chunk(self, chunk: Any, t: int) -> None:
        """`on_event` for an event the typed decoder read (`_Chunk`): the same rules, on
        attributes instead of dict lookups."""
        rec = self.record
        if chunk.error:
            raise StreamFailure("stream_error", error_text(chunk.error))
        if rec.server_request_id is None and isinstance(chunk.id, str):
            rec.server_request_id = chunk.id
        usage_delta = None
        usage = chunk.usage
        if usage is not None:
            if usage.completion_tokens is not None:
                usage_delta = self._completion(usage.completion_tokens)
            if usage.prompt_tokens is not None:
                rec.prompt_tokens = count_of("prompt_tokens", usage.prompt_tokens)
            if usage.prompt_tokens_details is not None:
                _note_cached_details(rec, usage.prompt_tokens_details)
            if usage.completion_tokens_details is not None:
                note_reasoning_details(rec, usage.completion_tokens_details)
        choices = chunk.choices
        if not choices:
            return
        choice = choices[0]
        calls = ""
        if self.chat:
            delta = choice.delta
            if delta is None:
                content = reasoning = ""
            else:
                content = delta.content or ""
                reasoning = delta.reasoning_content or delta.reasoning or ""
                if delta.tool_calls:
                    calls = tool_call_deltas(rec, delta.tool_calls)
        else:
            content = choice.text or ""
            reasoning = ""
        self._output(content, reasoning, calls, choice.finish_reason, usage_delta, t)

    def _completion(self, tokens: int) -> int:
        """usage.completion_tokens (cumulative): the tokens since the last count. A count that
        goes down would give an event negative tokens: `invalid_usage`."""
        count_of("completion_tokens", tokens)
        if tokens < self.usage_tokens:
            raise StreamFailure(
                "invalid_usage",
                f"usage.completion_tokens went down from {self.usage_tokens} to {tokens}",
            )
        delta = tokens - self.usage_tokens
        self.usage_tokens = self.record.completion_tokens = tokens
        return delta

    def _output(
        self,
        content: str,
        reasoning: str,
        calls: str,
        finish: Any,
        usage_delta: Any,
        t: int,
        exact: int | None = None,
    ) -> None:
        """An event's output (text, reasoning, tool-call arguments) and finish reason;
        `exact`: the tokens the server says this event carries (a stream adapter's count)."""
        rec = self.record
        if finish:
            self.finish_reason = finish
            self.finish_t = t
        if not (content or reasoning or calls):
            if exact:  # tokens the server counted for an event without text
                rec.note_source("usage")
                self._textless(exact, t)
            elif usage_delta and rec.output_tokens_source == "usage":  # continuous usage only
                self._textless(usage_delta, t)  # e.g. the end-of-sequence token, in usage only
            return
        if rec.first_token_ns is None:
            rec.first_token_ns = t
        rec.last_token_ns = t
        if exact is not None:
            tokens = exact  # the server's count for this event
            if rec.output_tokens_source != "usage":
                rec.note_source("usage")
        elif usage_delta is not None and rec.output_tokens_source in (None, "usage"):
            tokens = usage_delta  # continuous usage: exact (a usage only at the end is not)
            if rec.output_tokens_source != "usage":
                rec.note_source("usage")
        elif self.counter is not None:
            tokens = self.counter.count(content + reasoning + calls)
            if rec.output_tokens_source != "tokenizer":
                rec.note_source("tokenizer")
        else:
            tokens = 1
            if rec.output_tokens_source != "events":
                rec.note_source("events")
        rec.chunk_offsets.append(t)
        rec.chunk_tokens.append(tokens)
        rec.chunk_chars.append(len(content) + len(reasoning) + len(calls))
        # the event's kind: its chunk row, and where that kind of output began
        if content:
            rec.chunk_kinds.append("content")
            if rec.reply_parts is not None:
                rec.reply_parts.append(content)
            if rec.first_content_ns is None:
                rec.first_content_ns = t
                if rec.first_answer_ns is None:
                    rec.first_answer_ns = t
        elif calls:
            rec.chunk_kinds.append("tool_call")
            if rec.first_answer_ns is None:
                rec.first_answer_ns = t
        else:  # reasoning alone: its tokens are the answer's only once it began
            rec.chunk_kinds.append("reasoning")
            rec.reasoning_tokens = (rec.reasoning_tokens or 0) + tokens
            if rec.first_reasoning_ns is None:
                rec.first_reasoning_ns = t

    def _textless(self, tokens: int, t: int) -> None:
        """Tokens the server counted but sent no text for: a chunk row with 0 characters."""
        rec = self.record
        rec.chunk_offsets.append(t)
        rec.chunk_tokens.append(tokens)
        rec.chunk_chars.append(0)
        rec.chunk_kinds.append("content")
        rec.last_token_ns = t

    def on_end(self) -> None:
        """The body ended: complete only after a finish reason or [DONE].

        Tokens in the server's final `usage` but in no event (an end-of-sequence token has no
        text) are placed at the finish event, when per-event counts are exact (usage or
        tokenizer), or when no event carried text at all (an answer that was only an EOS):
        so the events' tokens add up to `output_tokens` and TPOT and mean ITL stay equal.
        With 1-per-event counts the remainder cannot be placed and is left out.
        """
        if self.finish_reason is None and not self.done:
            raise StreamFailure(
                "stream_truncated",
                f"stream ended without a finish reason after {self.output_events} output events",
            )
        rec = self.record
        # exact per-event counts, or no event with text at all (an answer that was only an
        # end-of-sequence token: the server's usage is the whole count)
        no_text = rec.first_token_ns is None and not rec.chunk_offsets
        if rec.completion_tokens is not None and (
            rec.output_tokens_source in ("usage", "tokenizer") or no_text
        ):
            remainder = rec.completion_tokens - sum(rec.chunk_tokens)
            at = max(self.finish_t or 0, rec.chunk_offsets[-1] if rec.chunk_offsets else 0)
            if remainder > 0 and at:
                self._textless(remainder, at)


def _note_cached(rec: RequestRecord, usage: Any) -> None:
    """usage.prompt_tokens_details.cached_tokens: prompt tokens the server's cache served."""
    if isinstance(usage, dict):
        _note_cached_details(rec, usage.get("prompt_tokens_details"))


def _note_reasoning(rec: RequestRecord, usage: Any) -> None:
    """usage.completion_tokens_details.reasoning_tokens: the output tokens that were
    reasoning, as the server counts them."""
    if isinstance(usage, dict):
        note_reasoning_details(rec, usage.get("completion_tokens_details"))


def note_reasoning_details(rec: RequestRecord, details: Any) -> None:
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if isinstance(reasoning, int) and not isinstance(reasoning, bool):
        rec.usage_reasoning_tokens = count_of(
            "completion_tokens_details.reasoning_tokens", reasoning
        )


def _note_cached_details(rec: RequestRecord, details: Any) -> None:
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool):
        note_cached_tokens(rec, cached)


def note_cached_tokens(rec: RequestRecord, cached: int) -> None:
    """The prompt tokens the server's cache served."""
    rec.cached_tokens = count_of("prompt_tokens_details.cached_tokens", cached)


def tool_call_deltas(rec: RequestRecord, deltas: Any) -> str:
    """A delta's tool-call pieces: their argument text (output, timed like content), and,
    when the record collects its reply (sessions), each call's id, name and arguments."""
    if not isinstance(deltas, list):
        raise StreamFailure("malformed_event", "delta.tool_calls is not a list")
    text = ""
    for part in deltas:
        if not isinstance(part, dict):
            raise StreamFailure("malformed_event", "a tool_calls entry is not an object")
        raw = part.get("function")
        function: dict[str, Any] = raw if isinstance(raw, dict) else {}
        arguments = function.get("arguments") or ""
        text += arguments if isinstance(arguments, str) else ""
        index = part.get("index", 0)
        if rec.tool_call_parts is None:
            rec.tool_call_parts = {}
        call = rec.tool_call_parts.setdefault(
            index if isinstance(index, int) else 0, {"id": "", "name": "", "arguments": ""}
        )
        if isinstance(part.get("id"), str) and part["id"]:
            call["id"] = part["id"]
        if isinstance(function.get("name"), str) and function["name"]:
            call["name"] += function["name"]
        if isinstance(arguments, str):
            call["arguments"] += arguments
    rec.tool_calls = len(rec.tool_call_parts or {})
    return text or " "  # a call without argument text yet still starts the reply


def parse_body(
    record: RequestRecord, body: bytes, chat: bool, counter: TokenCounter | None
) -> None:
    """A non-streamed response: TTFT = E2E (first_token = end), no chunk rows, TPOT missing."""
    try:
        obj = json.loads(body)
        choice = obj["choices"][0]
        if chat:
            message = choice.get("message") or {}
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            calls = message.get("tool_calls")
            if calls:
                tool_call_deltas(record, [{**c, "index": i} for i, c in enumerate(calls)])
        else:
            content, reasoning = choice.get("text") or "", ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise StreamFailure(
            "malformed_event", f"response body is not a completion: {body[:80]!r}"
        ) from None
    if isinstance(obj.get("id"), str):
        record.server_request_id = record.server_request_id or obj["id"]
    usage = obj.get("usage") or {}
    _note_cached(record, usage)
    _note_reasoning(record, usage)
    if content and record.reply_parts is not None:
        record.reply_parts.append(content)
    if isinstance(usage.get("prompt_tokens"), int):
        record.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        record.completion_tokens = usage["completion_tokens"]
        record.output_tokens_source = "usage"
    elif counter is not None:
        record.completion_tokens = None
        record.chunk_tokens = []
        record.output_tokens = counter.count(content + reasoning)
        record.output_tokens_source = "tokenizer"
        if reasoning:
            record.reasoning_tokens = counter.count(reasoning)
    whole_body(record, content, reasoning)


def whole_body(record: RequestRecord, content: str, reasoning: str) -> None:
    """A whole response's times: every kind of output it holds arrived at its end."""
    if content or reasoning or record.tool_calls:
        record.first_token_ns = record.end_ns
        if content:
            record.first_content_ns = record.end_ns
        if content or record.tool_calls:
            record.first_answer_ns = record.end_ns
        if reasoning:
            record.first_reasoning_ns = record.end_ns
