"""The chat user's options: registered on Locust's parser, validated once into ChatOptions.

Every option is also settable as `LOCUST_<NAME>` (e.g. `LOCUST_WORKLOAD`) and in a Locust
config file (`--config FILE`, `workload = D(128,64)`). Invalid values stop the run before any
request with one line naming the option and the fix, exit status 2.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from analysis.errors import UsageError
from locustfiles.traffic.spread import Spread, parse_spread
from locustfiles.traffic.workloads import Workload, parse_workload

DEFAULT_WORKLOAD = "D(128,64)"
DEFAULT_STEPS = "1,2,4,8"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def _opt(name: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    env = "LOCUST_" + name.lstrip("-").replace("-", "_").upper()
    return name, {"env_var": env, **kwargs}


# (flag, argparse keyword arguments). Help texts are the documentation: README lists them.
OPTIONS: list[tuple[str, dict[str, Any]]] = [
    _opt("--model", default="", help="model id to request (default: first id from /v1/models)"),
    _opt("--api-key-env", default="OPENAI_API_KEY",
         help="name of the environment variable holding the API key (sent as a Bearer token)"),
    _opt("--endpoint", default="chat", choices=["chat", "completions"],
         help="chat: /v1/chat/completions, completions: /v1/completions"),
    _opt("--no-stream", action="store_true", default=False,
         help="send non-streaming requests (TTFT then equals E2E)"),
    _opt("--workload", default=DEFAULT_WORKLOAD,
         help="length mix: D(in,out), N(m,sd)/(m,sd), U(a,b)/(a,b), weighted sums, dataset:PATH.jsonl"),
    _opt("--turns", default="1",
         help="sessions: turns per conversation, N or U(a,b) (1: single requests)"),
    _opt("--think-time", default="0",
         help="sessions: seconds between a reply and the next user turn: S, U(a,b), N(mean,sd) or exp(mean)"),
    _opt("--history", default="full",
         help="sessions: each turn resends the whole conversation (full) or its last N turns (window:N)"),
    _opt("--followup-workload", default="",
         help="sessions: length mix of the turns after the first (default: --workload)"),
    _opt("--tool-rate", type=float, default=0.0,
         help="agents: fraction of turns whose request offers tools; a tool call is answered after --tool-latency"),
    _opt("--tool-latency", default="0.5",
         help="agents: seconds a tool takes before its result is sent: S, U(a,b), N(mean,sd) or exp(mean)"),
    _opt("--steps", default=DEFAULT_STEPS, help="comma-separated target concurrencies, one step each"),
    _opt("--rates", default="",
         help="open loop: comma-separated arrival rates (requests/s), one step each, instead of --steps"),
    _opt("--arrival", default="poisson",
         help="open loop: arrival process of --rates: poisson, constant or gamma:CV (CV > 1 is burstier)"),
    _opt("--max-concurrency", type=int, default=0,
         help="open loop: cap on requests in flight across all workers (0: no cap)"),
    _opt("--over-cap", default="wait", choices=["wait", "drop"],
         help="open loop: an arrival over --max-concurrency waits for a slot, or is dropped (counted)"),
    _opt("--search", default="off", choices=["off", "concurrency", "rate"],
         help="capacity search: --steps (concurrency) or --rates (rate) until --slo fails, then bisect"),
    _opt("--slo", default="",
         help="SLO the capacity search judges each level by, e.g. ttft_p99=0.5,tpot_p50=0.05 (recorded in the manifest)"),
    _opt("--search-precision", type=float, default=0.05,
         help="capacity search: stop bisecting when the failing level is within this fraction of the passing one"),
    _opt("--search-min-requests", type=int, default=100,
         help="capacity search: a level runs until this many requests finished (at most 4x --step-duration)"),
    _opt("--step-duration", type=float, default=30.0,
         help="seconds each step runs after its users have spawned (includes the warmup)"),
    _opt("--step-warmup", type=float, default=5.0,
         help="seconds at the start of each step kept out of its statistics"),
    _opt("--cold-requests", type=int, default=3,
         help="first requests of the run, at concurrency 1, flagged cold and kept apart (0: none)"),
    _opt("--events-uri", default="file://./runs",
         help="where events go: s3://bucket/prefix, file:///path or a path"),
    _opt("--run-id", default="", help="run identifier (default: generated, time-ordered)"),
    _opt("--request-timeout", type=float, default=600.0, help="seconds a whole request may take"),
    _opt("--ttft-timeout", type=float, default=0.0,
         help="seconds to wait for the first token (0: only the request timeout)"),
    _opt("--stall-timeout", type=float, default=60.0,
         help="seconds without any byte after the first token before a stream counts as stalled"),
    _opt("--connect-timeout", type=float, default=10.0, help="seconds to open a connection"),
    _opt("--tokenizer", default="",
         help="tokenizer directory, tokenizer.json or name: exact prompt lengths, token counts"),
    _opt("--seed", type=int, default=0, help="seed for workload sampling and prompts"),
    _opt("--ignore-eos", default="auto", choices=["auto", "on", "off"],
         help="send ignore_eos to force output lengths (auto: probe whether the server accepts it)"),
    _opt("--continuous-usage", default="auto", choices=["auto", "on", "off"],
         help="ask for usage in every event (auto: probe whether the server accepts it)"),
    _opt("--cancel-rate", type=float, default=0.0,
         help="fraction of requests the client cancels on purpose (0-1)"),
    _opt("--cancel-after-tokens", type=int, default=1,
         help="output tokens after which a cancelled request disconnects"),
    _opt("--extra-body", default="", help="JSON object merged into every request body"),
    _opt("--shared-prefix-tokens", type=int, default=0,
         help="tokens of prompt prefix shared by all requests (prefix-cache experiments)"),
    _opt("--store-prompts", action="store_true", default=False,
         help="store prompt text in the events (default: length and SHA-256 only)"),
    _opt("--spool-dir", default="", help="local spool for event parts (default: system temp)"),
    _opt("--finish-timeout", type=float, default=120.0,
         help="seconds the master waits for workers to flush their events at the end"),
    _opt("--metadata", default="",
         help="JSON object of run facts (hardware, revision, launch_args...) added to the manifest config"),
    _opt("--scrape-interval", type=float, default=2.0,
         help="seconds between scrapes of the target's Prometheus /metrics by the master (0: off)"),
    _opt("--wait-ready", type=float, default=0.0,
         help="seconds to wait for a target that is still starting (0: it must answer at once, within --connect-timeout)"),
    _opt("--gc-freeze", default="on", choices=["on", "off"],
         help="freeze start-up objects out of the garbage collector (gc.freeze) so full collections during the run stay short"),
    _opt("--report-dir", default="",
         help="headless: write the report here at the end of the run; web UI: one folder per run here (default: a temporary folder)"),
]  # fmt: skip


def add_arguments(parser: Any) -> None:
    """Register the options on Locust's parser (the init_command_line_parser event)."""
    for flag, kwargs in OPTIONS:
        parser.add_argument(flag, include_in_web_ui=True, **kwargs)


