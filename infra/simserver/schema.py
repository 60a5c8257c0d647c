"""OpenAI request bodies: validation and prompt token counting.

Anything the simulator cannot honour is refused with an OpenAI-style error (HTTP 400),
never silently ignored: `n` other than 1, `stream_options` without `stream`, lengths over
`max_model_len`.

A prompt's tokens (docs/simserver.md): the whitespace words of every message's content in
order, plus, for an assistant message with `tool_calls`, the words of each call's
`function.arguments`; for /v1/completions the prompt's words or its token ids. The Responses
API (/v1/responses) and Anthropic-style Messages (/v1/messages) count the same words in
their own shapes: instructions or the system prompt, then every input item or message
(text parts, a function call's arguments, a tool's output or result).
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

from infra.simserver.tokens import tokenize

Kind = Literal["chat", "completion", "responses", "messages"]


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
    prompt: tuple[Hashable, ...] = ()  # the prompt's tokens (words or token ids)
    tool_name: str | None = None  # the function a tool call would name; None: no tools
    tool_forced: bool = False  # tool_choice "required" or a named function
    model: str | None = None  # the model asked for (None: the default)
    # structured answers (infra/simserver/structured.py): the schema the answer must fit
    # (a structured-output format; None: free text), the tool call's parameters
    answer_schema: Any = None
    tool_schema: Any = None


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


def _content_words(content: Any, where: str, out: list[Hashable]) -> None:
    if content is None:
        return
    if isinstance(content, str):
        out += tokenize(content)
        return
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                raise _bad(f"{where}: content parts must be objects", "messages")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _bad(f"{where}: a text part needs a string `text`", "messages")
                out += tokenize(text)
            else:
                raise _bad(f"{where}: content part type {part.get('type')!r} is not supported")
        return
    raise _bad(f"{where}: `content` must be a string or a list of parts", "messages")


def _tool_call_words(calls: Any, where: str, out: list[Hashable]) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _bad(f"{where}: `tool_calls` must be a list", "messages")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(arguments, str):
            raise _bad(
                f"{where}: tool_calls[{j}] needs `function.arguments` as a string", "messages"
            )
        out += tokenize(arguments)


def chat_prompt(body: dict[str, Any]) -> tuple[Hashable, ...]:
    """The prompt's tokens: content words of every message in order, then (assistant
    messages) the argument words of each tool call. Roles and templates add none."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("`messages` must be a non-empty list", "messages")
    words: list[Hashable] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string `role`", "messages")
        _content_words(message.get("content"), f"messages[{i}]", words)
        _tool_call_words(message.get("tool_calls"), f"messages[{i}]", words)
    return tuple(words)


def completion_prompt(body: dict[str, Any]) -> tuple[Hashable, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tuple(tokenize(prompt))
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        return tuple(prompt)  # pre-tokenised: one token per id
    raise _bad("`prompt` must be a string, a list of token ids, or a batch of one", "prompt")


def _tool_names(tools: Any) -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("`tools` must be a list", "tools")
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{i}] needs `function.name` as a non-empty string", "tools")
        names.append(name)
    return names


