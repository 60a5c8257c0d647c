"""The body of a request of the run, built one way for the load and for the probes that
stand for it (the preflight's first request, a worker's start-up probes), for each
`--endpoint`: chat, completions, the Responses API and Anthropic-style Messages.

    body = request_body(options, model, prompt, None, 128, stream=True,
                        continuous_usage=False, ignore_eos=True)

A session's history is in OpenAI chat's shape (messages with `tool_calls`, `tool` results);
`responses` and `messages` get it in their own shapes (`responses_input`, `anthropic_messages`).
`--extra-body` goes on last; it cannot set what llmload owns (options/parsers.py refuses those
keys at start), so what it adds never changes the request's shape as llmload reads it.
"""

from __future__ import annotations

import json
from typing import Any

from locustfiles.options.options import ChatOptions


def request_body(
    options: ChatOptions,
    model: str | None,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    max_tokens: int | None,
    *,
    stream: bool,
    continuous_usage: bool,
    ignore_eos: bool,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One request's body: `messages` (chat), or the prompt (joined from the messages for
    completions); `tools` (OpenAI chat's shape) offered in the endpoint's own shape;
    `ignore_eos` only with a `max_tokens` to stop at."""
    endpoint = options.endpoint
    body: dict[str, Any] = {"model": model, "stream": stream}
    chat_messages = messages or [{"role": "user", "content": prompt or ""}]
    if endpoint == "chat":
        body["messages"] = chat_messages
    elif endpoint == "responses":
        instructions, items = responses_input(chat_messages)
        body["input"] = prompt if messages is None and prompt is not None else items
        if instructions:
            body["instructions"] = instructions
    elif endpoint == "messages":
        system, turns = anthropic_messages(chat_messages)
        body["messages"] = turns
        if system:
            body["system"] = system
    else:
        body["prompt"] = (
            prompt
            if prompt is not None
            else "\n".join(str(m.get("content", "")) for m in messages or [])
        )
    if endpoint == "messages":  # Anthropic's max_tokens is required
        body["max_tokens"] = max_tokens if max_tokens is not None else 4096
    elif max_tokens is not None:
        body["max_output_tokens" if endpoint == "responses" else "max_tokens"] = max_tokens
    if stream and endpoint in ("chat", "completions"):
        body["stream_options"] = {"include_usage": True}
        if continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos and max_tokens is not None:
        body["ignore_eos"] = True
    if tools:
        body["tools"] = endpoint_tools(endpoint, tools)
    if options.response_format is not None:
        body.update(options.response_format.body(endpoint))
    body.update(options.extra_body)
    return body


def endpoint_tools(endpoint: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat's tools in an endpoint's shape (Responses: flat functions; Messages: name,
    description, input_schema)."""
    if endpoint == "responses":
        return [{"type": "function", **t["function"]} for t in tools]
    if endpoint == "messages":
        return [{"name": t["function"]["name"],
                 "description": t["function"].get("description", ""),
                 "input_schema": t["function"].get("parameters", {"type": "object"})}
                for t in tools]  # fmt: skip
    return tools


def _system_text(messages: list[dict[str, Any]]) -> str:
    """The system messages' contents, joined by new lines (both APIs take them apart)."""
    return "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")


def responses_input(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Chat messages as Responses input items: (instructions from system messages, items);
    an assistant's tool calls are `function_call` items, tool results `function_call_output`."""
    instructions = _system_text(messages)
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""),
                          "output": str(m.get("content") or "")})  # fmt: skip
            continue
        if m.get("content"):
            items.append({"role": role, "content": m["content"]})
        for call in m.get("tool_calls") or []:
            function = call.get("function") or {}
            items.append({"type": "function_call", "call_id": call.get("id", ""),
                          "name": function.get("name", ""),
                          "arguments": function.get("arguments", "")})  # fmt: skip
    return instructions, items


def anthropic_messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Chat messages in Anthropic's shape: (the system prompt, user and assistant turns); an
    assistant's tool calls are `tool_use` blocks, tool results `tool_result` blocks of a
    user turn (consecutive results in one turn)."""
    system = _system_text(messages)
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""),
                     "content": str(m.get("content") or "")}  # fmt: skip
            last = turns[-1] if turns else None
            if last is not None and last["role"] == "user" and isinstance(last["content"], list):
                last["content"].append(block)
            else:
                turns.append({"role": "user", "content": [block]})
            continue
        calls = m.get("tool_calls") or []
        if not calls:
            turns.append({"role": role, "content": m.get("content") or ""})
            continue
        blocks: list[dict[str, Any]] = []
        if m.get("content"):
            blocks.append({"type": "text", "text": m["content"]})
        for call in calls:
            function = call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                arguments = {}
            blocks.append({"type": "tool_use", "id": call.get("id", ""),
                           "name": function.get("name", ""),
                           "input": arguments if isinstance(arguments, dict) else {}})  # fmt: skip
        turns.append({"role": role, "content": blocks})
    return system, turns
