"""The streams of the OpenAI Responses API (`/v1/responses`) and of Anthropic-style Messages
(`/v1/messages`), and their whole (not streamed) bodies: the same generation, another shape.

Each encoder gives a request's events as SSE blocks (`event: TYPE` and `data: {...}`), built
by splicing text and counts into pre-encoded parts, as sse.ChunkEncoder does for chat:
`opening()` (before the first token), `deltas(text, tokens)` (each output event; a tool call's
first one opens the call), `closing(reason, tokens, include_usage, text)` (the end, with the
usage). Reasons are chat's finish reasons ("stop", "length", "tool_calls"), told in each API's
words. Output words are ASCII letters with a leading space: no JSON escaping.
"""

from __future__ import annotations

import json
import time
from typing import Any

from infra.simserver.sse import ToolCall


def _j(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class ResponsesEncoder:
    """`response.*` events: created, in_progress, a reasoning item (with a reasoning phase),
    the answer's output item (a message with one output_text part, or a function call), its
    deltas, the item's end, then completed (or incomplete: `max_output_tokens`) with the
    usage."""

    def __init__(self, response_id: str, model: str, prompt_tokens: int,
                 tool_call: ToolCall | None, reasoning: int = 0) -> None:  # fmt: skip
        self.response_id = response_id
        self.model = model
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        self.tool_call = tool_call
        self.item_id = ("fc_" if tool_call else "msg_") + response_id.removeprefix("resp_")
        self.reasoning = reasoning
        self.reasoning_id = "rs_" + response_id.removeprefix("resp_")
        self.reasoning_text: list[bytes] = []
        self.thinking = False  # the reasoning item is open
        self.index = 1 if reasoning else 0  # the answer's output index
        self.seq = 0
        self.opened = False
        kind = "function_call_arguments" if tool_call else "output_text"
        delta = f"response.{kind}.delta".encode()
        common = b'"item_id":%b,"output_index":%d' % (_j(self.item_id), self.index)
        if tool_call is None:
            common += b',"content_index":0'
        self._delta_open = b'event: %b\ndata: {"type":"%b","sequence_number":' % (delta, delta)
        self._delta_mid = b"," + common + b',"delta":"'
        self._delta_close = b'"}\n\n'

    def set_cached(self, cached_tokens: int) -> None:
        self.cached = cached_tokens

    def _event(self, kind: str, body: dict[str, Any]) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **body}
        self.seq += 1
        return b"event: %b\ndata: %b\n\n" % (kind.encode(), _j(data))

    def _response(self, status: str, output: list[Any], usage: Any = None,
                  incomplete: Any = None) -> dict[str, Any]:  # fmt: skip
        return {"id": self.response_id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model, "output": output,
                "incomplete_details": incomplete, "usage": usage}  # fmt: skip

    def _item(self, text: str, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        call = self.tool_call
        if call is not None:
            return {"id": self.item_id, "type": "function_call", "status": status,
                    "call_id": call.id, "name": call.name, "arguments": text}  # fmt: skip
        content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant",
                "content": content}  # fmt: skip

    def _reasoning_item(self, done: bool) -> dict[str, Any]:
        text = b"".join(self.reasoning_text).decode()
        content = [{"type": "reasoning_text", "text": text}] if done else []
        return {"id": self.reasoning_id, "type": "reasoning", "summary": [], "content": content,
                "status": "completed" if done else "in_progress"}  # fmt: skip

    def opening(self) -> list[bytes]:
        events = [
            self._event("response.created", {"response": self._response("in_progress", [])}),
            self._event("response.in_progress", {"response": self._response("in_progress", [])}),
        ]
        if self.reasoning:
            self.thinking = True
            events.append(self._event("response.output_item.added",
                                      {"output_index": 0, "item": self._reasoning_item(False)}))  # fmt: skip
        elif self.tool_call is None:
            events += self._open_item()
        return events

    def _close_reasoning(self) -> list[bytes]:
        self.thinking = False
        text = b"".join(self.reasoning_text).decode()
        where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        return [
            self._event("response.reasoning_text.done", {**where, "text": text}),
            self._event("response.output_item.done",
                        {"output_index": 0, "item": self._reasoning_item(True)}),
        ]  # fmt: skip

    def _open_item(self) -> list[bytes]:
        events = self._close_reasoning() if self.thinking else []
        self.opened = True
        events.append(self._event("response.output_item.added",
                                  {"output_index": self.index, "item": self._item("", False)}))  # fmt: skip
        if self.tool_call is None:
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._event("response.content_part.added",
                                      {"item_id": self.item_id, "output_index": self.index,
                                       "content_index": 0, "part": part}))  # fmt: skip
        return events

    def deltas(self, text: bytes, completion_tokens: int, reasoning: bool = False) -> list[bytes]:
        if reasoning:
            self.reasoning_text.append(text)
            return [self._event("response.reasoning_text.delta",
                                {"item_id": self.reasoning_id, "output_index": 0,
                                 "content_index": 0, "delta": text.decode()})]  # fmt: skip
        events = [] if self.opened else self._open_item()
        events.append(self._delta_open + b"%d" % self.seq + self._delta_mid + text
                      + self._delta_close)  # fmt: skip
        self.seq += 1
        return events

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        thought = min(self.reasoning, completion_tokens)
        return {"input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": completion_tokens,
                "output_tokens_details": {"reasoning_tokens": thought},
                "total_tokens": self.prompt_tokens + completion_tokens}  # fmt: skip

    def closing(self, reason: str, completion_tokens: int, include_usage: bool,
                text: str) -> list[bytes]:  # fmt: skip
        events = [] if self.opened else self._open_item()
        where = {"item_id": self.item_id, "output_index": self.index}
        if self.tool_call is not None:
            events.append(self._event("response.function_call_arguments.done",
                                      {**where, "arguments": text}))  # fmt: skip
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            events.append(self._event("response.output_text.done",
                                      {**where, "content_index": 0, "text": text}))  # fmt: skip
            events.append(self._event("response.content_part.done",
                                      {**where, "content_index": 0, "part": part}))  # fmt: skip
        item = self._item(text, True)
        events.append(self._event("response.output_item.done",
                                  {"output_index": self.index, "item": item}))  # fmt: skip
        output = [self._reasoning_item(True), item] if self.reasoning else [item]
        events.append(self._event(*self._end(reason, completion_tokens, output)))
        return events

    def _end(self, reason: str, tokens: int, output: list[Any]) -> tuple[str, dict[str, Any]]:
        usage = self.usage(tokens)
        if reason == "length":
            response = self._response("incomplete", output, usage, {"reason": "max_output_tokens"})
            return "response.incomplete", {"response": response}
        return "response.completed", {"response": self._response("completed", output, usage)}

    def whole(self, reason: str, completion_tokens: int, text: str,
              reasoning: str = "") -> dict[str, Any]:  # fmt: skip
        """The body of a response that was not streamed."""
        output = [self._item(text, True)]
        if reasoning:
            self.reasoning_text = [reasoning.encode()]
            output.insert(0, self._reasoning_item(True))
        _, end = self._end(reason, completion_tokens, output)
        response: dict[str, Any] = end["response"]
        return response


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_SIGNATURE = "c2ltdWxhdGVk"  # a thinking block's signature ("simulated")