def tool_call_choice(body: dict[str, Any]) -> tuple[str | None, bool]:
    """(the function a tool call would name, whether a call is forced) from `tools` and
    `tool_choice`; (None, False) when the request cannot get a tool call."""
    names = _tool_names(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        return (names[0], False) if names else (None, False)
    if choice == "none":
        return None, False
    if not names:
        raise _bad("`tool_choice` needs a non-empty `tools` list", "tool_choice")
    if choice == "required":
        return names[0], True
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise _bad(
            '`tool_choice` must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise _bad(f"`tool_choice` names {name!r}, which is not in `tools`", "tool_choice")
    return name, True


def parse_generation(
    kind: Kind, raw: bytes, served_model: str | tuple[str, ...], max_model_len: int
) -> GenerationParams:
    """Validate a request body; raises RequestRejected. `served_model`: the id served, or
    every id served (the first is the default)."""
    served = (served_model,) if isinstance(served_model, str) else served_model
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _bad("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model not in served:
        raise RequestRejected(
            404,
            f"The model `{model}` does not exist (this server serves "
            f"{', '.join(f'`{m}`' for m in served)}).",
            reason="not_found",
            type_="NotFoundError",
            param="model",
            code="model_not_found",
        )
    n = _opt_int(body, "n", 1)
    if n is not None and n != 1:
        raise _bad("only `n` = 1 is supported by the simulator", "n")
    if kind in ("responses", "messages"):
        prompt, (tool_name, tool_forced), max_tokens = _api_request(kind, body)
    else:
        prompt = chat_prompt(body) if kind == "chat" else completion_prompt(body)
        tool_name, tool_forced = tool_call_choice(body) if kind == "chat" else (None, False)
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
    prompt_tokens = len(prompt)
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    ignore_eos = _opt_bool(body, "ignore_eos")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options") if kind in ("chat", "completion") else None
    include_usage = kind in ("responses", "messages")  # their streams always end with usage
    continuous = False
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
        param = {"chat": "messages", "messages": "messages", "responses": "input"}.get(
            kind, "prompt"
        )
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
        prompt=prompt,
        tool_name=tool_name,
        tool_forced=tool_forced,
        model=model if isinstance(model, str) else None,
        answer_schema=_answer_schema(kind, body),
        tool_schema=_tool_parameters(body.get("tools"), tool_name),
    )


def _answer_schema(kind: Kind, body: dict[str, Any]) -> Any:
    """The schema a structured-output request asks its answer to fit: `response_format` (chat,
    completions) or `text.format` (Responses); json_object: any object. None: free text."""
    if kind == "responses":
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        schema = fmt.get("schema") if isinstance(fmt, dict) else None
    elif kind in ("chat", "completion"):
        fmt = body.get("response_format")
        named = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = named.get("schema") if isinstance(named, dict) else None
    else:
        return None
    kind_of = fmt.get("type") if isinstance(fmt, dict) else None
    if kind_of == "json_object":
        return {"type": "object"}
    if kind_of == "json_schema":
        return schema if isinstance(schema, dict) else {"type": "object"}
    return None


def _tool_parameters(tools: Any, name: str | None) -> Any:
    """The named tool's schema: chat's `function.parameters`, the Responses API's flat
    `parameters`, Messages' `input_schema`."""
    if name is None or not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        inner = tool.get("function")
        function: dict[str, Any] = inner if isinstance(inner, dict) else tool
        if function.get("name") == name:
            return function.get("parameters") or function.get("input_schema") or {}
    return None


def _text_words(content: Any, where: str, param: str, out: list[Hashable]) -> None:
    """A text or a list of text parts (any part type with a string `text`: input_text,
    output_text, text); a Messages tool_use's input and tool_result's content count too."""
    if content is None:
        return
    if isinstance(content, str):
        out += tokenize(content)
        return
    if not isinstance(content, list):
        raise _bad(f"{where}: content must be a string or a list of parts", param)
    for part in content:
        if not isinstance(part, dict):
            raise _bad(f"{where}: content parts must be objects", param)
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            out += tokenize(part["text"])
        elif kind == "tool_use":
            out += tokenize(json.dumps(part.get("input") or {}))
        elif kind == "tool_result":
            _text_words(part.get("content"), where, param, out)
        else:
            raise _bad(f"{where}: content part type {kind!r} is not supported", param)


def _api_request(
    kind: Kind, body: dict[str, Any]
) -> tuple[tuple[Hashable, ...], tuple[str | None, bool], int | None]:
    """(the prompt's tokens, the tool call choice, the output cap) of a Responses or Messages
    request."""
    words: list[Hashable] = []
    if kind == "responses":
        _text_words(body.get("instructions"), "instructions", "instructions", words)
        items = body.get("input")
        if isinstance(items, str):
            words += tokenize(items)
        elif isinstance(items, list) and items:
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    raise _bad(f"input[{i}] must be an object", "input")
                itype = item.get("type", "message")
                if itype == "message":
                    _text_words(item.get("content"), f"input[{i}]", "input", words)
                elif itype == "function_call":
                    _text_words(item.get("arguments"), f"input[{i}]", "input", words)
                elif itype == "function_call_output":
                    _text_words(item.get("output"), f"input[{i}]", "input", words)
                else:
                    raise _bad(f"input[{i}]: item type {itype!r} is not supported", "input")
        else:
            raise _bad("`input` must be a string or a non-empty list of items", "input")
        tools = body.get("tools")
        if isinstance(tools, list):  # Responses' tools are flat: {type, name, parameters}
            tools = [{"function": t} for t in tools if isinstance(t, dict)]
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and "function" not in choice:
            choice = {"function": {"name": choice.get("name")}}
        max_tokens = _opt_int(body, "max_output_tokens", 1)
    else:
        _text_words(body.get("system"), "system", "system", words)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("`messages` must be a non-empty list", "messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise _bad(f"messages[{i}] must be an object with role user or assistant",
                           "messages")  # fmt: skip
            _text_words(message.get("content"), f"messages[{i}]", "messages", words)
        tools = body.get("tools")
        if isinstance(tools, list):  # Messages' tools: {name, description, input_schema}
            tools = [{"function": t} for t in tools if isinstance(t, dict)]
        raw = body.get("tool_choice")
        choice = raw
        if isinstance(raw, dict):
            choice = {"auto": "auto", "any": "required", "none": "none"}.get(str(raw.get("type")))
            if raw.get("type") == "tool":
                choice = {"function": {"name": raw.get("name")}}
        max_tokens = _opt_int(body, "max_tokens", 1)
        if max_tokens is None:
            raise _bad("`max_tokens` is required", "max_tokens")
    call = tool_call_choice({"tools": tools, "tool_choice": choice})
    return tuple(words), call, max_tokens
