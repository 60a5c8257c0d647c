"""The texts of single options: steps, rates, arrival, history, run id, names, URIs, SLOs,
the target's base URL and the keys --extra-body may set.

Each takes the text as given and returns it parsed (or checked, and normalised where that
helps), or raises UsageError with one line that names the option, the text and the fix, in
the command line's terms; a campaign file words the refusal its own way (table.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from analysis.kernel.errors import UsageError
from locustfiles.traffic.workloads import Workload, WorkloadKind, parse_workload, workload_kind

BODY_OWNERS: Final = {
    "model": "--model",
    "messages": "--workload",
    "prompt": "--workload",
    "max_tokens": "--workload",
    "max_completion_tokens": "--workload",
    "input": "--workload",
    "instructions": "--workload",
    "system": "--workload",
    "max_output_tokens": "--workload",
    "stream": "--no-stream",
    "stream_options": "--continuous-usage",
    "n": "llmload reads one choice per request",
}
"""Request body keys llmload sets itself, and the option (or rule) that decides each one:
--extra-body may not set them (docs/reliability.md, "Bad input")."""

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_run_id(text: str) -> str:
    """--run-id: empty (generated) or a name that is safe as one path segment of the store."""
    if text and not RUN_ID_PATTERN.fullmatch(text):
        raise UsageError(
            f"--run-id {text!r} must be letters, digits, '.', '_' or '-' "
            "(it names a folder in the events store), e.g. --run-id baseline-1"
        )
    return text


def parse_listen(text: str) -> str:
    """--otlp-listen: empty (off) or HOST:PORT to listen on (port 0: any free port; an IPv6
    host in brackets, [::1]:4318)."""
    if not text:
        return text
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (
        not sep
        or not host
        or not port.isdigit()
        or int(port) > 65535
        or any(c.isspace() or c in "/[]" for c in host)
    ):
        raise UsageError(
            f"--otlp-listen {text!r} must be HOST:PORT (port 0-65535), e.g. --otlp-listen "
            "0.0.0.0:4318 (the engine then sends to http://THIS_HOST:4318/v1/traces)"
        )
    return text


def parse_accelerator_source(text: str) -> str:
    """--accelerator-metrics: empty (off), `nvml` (the local GPUs), `target` (the target's own
    /metrics, where it serves the DCGM series itself: `llmload sim`, or a proxy that merges
    them) or the http(s) URL of a DCGM exporter's Prometheus endpoint."""
    if not text or text in ("nvml", "target"):
        return text
    try:
        parts = urlsplit(text)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port out of range, a bracket left open
        ok = False
    if not ok or any(c.isspace() for c in text):
        raise UsageError(
            f"--accelerator-metrics {text!r} must be a DCGM exporter's http(s) URL, e.g. "
            "--accelerator-metrics http://gpu-host:9400/metrics, nvml (this host's GPUs) or "
            "target (the target's own /metrics)"
        )
    return text


def parse_env_name(text: str) -> str:
    """--api-key-env: the name of an environment variable."""
    if not ENV_NAME_PATTERN.fullmatch(text):
        raise UsageError(
            f"--api-key-env {text!r} must be an environment variable name, e.g. OPENAI_API_KEY"
        )
    return text