class MessagesEncoder:
    """Anthropic-style events: message_start, a thinking block (with a reasoning phase), the
    answer's content block (text, or a tool_use), a ping, its deltas, the block's stop,
    message_delta (the stop reason and the output tokens) and message_stop."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int,
                 tool_call: ToolCall | None, reasoning: int = 0) -> None:  # fmt: skip
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        self.tool_call = tool_call
        self.opened = False
        self.reasoning = reasoning
        self.thinking = False  # the thinking block is open
        self.index = 1 if reasoning else 0  # the answer's block index
        head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
        kind = b'"text_delta","text"' if tool_call is None else b'"input_json_delta","partial_json"'
        self._delta_open = head % self.index + b'"delta":{"type":' + kind + b':"'
        self._thinking_open = head % 0 + b'"delta":{"type":"thinking_delta","thinking":"'
        self._delta_close = b'"}}\n\n'

    def set_cached(self, cached_tokens: int) -> None:
        self.cached = cached_tokens

    @staticmethod
    def _event(kind: str, body: dict[str, Any]) -> bytes:
        return b"event: %b\ndata: %b\n\n" % (kind.encode(), _j({"type": kind, **body}))

    def _usage(self, output_tokens: int) -> dict[str, Any]:
        # Anthropic's input_tokens leave out the tokens read from the cache
        return {"input_tokens": self.prompt_tokens - self.cached,
                "cache_read_input_tokens": self.cached, "output_tokens": output_tokens}  # fmt: skip

    def opening(self) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": self._usage(0),
        }  # fmt: skip
        events = [self._event("message_start", {"message": message})]
        if self.reasoning:
            self.thinking = True
            block = {"type": "thinking", "thinking": ""}
            events += [self._event("content_block_start", {"index": 0, "content_block": block}),
                       self._event("ping", {})]  # fmt: skip
        elif self.tool_call is None:
            events += self._open_block()
        return events

    def _open_block(self) -> list[bytes]:
        events = []
        if self.thinking:  # the thinking block ends, with its signature as Anthropic's do
            self.thinking = False
            signature = {"type": "signature_delta", "signature": _SIGNATURE}
            events += [self._event("content_block_delta", {"index": 0, "delta": signature}),
                       self._event("content_block_stop", {"index": 0})]  # fmt: skip
        self.opened = True
        call = self.tool_call
        block: dict[str, Any] = (
            {"type": "text", "text": ""} if call is None
            else {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        )  # fmt: skip
        events.append(self._event("content_block_start",
                                  {"index": self.index, "content_block": block}))  # fmt: skip
        if not self.reasoning:
            events.append(self._event("ping", {}))
        return events

    def deltas(self, text: bytes, completion_tokens: int, reasoning: bool = False) -> list[bytes]:
        if reasoning:
            return [self._thinking_open + text + self._delta_close]
        events = [] if self.opened else self._open_block()
        events.append(self._delta_open + text + self._delta_close)
        return events

    def closing(self, reason: str, completion_tokens: int, include_usage: bool,
                text: str) -> list[bytes]:  # fmt: skip
        events = [] if self.opened else self._open_block()
        stop = _STOP_REASONS.get(reason, "end_turn")
        events += [
            self._event("content_block_stop", {"index": self.index}),
            self._event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                          "usage": {"output_tokens": completion_tokens}}),
            self._event("message_stop", {}),
        ]  # fmt: skip
        return events

    def whole(self, reason: str, completion_tokens: int, text: str,
              reasoning: str = "") -> dict[str, Any]:  # fmt: skip
        """The body of a message that was not streamed."""
        call = self.tool_call
        content: list[dict[str, Any]] = (
            [{"type": "text", "text": text}] if call is None
            else [{"type": "tool_use", "id": call.id, "name": call.name, "input": {"query": text}}]
        )  # fmt: skip
        if reasoning:
            content.insert(0, {"type": "thinking", "thinking": reasoning, "signature": _SIGNATURE})
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "model": self.model, "content": content,
                "stop_reason": _STOP_REASONS.get(reason, "end_turn"), "stop_sequence": None,
                "usage": self._usage(completion_tokens)}  # fmt: skip
