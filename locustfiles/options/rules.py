"""Checks between options, written once for the command line and campaign files.

    check_together(values, given, say)

`values`: the options' checked values by name (at least those named here); `given(name)`:
whether the user set that option (on the command line: a value other than the default;
in a file: the key is there); `say(name)`: the path's voice for that option (voice.py).
The first broken rule raises UsageError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from locustfiles.options.parsers import has_step_objectives
from locustfiles.options.table import TABLE
from locustfiles.options.voice import Voice
from locustfiles.request.validity import FORMAT_ENDPOINTS

SPAWN_RATE: Final = 100.0
"""Users/s the staircase spawns at: a step of up to 100 users spawns within a second."""

DRAIN_TIMEOUT_S: Final = 600.0
"""The longest the requests in flight may take to end before the next level of a rate
search, or before a rate run ends (at most --request-timeout too)."""

SPAWN_TIMEOUT_S: Final = 60.0
"""How long a step waits for its users: a step of more than SPAWN_RATE × this many users
never reaches its concurrency (--steps 100000 had 6,000 users after 60 s)."""


def check_together(
    values: Mapping[str, Any], given: Callable[[str], bool], say: Callable[[str], Voice]
) -> None:
    _check_warmup(values, say)
    _check_steps(values, say)
    _check_open_loop(values, given, say)
    _check_search(values, say)
    _check_prefix_groups(values, given, say)
    _check_continuous_usage(values, say)
    _check_response_format(values, say)


def _check_continuous_usage(values: Mapping[str, Any], say: Callable[[str], Voice]) -> None:
    """Continuous usage stats are a stream option of OpenAI chat and completions only."""
    endpoint = values.get("endpoint", "chat")
    if values.get("continuous_usage") == "on" and endpoint not in ("chat", "completions"):
        say("continuous_usage").being(
            "on", f"applies to --endpoint chat and completions: the {endpoint} API has no such "
            "stream option; leave it at auto",
        )  # fmt: skip


def _check_response_format(values: Mapping[str, Any], say: Callable[[str], Voice]) -> None:
    """A structured output is asked in a body llmload writes, of an API that has one; its
    grammar ends the answer, which ignore_eos would run past."""
    fmt = values.get("response_format")
    if fmt is None:
        return
    endpoint = values.get("endpoint", "chat")
    flag = say("response_format")
    if endpoint not in FORMAT_ENDPOINTS:
        flag.being(fmt.spec, f"applies to --endpoint {', '.join(FORMAT_ENDPOINTS)}: the "
                   f"{endpoint} API has no structured-output request")  # fmt: skip
    if values.get("ignore_eos") == "on":
        say("ignore_eos").being("on", f"would run each answer past the end of its format "
                                f"({flag.ref}); leave it at auto (off with a format)")  # fmt: skip
    taken = [k for k in ("response_format", "text") if k in (values.get("extra_body") or {})]
    if taken:
        say("extra_body").being(taken[0], f"sets the body's {taken[0]!r}, which {flag.ref} "
                                "sets; give the format once")  # fmt: skip


def _check_steps(values: Mapping[str, Any], say: Callable[[str], Voice]) -> None:
    """Each concurrency step's users spawn within the time a step waits for them."""
    most = int(SPAWN_RATE * SPAWN_TIMEOUT_S)
    big = [n for n in values.get("steps") or () if n > most]
    if big:
        steps = say("steps")
        steps.showing(
            ",".join(map(str, values["steps"])),
            f"asks for {big[0]:,} users in a step: users spawn at {SPAWN_RATE:g}/s, and a "
            f"step waits {SPAWN_TIMEOUT_S:g} s for them, so at most {most:,} a step; for more "
            "load use --rates (open loop)",
        )


def _check_warmup(values: Mapping[str, Any], say: Callable[[str], Voice]) -> None:
    warmup, duration = values["step_warmup"], values["step_duration"]
    if warmup >= duration:
        w, d = say("step_warmup"), say("step_duration")
        w.showing(
            warmup,
            f"must be shorter than {d.ref} ({duration}); lower {w.ref} or raise {d.ref}, "
            f"e.g. {w.example(min(5.0, duration / 2))}",
        )