def _numbers(flag: str, text: str, number: type[float], what: str) -> tuple[Any, ...]:
    """The comma-separated numbers of `text` (empty items skipped)."""
    try:
        return tuple(number(s) for s in str(text).split(",") if s.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a list of {what}") from None


def parse_steps(text: str) -> tuple[int, ...]:
    steps = _numbers("--steps", text, int, "integers; use e.g. --steps 1,2,4,8")
    if not steps or any(s < 1 for s in steps):
        raise UsageError(
            f"--steps {text!r} needs at least one concurrency, each >= 1; e.g. --steps 1,2,4,8"
        )
    return steps


RATE_MIN: Final = 0.001
"""The lowest --rates value: one request in 1,000 s (below, a step sends nothing, and the
schedule's first gap overflows the event loop's timers)."""

RATE_MAX: Final = 100_000.0
"""The highest --rates value: 100 workers at 1,000 requests/s each. Above, the arrivals due
outnumber what any campaign sends, and each waits as a greenlet in a worker's memory."""

CV_MAX: Final = 10.0
"""The burstiest --arrival gamma:CV. Gamma gaps of shape 1/CV² arrive in bursts of about CV²
requests at once: 100 at CV 10; at CV 1e9 a single burst (10**18) filled memory in seconds."""


def parse_rates(text: str) -> tuple[float, ...]:
    """--rates: empty (closed loop) or requests/s, each in [RATE_MIN, RATE_MAX]."""
    if not str(text).strip():
        return ()
    rates = _numbers("--rates", text, float, "numbers; use e.g. --rates 1,2,4,8 (requests/s)")
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise UsageError(f"--rates {text!r} needs rates > 0 requests/s; e.g. --rates 0.5,1,2,4")
    if any(r < RATE_MIN or r > RATE_MAX for r in rates):
        raise UsageError(
            f"--rates {text!r}: each rate must be between {RATE_MIN:g} (one request in 1,000 s) "
            f"and {RATE_MAX:,.0f} requests/s (100 workers at 1,000/s); e.g. --rates 0.5,1,2,4"
        )
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
        if math.isfinite(cv) and 0 < cv <= CV_MAX:
            return f"gamma:{cv:g}"
        if cv > CV_MAX:
            raise UsageError(
                f"--arrival {text!r}: CV must be at most {CV_MAX:g}; gamma arrivals come in "
                f"bursts of about CV² requests at once ({cv * cv:.3g} here); e.g. gamma:2"
            )
    raise UsageError(
        f"--arrival {text!r} must be poisson, constant or gamma:CV with CV > 0 "
        "(e.g. gamma:2 for bursty arrivals)"
    )


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


def parse_followup(text: str) -> Workload | None:
    """--followup-workload: empty (the workload's own) or lengths, not conversations."""
    if not text:
        return None
    if workload_kind(text) is WorkloadKind.CONVERSATIONS:
        raise UsageError(
            "--followup-workload takes lengths (D/N/U) or dataset:PATH.jsonl; conversations: "
            "datasets give their own follow-ups"
        )
    return parse_workload(text)


def check_events_uri(uri: str) -> str:
    """--events-uri: a store llmload can open (UsageError for unusable URIs)."""
    from analysis.kernel.storage import open_store

    open_store(uri)
    return uri


def local_folder(flag: str) -> Callable[[str], str]:
    """--spool-dir, --report-dir: a local folder, `~` expanded (as a shell would not have for
    a quoted path, `--flag=~/x`, a LOCUST_* variable or a campaign file)."""

    def parse(text: str) -> str:
        from analysis.kernel.storage import expand_home

        return expand_home(text, flag)

    return parse


def check_slo(spec: str) -> str:
    """--slo: objectives and thresholds parse_slo accepts (or empty: none)."""
    from analysis.kernel.slo import parse_slo

    parse_slo(spec or None)
    return spec


def has_step_objectives(spec: Any) -> bool:
    """Whether an SLO spec holds an objective a step can be judged by."""
    from analysis.kernel.slo import parse_slo

    return bool(parse_slo(str(spec or "") or None).objectives)


def base_url_problem(url: str, adds: str = "/v1/chat/completions") -> tuple[str, str] | None:
    """What keeps `url` from being a server's base URL that llmload adds `adds` to, as
    (the problem, the URL to give instead, or "" where there is none), or None. Only
    http(s)://host[:port] passes (a trailing `/` too): a path (`/v1`, a reverse proxy's
    prefix) or a query is refused (docs/reliability.md, "Bad input")."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http(s) URL", ""
    try:
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return "has an invalid port", ""
    base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    path = parts.path.rstrip("/")
    if path == "/v1" or path.startswith("/v1/"):
        return f"has a path: give the server's base URL without /v1 (llmload adds {adds})", base
    if path:
        return (
            f"has a path: give the server's base URL without one (llmload adds {adds}; a "
            "server behind a path prefix must be reachable at the root of a host or port)",
            base,
        )
    if parts.query or parts.fragment:
        return f"has a query: give the server's base URL without one (llmload adds {adds})", base
    return None


def check_host(url: str, adds: str = "/v1/chat/completions") -> str:
    """--host: the server's base URL (see base_url_problem), returned without a trailing /."""
    found = base_url_problem(url, adds)
    if found is not None:
        problem, base = found
        example = "give the server's base URL, e.g. --host http://127.0.0.1:8000"
        fix = f"--host {base}" if base else example
        raise UsageError(f"--host {url} {problem}: {fix}")
    return url.rstrip("/")


def check_extra_body(body: dict[str, Any]) -> dict[str, Any]:
    """--extra-body: a JSON object that sets none of the keys llmload owns (BODY_OWNERS)."""
    for key in body:
        if key in BODY_OWNERS:
            owner = BODY_OWNERS[key]
            decides = f"{owner} decides it" if owner.startswith("--") else owner
            raise UsageError(
                f"--extra-body sets {key!r}, which llmload owns ({decides}); "
                "leave it out of --extra-body"
            )
    return body
