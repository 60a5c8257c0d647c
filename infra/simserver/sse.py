"""Pre-encoded OpenAI streaming chunks (`data: {...}\n\n`), built without json.dumps per
token: each request encodes its fixed parts once and splices text and counts in.

Output words are ASCII letters with a leading space, so they need no JSON escaping.
"""

from __future__ import annotations

import json

from infra.simserver.schema import Kind

DONE = b"data: [DONE]\n\n"


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
        "_continuous",
    )

    def __init__(
        self,
        kind: Kind,
        response_id: str,
        created: int,
        model: str,
        prompt_tokens: int,
        continuous_usage: bool,
    ) -> None:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        common = b'{"id":%b,"object":"%b","created":%d,"model":%b,' % (
            json.dumps(response_id).encode(),
            obj.encode(),
            created,
            json.dumps(model).encode(),
        )
        self._head = b"data: " + common + b'"choices":[{"index":0,'
        if kind == "chat":
            self._content_open = self._head + b'"delta":{"content":"'
            self._content_close = b'"},"logprobs":null,"finish_reason":null}]'
            self._role: bytes | None = (
                self._head + b'"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]'
            )
            self._finish_open = self._head + b'"delta":{},"logprobs":null,"finish_reason":"'
        else:
            self._content_open = self._head + b'"text":"'
            self._content_close = b'","logprobs":null,"finish_reason":null}]'
            self._role = None
            self._finish_open = self._head + b'"text":"","logprobs":null,"finish_reason":"'
        self._finish_close = b'","stop_reason":null}]'
        self._usage_open = b"data: " + common + b'"choices":[]'
        self._prompt_tokens = prompt_tokens
        self._continuous = continuous_usage

    def _usage(self, completion_tokens: int) -> bytes:
        p = self._prompt_tokens
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
            p,
            p + completion_tokens,
            completion_tokens,
        )

    def _tail(self, completion_tokens: int) -> bytes:
        if self._continuous:
            return self._usage(completion_tokens) + b"}\n\n"
        return b"}\n\n"

    def role(self) -> bytes | None:
        """The first chat event (role only, empty content); None for completions."""
        if self._role is None:
            return None
        return self._role + self._tail(0)

    def content(self, text: bytes, completion_tokens: int) -> bytes:
        return self._content_open + text + self._content_close + self._tail(completion_tokens)

    def finish(self, reason: str, completion_tokens: int) -> bytes:
        return (
            self._finish_open + reason.encode() + self._finish_close + self._tail(completion_tokens)
        )

    def usage(self, completion_tokens: int) -> bytes:
        """The final `include_usage` event: empty choices and the totals."""
        return self._usage_open + self._usage(completion_tokens) + b"}\n\n"


MALFORMED = b'data: {"id":"malformed","choices":[{"index":0,"delta":{"content":\n\n'