def _check_open_loop(
    values: Mapping[str, Any], given: Callable[[str], bool], say: Callable[[str], Voice]
) -> None:
    """Rates replace steps; the options that need rates need them."""
    rates, steps = say("rates"), say("steps")
    if values["rates"] and given("steps"):
        steps.conflict(
            rates, f"give {steps.ref} (concurrency) or {rates.ref} (requests/s), not both"
        )
    if values["rates"]:
        return
    for option in TABLE:
        if option.needs == "rates" and given(option.name):
            say(option.name).fail(
                f"applies to open-loop steps: give {rates.ref} too, e.g. {rates.example((1, 2, 4))}"
            )


def _check_search(values: Mapping[str, Any], say: Callable[[str], Voice]) -> None:
    """A search needs the levels of its mode and an SLO with a step objective to judge by."""
    search, rates, slo = say("search"), say("rates"), say("slo")
    if values["search"] == "rate" and not values["rates"]:
        search.being(
            "rate", f"needs {rates.ref} (the coarse levels), e.g. {rates.example((1, 2, 4, 8, 16))}"
        )
    if values["search"] == "concurrency" and values["rates"]:
        search.being(
            "concurrency",
            f"searches {say('steps').ref}, not {rates.ref}; use {search.example('rate')}",
        )
    if values["search"] != "off" and not has_step_objectives(values["slo"]):
        objective = search.pick(
            "at least one step objective", "a step objective to judge each level by"
        )
        search.fail(f"needs {slo.ref} with {objective}, e.g. {slo.example('ttft_p99=0.5')}")


PREFIX_TOKENS_MAX: Final = 10_000_000
"""The most prefix tokens (--prefix-groups × --prefix-tokens) a run may hold: each worker
process keeps every prefix, ~25 bytes a token (measured), so ~250 MB at this bound. 10**6
groups of 10**6 tokens grew to ~24 GB in 30 s before the kernel killed it."""
PREFIX_BYTES_PER_TOKEN: Final = 25


def _check_prefix_groups(
    values: Mapping[str, Any], given: Callable[[str], bool], say: Callable[[str], Voice]
) -> None:
    """--prefix-groups and --prefix-tokens go together, not with --shared-prefix-tokens (one
    group); priming needs prefixes to prime. (A campaign file sets these through `extra`.)"""
    n_groups, n_tokens = values.get("prefix_groups", 0), values.get("prefix_tokens", 0)
    shared_tokens, phase = values.get("shared_prefix_tokens", 0), values.get("cache_phase", "none")
    groups, tokens, shared = say("prefix_groups"), say("prefix_tokens"), say("shared_prefix_tokens")
    if shared_tokens and (n_groups or n_tokens):
        shared.conflict(groups, f"give {shared.ref} (one prefix) or {groups.ref} and "
                                f"{tokens.ref}, not both")  # fmt: skip
    if n_groups and not n_tokens:
        tokens.fail(f"is needed with {groups.ref}: the length of each prefix, "
                    f"e.g. {tokens.example(256)}")  # fmt: skip
    if n_tokens and not n_groups:
        groups.fail(f"is needed with {tokens.ref}: how many prefixes, e.g. {groups.example(4)}")
    if n_groups * n_tokens > PREFIX_TOKENS_MAX:
        cost = n_groups * n_tokens * PREFIX_BYTES_PER_TOKEN / 2**30
        groups.fail(f"× {tokens.ref} make {n_groups * n_tokens:,} prefix tokens, about "
                    f"{cost:,.1f} GiB in every worker process; give at most "
                    f"{PREFIX_TOKENS_MAX:,} in all, e.g. {groups.example(100)} and "
                    f"{tokens.example(2048)}")  # fmt: skip
    if "prime" in phase and not (n_groups or shared_tokens):
        say("cache_phase").being(phase, f"primes the shared prefixes: give {groups.ref} and "
                                 f"{tokens.ref} (or {shared.ref}), e.g. {groups.example(4)}")  # fmt: skip
