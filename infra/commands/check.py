"""`llmload check URL`: the handbook's checks before any load (infra/check/)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from analysis.kernel.errors import UsageError

EXIT_FAILED = 1


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "check",
        help="verify a server before load: non-streaming, streaming, bad input, cancellation",
        description=(
            "Run the handbook's checks in order against an OpenAI-compatible server: a "
            "non-streaming request, a streaming request, an over-long prompt (must be rejected "
            "with 400/413/422) and a client cancellation (the running-requests gauge of "
            "/metrics must return to its baseline). Prints what it learned (model, version, "
            "ignore_eos, usage in the stream, [DONE], simulated). Exit 0 when every required "
            "check passes, 1 when one fails, 2 for bad input."
        ),
    )
    parser.add_argument(
        "url", metavar="URL",
        help="the server's base URL, without /v1 or any other path, e.g. http://127.0.0.1:8000",
    )  # fmt: skip
    parser.add_argument("--model", default=None,
                        help="model id (default: first id of /v1/models), or a mix a:0.7,b:0.3")  # fmt: skip
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
        help="environment variable holding the API key, sent as a Bearer token (default OPENAI_API_KEY)",
    )  # fmt: skip
    parser.add_argument("--endpoint", default="chat",
                        choices=["chat", "completions", "responses", "messages"],
                        help="chat: /v1/chat/completions (default), completions: /v1/completions, "
                        "responses: /v1/responses, messages: /v1/messages (Anthropic-style)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds each request may take (a stream: to its first token, and each read; 10x in all) (default 60)")  # fmt: skip
    parser.add_argument("--wait-ready", action="store_true",
                        help="first poll until the server answers a completion; report the time (cold start)")  # fmt: skip
    parser.add_argument("--ready-timeout", type=float, default=None, metavar="S",
                        help="with --wait-ready: seconds to wait at most (default 600)")  # fmt: skip
    parser.add_argument("--metrics-url", default=None, metavar="URL",
                        help="Prometheus metrics of the server (default URL/metrics)")  # fmt: skip
    parser.add_argument("--running-metric", default=None, metavar="NAME",
                        help="running-requests gauge (default: vllm:num_requests_running, "
                        "llmload_sim_requests_running, ..., the first present)")  # fmt: skip
    parser.add_argument("--release-timeout", type=float, default=5.0, metavar="S",
                        help="seconds the gauge may take to return to its baseline after a cancel (default 5)")  # fmt: skip
    parser.add_argument("--bad-input-words", type=int, default=None, metavar="N",
                        help="words in the over-long prompt (default: max_model_len + 64, else 200000)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)


def _http_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"URL {url!r} is not an http(s) URL; give the server's base URL, e.g. http://127.0.0.1:8000"
        )
    try:
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        raise UsageError(f"URL {url!r} has an invalid port") from None


def _base_url(url: str, endpoint: str) -> str:
    """The server's base URL: refused with a path or a query, as `locust --host` is."""
    from locustfiles.options.parsers import base_url_problem

    _http_url(url)
    from locustfiles.options.options import ENDPOINT_PATHS

    adds = ENDPOINT_PATHS[endpoint]
    found = base_url_problem(url, adds)
    if found is not None:
        raise UsageError(f"URL {url!r} {found[0]}: llmload check {found[1]}")
    return url.rstrip("/")


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (0 < value < float("inf")):
        example = {"timeout": 60, "ready-timeout": 600, "release-timeout": 5}[name]  # defaults
        raise UsageError(f"--{name} must be > 0 seconds, not {value}; e.g. --{name} {example}")


def build_config(args: argparse.Namespace) -> Any:
    from infra.check import CheckConfig

    url = _base_url(args.url, args.endpoint)
    if not args.api_key_env.replace("_", "").isalnum():
        raise UsageError(
            f"--api-key-env {args.api_key_env!r} must be an environment variable name, "
            "e.g. OPENAI_API_KEY"
        )
    if args.ready_timeout is not None and not args.wait_ready:
        raise UsageError(
            "--ready-timeout needs --wait-ready; add --wait-ready (e.g. --wait-ready "
            f"--ready-timeout {args.ready_timeout:g}) or leave --ready-timeout out"
        )
    for name in ("timeout", "ready_timeout", "release_timeout"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if args.bad_input_words is not None and args.bad_input_words < 1:
        raise UsageError(f"--bad-input-words must be >= 1, not {args.bad_input_words}")
    if args.metrics_url is not None:
        _http_url(args.metrics_url)
    from locustfiles.traffic.models import parse_model_mix

    mix = parse_model_mix(args.model or "")  # a mix: every model is checked as served
    return CheckConfig(
        url=url,
        model=mix.first,
        also_models=mix.names[1:],
        api_key=os.environ.get(args.api_key_env) or None,
        endpoint=args.endpoint,
        timeout=args.timeout,
        wait_ready=args.wait_ready,
        ready_timeout=args.ready_timeout or 600.0,
        metrics_url=args.metrics_url,
        running_metric=args.running_metric or None,
        release_timeout=args.release_timeout,
        bad_input_words=args.bad_input_words,
    )


def run(args: argparse.Namespace) -> int:
    from infra.check import render_json, render_text, run_checks

    def said(result: Any) -> None:  # each check as it ends: one can take --timeout
        print(f"llmload check: {result.name}: {result.status}", file=sys.stderr, flush=True)

    report = run_checks(build_config(args), said)
    print(render_json(report) if args.json else render_text(report), end="")
    return 0 if report.ok else EXIT_FAILED
