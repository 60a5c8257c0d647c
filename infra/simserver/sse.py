"""Pre-encoded OpenAI streaming chunks (`data: {...}\n\n`), built without json.dumps per
token: each request encodes its fixed parts once and splices text and counts in.

Output words are ASCII letters with a leading space, so they need no JSON escaping.

A chat answer that is a tool call streams as vLLM does: after the role event, the first
generated token opens the call (id, type, function name and the first argument words),
then argument deltas carry the next words, and the finish event says "tool_calls". The
call's opening is output, sent when the model has produced it: its time is the first
token's, not the role event's (which leaves before the request is admitted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from infra.simserver.schema import Kind

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class ToolCall:
    """The one tool call of an answer: its id (`call_<hex>`) and the function it names."""

    id: str
    name: str


class ChunkEncoder:
    """Encodes the events of one request's stream (chat or legacy completions)."""

    __slots__ = (
        "_head",
        "_content_open",
        "_content_close",
        "_role",
        "_finish_open",
        "_finish_close",
        "_usage_open",
        "_prompt_tokens",
        "_details",
        "_continuous",
        "_call_open",
        "_reasoning_open",
        "_reasoning",
    )

    def __init__(
        self,
        kind: Kind,
        response_id: str,
        created: int,
        model: str,
        prompt_tokens: int,
        continuous_usage: bool,
        tool_call: ToolCall | None = None,
        reasoning: int = 0,
    ) -> None:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        common = b'{"id":%b,"object":"%b","created":%d,"model":%b,' % (
            json.dumps(response_id).encode(),
            obj.encode(),
            created,
            json.dumps(model).encode(),
        )
        self._head = b"data: " + common + b'"choices":[{"index":0,'
        self._role: bytes | None = None
        self._call_open: bytes | None = None
        if kind == "chat" and tool_call is not None:
            self._content_open = (
                self._head + b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":"'
            )
            self._content_close = b'"}}]},"logprobs":null,"finish_reason":null}]'
            self._role = (
                self._head + b'"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]'
            )
            # the first generated token opens the call: id, type, name and the first words
            self._call_open = (
                self._head + b'"delta":{"tool_calls":[{"index":0,"id":%b,"type":"function",'
                b'"function":{"name":%b,"arguments":"'
                % (json.dumps(tool_call.id).encode(), json.dumps(tool_call.name).encode())
            )
            self._finish_open = self._head + b'"delta":{},"logprobs":null,"finish_reason":"'
        elif kind == "chat":
            self._content_open = self._head + b'"delta":{"content":"'
            self._content_close = b'"},"logprobs":null,"finish_reason":null}]'
            self._role = (
                self._head + b'"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]'
            )
            self._finish_open = self._head + b'"delta":{},"logprobs":null,"finish_reason":"'
        else:
            self._content_open = self._head + b'"text":"'
            self._content_close = b'","logprobs":null,"finish_reason":null}]'
            self._finish_open = self._head + b'"text":"","logprobs":null,"finish_reason":"'
        # reasoning (chat): delta.reasoning_content, as vLLM's reasoning parsers stream it;
        # completions have no such field: their reasoning is text
        self._reasoning_open = (
            self._head + b'"delta":{"reasoning_content":"' if kind == "chat" else self._content_open
        )
        self._reasoning = reasoning
        self._finish_close = b'","stop_reason":null}]'
        self._usage_open = b"data: " + common + b'"choices":[]'
        self._prompt_tokens = prompt_tokens
        self._details = b""
        self._continuous = continuous_usage

    def set_cached(self, cached_tokens: int) -> None:
        """From now on usage carries `prompt_tokens_details.cached_tokens` (known once the
        engine has admitted the request, i.e. after the role event)."""
        self._details = b',"prompt_tokens_details":{"cached_tokens":%d}' % cached_tokens

    def _usage(self, completion_tokens: int) -> bytes:
        p = self._prompt_tokens
        details = self._details
        if self._reasoning:
            details += b',"completion_tokens_details":{"reasoning_tokens":%d}' % min(
                self._reasoning, completion_tokens
            )
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%b}' % (
            p,
            p + completion_tokens,
            completion_tokens,
            details,
        )

    def _tail(self, completion_tokens: int) -> bytes:
        if self._continuous:
            return self._usage(completion_tokens) + b"}\n\n"
        return b"}\n\n"

    def role(self) -> bytes | None:
        """The first chat event (role and empty content, or role and the opened tool call);
        None for completions."""
        if self._role is None:
            return None
        return self._role + self._tail(0)

    def content(self, text: bytes, completion_tokens: int) -> bytes:
        opening = self._content_open
        if self._call_open is not None:  # a tool call's first event names the function
            opening, self._call_open = self._call_open, None
        return opening + text + self._content_close + self._tail(completion_tokens)

    def finish(self, reason: str, completion_tokens: int) -> bytes:
        return (
            self._finish_open + reason.encode() + self._finish_close + self._tail(completion_tokens)
        )

    def usage(self, completion_tokens: int) -> bytes:
        """The final `include_usage` event: empty choices and the totals."""
        return self._usage_open + self._usage(completion_tokens) + b"}\n\n"

    # the interface every encoder has (apis.py: Responses, Messages)
    def opening(self) -> list[bytes]:
        role = self.role()
        return [] if role is None else [role]

    def deltas(self, text: bytes, completion_tokens: int, reasoning: bool = False) -> list[bytes]:
        if reasoning:
            return [
                self._reasoning_open + text + self._content_close + self._tail(completion_tokens)
            ]
        return [self.content(text, completion_tokens)]

    def closing(self, reason: str, completion_tokens: int, include_usage: bool,
                text: str) -> list[bytes]:  # fmt: skip
        events = [self.finish(reason, completion_tokens)]
        if include_usage:
            events.append(self.usage(completion_tokens))
        events.append(DONE)
        return events


MALFORMED = b'data: {"id":"malformed","choices":[{"index":0,"delta":{"content":\n\n'
