"""The body of a request of the run, built one way for the load and for the probes that
stand for it (the preflight's first request, a worker's start-up probes).

    body = request_body(options, model, prompt, None, 128, stream=True,
                        continuous_usage=False, ignore_eos=True)

`--extra-body` goes on last; it cannot set what llmload owns (options/parsers.py refuses those
keys at start), so what it adds never changes the request's shape as llmload reads it.
"""

from __future__ import annotations

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
) -> dict[str, Any]:
    """One request's body: `messages` (chat) or the prompt, joined for the completions
    endpoint; `ignore_eos` only with a `max_tokens` to stop at."""
    body: dict[str, Any] = {"model": model, "stream": stream}
    if options.endpoint == "chat":
        body["messages"] = messages or [{"role": "user", "content": prompt or ""}]
    else:
        body["prompt"] = (
            prompt
            if prompt is not None
            else "\n".join(str(m.get("content", "")) for m in messages or [])
        )
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stream:
        body["stream_options"] = {"include_usage": True}
        if continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos and max_tokens is not None:
        body["ignore_eos"] = True
    body.update(options.extra_body)
    return body
