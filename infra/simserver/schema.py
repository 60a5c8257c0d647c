"""OpenAI request bodies: validation and prompt token counting.

Anything the simulator cannot honour is refused with an OpenAI-style error (HTTP 400),
never silently ignored: `n` other than 1, `stream_options` without `stream`, lengths over
`max_model_len`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from infra.simserver.tokens import count_tokens

Kind = Literal["chat", "completion"]


class RequestRejected(Exception):
    """Becomes an OpenAI-style error response: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        reason: str = "bad_request",
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason  # metrics label
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


@dataclass(frozen=True)
class GenerationParams:
    kind: Kind
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool


def _bad(message: str, param: str | None = None) -> RequestRejected:
    return RequestRejected(400, message, param=param)


def _opt_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"`{name}` must be an integer", name)
    if value < minimum:
        raise _bad(f"`{name}` must be >= {minimum}, got {value}", name)
    return value


def _opt_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"`{name}` must be a boolean", name)
    return value


def _content_tokens(content: Any, where: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return count_tokens(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if not isinstance(part, dict):
                raise _bad(f"{where}: content parts must be objects", "messages")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _bad(f"{where}: a text part needs a string `text`", "messages")
                total += count_tokens(text)
            else:
                raise _bad(f"{where}: content part type {part.get('type')!r} is not supported")
        return total
    raise _bad(f"{where}: `content` must be a string or a list of parts", "messages")


def chat_prompt_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("`messages` must be a non-empty list", "messages")
    total = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string `role`", "messages")
        total += _content_tokens(message.get("content"), f"messages[{i}]")
    return total


def completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        return len(prompt)  # pre-tokenised: one token per id
    raise _bad("`prompt` must be a string, a list of token ids, or a batch of one", "prompt")


def parse_generation(
    kind: Kind, raw: bytes, served_model: str, max_model_len: int
) -> GenerationParams:
    """Validate a request body; raises RequestRejected."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _bad("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model:
        raise RequestRejected(
            404,
            f"The model `{model}` does not exist (this server serves `{served_model}`).",
            reason="not_found",
            type_="NotFoundError",
            param="model",
            code="model_not_found",
        )
    n = _opt_int(body, "n", 1)
    if n is not None and n != 1:
        raise _bad("only `n` = 1 is supported by the simulator", "n")
    prompt_tokens = chat_prompt_tokens(body) if kind == "chat" else completion_prompt_tokens(body)
    max_tokens = _opt_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1)
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    ignore_eos = _opt_bool(body, "ignore_eos")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise _bad("`stream_options` is only allowed when `stream` is true", "stream_options")
        if not isinstance(options, dict):
            raise _bad("`stream_options` must be an object", "stream_options")
        include_usage = _opt_bool(options, "include_usage")
        continuous = _opt_bool(options, "continuous_usage_stats")

    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens
    if max_tokens < 1 or prompt_tokens + max_tokens > max_model_len:
        param = "messages" if kind == "chat" else "prompt"
        raise RequestRejected(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max(max_tokens, 1)} tokens ({prompt_tokens} in the "
            f"prompt, {max(max_tokens, 1)} in the completion). Please reduce the length of "
            "the prompt or completion.",
            reason="max_model_len",
            param=param,
            code="context_length_exceeded",
        )
    if min_tokens > max_tokens:
        raise _bad(f"`min_tokens` ({min_tokens}) must not exceed max_tokens", "min_tokens")
    return GenerationParams(
        kind=kind,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
    )
