"""One option table (locustfiles/options/table.py) serves Locust's parser, campaign files and the
campaign runner: each option is declared once, the three read it alike, and a campaign's
master command line parses back to the values of its file."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import fields
from typing import Any

import pytest

from analysis.kernel.errors import UsageError
from infra.campaign import Campaign, Target, parse_campaign
from infra.campaign.config import CHAT_OPTIONS, OWNED_FLAGS
from infra.campaign.runner import master_command
from locustfiles.options.options import ChatOptions, from_parsed
from locustfiles.options.table import OPTION, TABLE, command_line

MINIMAL: dict[str, Any] = {"target": {"url": "http://127.0.0.1:8000"}, "workload": "D(16,8)"}

# Every chat key of a campaign file, set to a value other than its default: closed loop with
# a capacity search, and open loop.
CLOSED: dict[str, Any] = {
    "target": {"url": "http://h:1", "model": "m1", "api_key_env": "MY_KEY"},
    "workload": "D(32,16)", "steps": [2, 4], "turns": "U(2,4)", "think_time": 1.5,
    "history": "window:3", "followup_workload": "D(8,4)", "tool_rate": 0.25,
    "tool_latency": "exp(1)", "search": "concurrency", "slo": "ttft_p99=0.5",
    "search_precision": 0.1, "search_min_requests": 20, "step_duration": 12.5,
    "step_warmup": 2, "cold_requests": 0, "events_uri": "file:///tmp/llmload-table-test",
}  # fmt: skip
OPEN: dict[str, Any] = {
    **MINIMAL, "rates": [0.5, 2, 1.25], "arrival": "Gamma:2.0", "max_concurrency": 16,
    "over_cap": "drop", "search": "rate", "slo": "ttft_p99=0.5,ttft=1",
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    """A plain argparse parser built from the table, as Locust's is (add_arguments)."""
    p = argparse.ArgumentParser(add_help=False)
    for option in TABLE:
        p.add_argument(option.flag, **option.arguments())
    return p


def options_from(argv: list[str]) -> ChatOptions:
    known, _locust_flags = parser().parse_known_args(argv)
    return from_parsed(known)


def test_every_option_is_declared_once_with_a_flag_help_and_an_env_var() -> None:
    flags = [o.flag for o in TABLE]
    assert len(set(flags)) == len(flags) and all(f.startswith("--") for f in flags)
    assert all(o.help and o.env_var == "LOCUST_" + o.name.upper() for o in TABLE)
    keys = [o.key for o in TABLE if o.key]
    assert len(set(keys)) == len(keys)


def test_every_campaign_key_is_a_field_of_the_file_and_owned() -> None:
    campaign_keys = {f.name for f in fields(Campaign)}
    target_keys = {f"target.{f.name}" for f in fields(Target)}
    for option in TABLE:
        if option.key:
            assert option.key in campaign_keys | target_keys, option.key
            assert OWNED_FLAGS[option.flag] == option.key
    assert {o.name for o in CHAT_OPTIONS} == {o.name for o in TABLE if o.key} - {"workload"}


def test_the_parser_built_from_the_table_accepts_every_default() -> None:
    parsed = parser().parse_args([])
    assert from_parsed(parsed).config() == options_from([]).config()
    for option in TABLE:
        assert getattr(parsed, option.name) == option.default
        assert option.kind.setting(option.default, option.cli()) == option.default_setting


def test_a_minimal_file_takes_the_defaults_of_the_command_line() -> None:
    campaign = parse_campaign(MINIMAL)
    for option in CHAT_OPTIONS:
        assert campaign.settings()[option.name] == option.file_default
        if option.in_files is None:
            assert option.file_default == option.default_setting
    # only what must be explicit reaches the master at the defaults
    assert command_line(campaign.settings()) == [
        "--api-key-env", "OPENAI_API_KEY", "--steps", "1,2,4,8", "--step-duration", "30",
        "--step-warmup", "5", "--cold-requests", "3", "--events-uri", "runs",
    ]  # fmt: skip