@dataclass(frozen=True)
class ChatOptions:
    model: str
    api_key_env: str
    endpoint: str
    stream: bool
    workload: Workload
    steps: tuple[int, ...]
    step_duration: float
    step_warmup: float
    cold_requests: int
    events_uri: str
    run_id: str
    request_timeout: float
    ttft_timeout: float | None
    stall_timeout: float | None
    connect_timeout: float
    tokenizer: str
    seed: int
    ignore_eos: str
    continuous_usage: str
    cancel_rate: float
    cancel_after_tokens: int
    extra_body: dict[str, Any]
    shared_prefix_tokens: int
    store_prompts: bool
    spool_dir: str
    finish_timeout: float
    metadata: dict[str, Any]
    scrape_interval: float = 2.0
    gc_freeze: bool = True
    wait_ready: float = 0.0
    report_dir: str = ""
    rates: tuple[float, ...] = ()
    arrival: str = "poisson"
    max_concurrency: int = 0
    over_cap: str = "wait"
    search: str = "off"
    slo: str = ""
    search_precision: float = 0.05
    search_min_requests: int = 100
    turns: Spread = field(default_factory=lambda: parse_spread("--turns", "1", integer=True))
    think_time: Spread = field(default_factory=lambda: parse_spread("--think-time", "0"))
    history: int = 0  # 0: full; N: the last N turns
    followup_workload: Workload | None = None
    tool_rate: float = 0.0
    tool_latency: Spread = field(default_factory=lambda: parse_spread("--tool-latency", "0.5"))

    @property
    def sessions(self) -> bool:
        """Multi-turn sessions (or agent tool rounds) instead of single requests."""
        return (
            self.turns.spec != "1"
            or self.tool_rate > 0
            or self.workload.spec.startswith("conversations:")
        )

    @property
    def mode(self) -> str:
        """ "rate" (open loop: --rates) or "concurrency" (closed loop: --steps)."""
        return "rate" if self.rates else "concurrency"

    @property
    def levels(self) -> tuple[float, ...]:
        """The steps' levels: rates (requests/s) or concurrencies."""
        return self.rates if self.rates else tuple(float(s) for s in self.steps)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def config(self) -> dict[str, Any]:
        """What the manifest records (no secret values: the key is named, not given)."""
        skip = ("workload", "metadata", "followup_workload", "turns", "think_time", "tool_latency")
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in skip}
        out["workload"] = self.workload.spec
        out["followup_workload"] = self.followup_workload.spec if self.followup_workload else ""
        out.update(turns=self.turns.spec, think_time=self.think_time.spec,
                   tool_latency=self.tool_latency.spec)  # fmt: skip
        out["history"] = "full" if not self.history else f"window:{self.history}"
        out.update(self.metadata)  # top level: the report reads e.g. config.hardware
        return out


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    """A number of seconds: finite, > 0 (or >= 0 where 0 means off)."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise UsageError(f"--{name} must be {bound} seconds, not {value}; {_example(name)}")
    return value


def _at_least(name: str, value: int, minimum: int) -> int:
    if value < minimum:
        raise UsageError(f"--{name} must be an integer >= {minimum}, not {value}; {_example(name)}")
    return value


def _example(name: str) -> str:
    """The fix for a bad number: the option with its default value, e.g. '--step-duration 30'."""
    default = dict(OPTIONS)[f"--{name}"].get("default")
    return f"e.g. --{name} {default:g}" + (" (off)" if default == 0 else " (the default)")


def parse_run_id(text: str) -> str:
    """--run-id: empty (generated) or a name that is safe as one path segment of the store."""
    if text and not RUN_ID_PATTERN.fullmatch(text):
        raise UsageError(
            f"--run-id {text!r} must be letters, digits, '.', '_' or '-' "
            "(it names a folder in the events store), e.g. --run-id baseline-1"
        )
    return text


def parse_steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(s) for s in str(text).split(",") if s.strip())
    except ValueError:
        raise UsageError(
            f"--steps {text!r} is not a list of integers; use e.g. --steps 1,2,4,8"
        ) from None
    if not steps or any(s < 1 for s in steps):
        raise UsageError(
            f"--steps {text!r} needs at least one concurrency, each >= 1; e.g. --steps 1,2,4,8"
        )
    return steps


def parse_history(text: str) -> int:
    """--history: full (0) or window:N, the last N turns (N >= 1)."""
    value = str(text).strip().lower()
    if value == "full":
        return 0
    if value.startswith("window:") and value[7:].strip().isdigit() and int(value[7:]) >= 1:
        return int(value[7:])
    raise UsageError(
        f"--history {text!r} must be full or window:N with N >= 1 turns, e.g. --history window:4"
    )


def parse_rates(text: str) -> tuple[float, ...]:
    """--rates: empty (closed loop) or requests/s, each finite and > 0."""
    if not str(text).strip():
        return ()
    try:
        rates = tuple(float(s) for s in str(text).split(",") if s.strip())
    except ValueError:
        raise UsageError(
            f"--rates {text!r} is not a list of numbers; use e.g. --rates 1,2,4,8 (requests/s)"
        ) from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise UsageError(f"--rates {text!r} needs rates > 0 requests/s; e.g. --rates 0.5,1,2,4")
    return rates


def parse_arrival(text: str) -> str:
    """--arrival: poisson, constant or gamma:CV (CV > 0); returned normalised."""
    value = str(text).strip().lower()
    if value in ("poisson", "constant"):
        return value
    if value.startswith("gamma:"):
        try:
            cv = float(value.split(":", 1)[1])
        except ValueError:
            cv = math.nan
        if math.isfinite(cv) and cv > 0:
            return f"gamma:{cv:g}"
    raise UsageError(
        f"--arrival {text!r} must be poisson, constant or gamma:CV with CV > 0 "
        "(e.g. gamma:2 for bursty arrivals)"
    )


def _check_open_loop(ns: Any, rates: tuple[float, ...], arrival: str) -> None:
    """Open-loop options need --rates, and --rates replaces --steps."""
    if rates and str(ns.steps).replace(" ", "") != DEFAULT_STEPS:
        raise UsageError("give --steps (concurrency) or --rates (requests/s), not both")
    if rates:
        return
    given = [
        flag
        for flag, value, default in (
            ("--arrival", arrival, "poisson"),
            ("--max-concurrency", getattr(ns, "max_concurrency", 0), 0),
            ("--over-cap", getattr(ns, "over_cap", "wait"), "wait"),
        )
        if value != default
    ]
    if given:
        raise UsageError(
            f"{given[0]} applies to open-loop steps: give --rates too, e.g. --rates 1,2,4"
        )


def _check_search(ns: Any, rates: tuple[float, ...]) -> str:
    """--search and its SLO: the mode must match the steps, the SLO must judge steps."""
    from analysis.slo import parse_slo

    search = getattr(ns, "search", "off")
    spec = str(getattr(ns, "slo", "") or "")
    slo = parse_slo(spec or None)  # UsageError names a bad SLO
    if search == "off":
        return spec
    if search == "rate" and not rates:
        raise UsageError("--search rate needs --rates (the coarse levels), e.g. --rates 1,2,4,8,16")
    if search == "concurrency" and rates:
        raise UsageError("--search concurrency uses --steps, not --rates; use --search rate")
    if not slo.objectives:
        raise UsageError(
            "--search needs --slo with at least one step objective, e.g. --slo ttft_p99=0.5"
        )
    precision = getattr(ns, "search_precision", 0.05)
    if not (math.isfinite(precision) and 0 < precision < 1):
        raise UsageError(
            f"--search-precision must be between 0 and 1 (exclusive), not {precision}; e.g. 0.05"
        )
    _at_least("search-min-requests", getattr(ns, "search_min_requests", 100), 1)
    return spec


def _json_object(flag: str, text: str, example: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not valid JSON ({exc.msg}); give a JSON object") from exc
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object, e.g. '{example}'")
    return value


def parse_metadata(text: str) -> dict[str, Any]:
    """--metadata: a JSON object whose keys must not shadow an option in the manifest config."""
    metadata = _json_object("--metadata", text, '{"hardware": "1x H100 80GB"}')
    taken = sorted(set(metadata) & set(ChatOptions.__dataclass_fields__))
    if taken:
        raise UsageError(f"--metadata key {taken[0]!r} is an option's name; rename the key")
    return metadata


def from_parsed(ns: Any) -> ChatOptions:
    """Validate Locust's parsed options into ChatOptions; UsageError names the problem."""
    extra = _json_object("--extra-body", ns.extra_body, '{"temperature": 0}')
    if not 0 <= ns.cancel_rate <= 1:
        raise UsageError(
            f"--cancel-rate must be between 0 and 1, not {ns.cancel_rate} (e.g. 0.1: one in ten)"
        )
    _at_least("cold-requests", ns.cold_requests, 0)
    _at_least("shared-prefix-tokens", ns.shared_prefix_tokens, 0)
    _at_least("cancel-after-tokens", ns.cancel_after_tokens, 1)
    _positive("step-duration", ns.step_duration)
    _positive("step-warmup", ns.step_warmup, allow_zero=True)
    if ns.step_warmup >= ns.step_duration:
        raise UsageError(
            f"--step-warmup ({ns.step_warmup}) must be shorter than --step-duration "
            f"({ns.step_duration}); lower --step-warmup or raise --step-duration, e.g. "
            f"--step-warmup {min(5.0, ns.step_duration / 2):g}"
        )
    if not ns.api_key_env.replace("_", "").isalnum():
        raise UsageError(
            f"--api-key-env {ns.api_key_env!r} must be an environment variable name, "
            "e.g. OPENAI_API_KEY"
        )
    from analysis.storage import open_store

    open_store(ns.events_uri)  # raises UsageError for unusable URIs
    rates = parse_rates(getattr(ns, "rates", ""))
    arrival = parse_arrival(getattr(ns, "arrival", "poisson"))
    _check_open_loop(ns, rates, arrival)
    _at_least("max-concurrency", getattr(ns, "max_concurrency", 0), 0)
    slo = _check_search(ns, rates)
    if not 0 <= getattr(ns, "tool_rate", 0.0) <= 1:
        raise UsageError(
            f"--tool-rate must be between 0 and 1, not {ns.tool_rate} (e.g. 0.3: three turns in ten)"
        )
    followup = str(getattr(ns, "followup_workload", "") or "").strip()
    if followup.startswith("conversations:"):
        raise UsageError(
            "--followup-workload takes lengths (D/N/U) or dataset:PATH.jsonl; conversations: "
            "datasets give their own follow-ups"
        )
    return ChatOptions(
        model=ns.model,
        api_key_env=ns.api_key_env,
        endpoint=ns.endpoint,
        stream=not ns.no_stream,
        workload=parse_workload(ns.workload),
        steps=parse_steps(ns.steps),
        step_duration=_positive("step-duration", ns.step_duration),
        step_warmup=_positive("step-warmup", ns.step_warmup, allow_zero=True),
        cold_requests=ns.cold_requests,
        events_uri=ns.events_uri,
        run_id=parse_run_id(ns.run_id),
        request_timeout=_positive("request-timeout", ns.request_timeout),
        ttft_timeout=_positive("ttft-timeout", ns.ttft_timeout, allow_zero=True) or None,
        stall_timeout=_positive("stall-timeout", ns.stall_timeout, allow_zero=True) or None,
        connect_timeout=_positive("connect-timeout", ns.connect_timeout),
        tokenizer=ns.tokenizer,
        seed=ns.seed,
        ignore_eos=ns.ignore_eos,
        continuous_usage=ns.continuous_usage,
        cancel_rate=ns.cancel_rate,
        cancel_after_tokens=ns.cancel_after_tokens,
        extra_body=extra,
        shared_prefix_tokens=ns.shared_prefix_tokens,
        store_prompts=ns.store_prompts,
        spool_dir=ns.spool_dir,
        finish_timeout=_positive("finish-timeout", ns.finish_timeout),
        metadata=parse_metadata(getattr(ns, "metadata", "")),
        scrape_interval=_positive(
            "scrape-interval", getattr(ns, "scrape_interval", 2.0), allow_zero=True
        ),
        gc_freeze=getattr(ns, "gc_freeze", "on") == "on",
        wait_ready=_positive("wait-ready", getattr(ns, "wait_ready", 0.0), allow_zero=True),
        report_dir=getattr(ns, "report_dir", ""),
        rates=rates,
        arrival=arrival,
        max_concurrency=getattr(ns, "max_concurrency", 0),
        over_cap=getattr(ns, "over_cap", "wait"),
        search=getattr(ns, "search", "off"),
        slo=slo,
        search_precision=getattr(ns, "search_precision", 0.05),
        search_min_requests=getattr(ns, "search_min_requests", 100),
        turns=parse_spread("--turns", getattr(ns, "turns", "1"), integer=True),
        think_time=parse_spread("--think-time", getattr(ns, "think_time", "0")),
        history=parse_history(getattr(ns, "history", "full")),
        followup_workload=parse_workload(followup) if followup else None,
        tool_rate=getattr(ns, "tool_rate", 0.0),
        tool_latency=parse_spread("--tool-latency", getattr(ns, "tool_latency", "0.5")),
    )