def _as_text(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _by_hand(data: dict[str, Any]) -> list[str]:
    """The command line a user would type for the chat keys of a campaign file (and the keys
    whose default differs in files)."""
    argv = []
    for option in TABLE:
        section, _, key = (option.key or "").rpartition(".")
        where = data.get(section, {}) if section else data
        if option.key and key in where:
            argv += [option.flag, _as_text(where[key])]
        elif option.in_files is not None:
            argv += [option.flag, option.in_files]
    return argv


@pytest.mark.parametrize("data", [CLOSED, OPEN], ids=["closed", "open"])
def test_a_file_the_runners_command_line_and_the_hand_typed_one_agree(
    data: dict[str, Any],
) -> None:
    campaign = parse_campaign(data)
    cmd = master_command(campaign, campaign.workload[0], "r1", 1234)
    from_runner = options_from(cmd[cmd.index("--host") + 2 :]).config()
    from_hand = options_from([*_by_hand(data), "--run-id", "r1"]).config()
    from_runner.pop("metadata", None)
    for name in ("campaign", "workload_name"):  # the runner's --metadata
        assert from_runner.pop(name)
    assert from_runner == from_hand
    for name, setting in campaign.settings().items():
        if setting != ():  # open loop: the file's steps are ()
            assert from_runner[name] == setting, name


@pytest.mark.parametrize("option", CHAT_OPTIONS, ids=lambda o: o.name)
def test_a_wrong_value_names_the_key_in_a_file_and_the_flag_on_a_command_line(option: Any) -> None:
    section, _, key = str(option.key).rpartition(".")
    bad: dict[str, Any] = {key: {"a": 1}}
    data = {**MINIMAL, section: {**MINIMAL[section], **bad}} if section else {**MINIMAL, **bad}
    with pytest.raises(UsageError, match=rf"^c\.yaml: key '{option.key}' ") as info:
        parse_campaign(data, source="c.yaml")
    assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match=rf"^{option.flag} "):
        option.kind.value({"a": 1}, option.cli())


# The checks between options: the same rule refuses the same pair in both paths.
RULES: list[tuple[str, dict[str, Any], str, str]] = [
    ("--step-duration 10 --step-warmup 10", {"step_duration": 10, "step_warmup": 10},
     "--step-warmup (10.0) must be shorter than --step-duration (10.0)",
     "key 'step_warmup' must be shorter than step_duration (10.0)"),
    ("--steps 1 --rates 1", {"steps": [1], "rates": [1]},
     "give --steps (concurrency) or --rates (requests/s), not both",
     "key 'steps' and key 'rates' are both set"),
    ("--over-cap drop", {"over_cap": "drop"},
     "--over-cap applies to open-loop steps: give --rates too, e.g. --rates 1,2,4",
     "key 'over_cap' applies to open-loop steps: give rates too, e.g. rates: [1, 2, 4]"),
    ("--search rate --slo ttft_p99=1", {"search": "rate", "slo": "ttft_p99=1"},
     "--search rate needs --rates (the coarse levels)",
     "key 'search' is rate: it needs rates (the coarse levels)"),
    ("--search concurrency --rates 1 --slo ttft_p99=1",
     {"search": "concurrency", "rates": [1], "slo": "ttft_p99=1"},
     "--search concurrency searches --steps, not --rates; use --search rate",
     "key 'search' is concurrency: it searches steps, not rates; use search: rate"),
    ("--search concurrency --slo ttft=1", {"search": "concurrency", "slo": "ttft=1"},
     "--search needs --slo with at least one step objective, e.g. --slo ttft_p99=0.5",
     "key 'search' needs slo with a step objective to judge each level by, e.g. slo: ttft_p99=0.5"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "keys", "cli", "file"), RULES, ids=[r[0] for r in RULES])
def test_a_rule_between_options_holds_in_both_paths(
    argv: str, keys: dict[str, Any], cli: str, file: str
) -> None:
    with pytest.raises(UsageError) as info:
        options_from(shlex.split(argv))
    assert cli in str(info.value)
    with pytest.raises(UsageError) as info:
        parse_campaign({**MINIMAL, **keys}, source="c.yaml")
    assert str(info.value).startswith("c.yaml: ") and file in str(info.value)


def test_the_options_that_need_rates_are_refused_without_them() -> None:
    given = {"arrival": "constant", "max_concurrency": "8", "over_cap": "drop"}
    assert [o.name for o in TABLE if o.needs == "rates"] == list(given)
    for name, text in given.items():
        with pytest.raises(UsageError, match=f"^{OPTION[name].flag} applies to open-loop steps"):
            options_from([OPTION[name].flag, text])
