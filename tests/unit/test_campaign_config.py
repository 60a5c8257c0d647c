"""Campaign files: every example parses, every problem is one line naming the key, every key
is documented, the engine metadata and the open-loop and search keys reach the master's
command line, and a capacity search's run gets a deadline long enough for its probes."""

from __future__ import annotations

import json
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from analysis.kernel.errors import UsageError
from infra.campaign import (
    Campaign,
    Engine,
    EngineConfig,
    NamedWorkload,
    Target,
    config,
    load_campaign,
    parse_campaign,
    runner,
)
from infra.campaign.config import METADATA_KEYS, OWNED_FLAGS, usable_cpus
from infra.campaign.runner import (
    SEARCH_BISECT_PROBES,
    estimated_seconds,
    master_command,
    run_deadline,
    search_probes,
    worker_command,
    workers_line,
)
from infra.commands.campaign import _with_workers
from locustfiles.options.rules import DRAIN_TIMEOUT_S

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.*ml"))

MINIMAL: dict[str, Any] = {"target": {"url": "http://127.0.0.1:8000"}, "workload": "D(16,8)"}


def test_there_are_the_three_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"sim-campaign.yaml", "vllm-campaign.yaml", "ci-slo-gate.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    campaign = load_campaign(path)
    assert campaign.workload and campaign.levels
    if campaign.engine.is_sweep:  # each configuration's engine gives the URL
        assert campaign.target.url == "" and len(campaign.engine.plan()) > 1
    else:
        assert campaign.target.url.startswith("http://127.0.0.1:")


def test_examples_cover_engine_metadata_and_the_slo_gate() -> None:
    vllm = load_campaign(ROOT / "examples" / "vllm-campaign.yaml")
    assert set(vllm.engine.metadata()) == set(METADATA_KEYS)
    assert len(vllm.workload) > 1
    gate = load_campaign(ROOT / "examples" / "ci-slo-gate.yaml")
    assert gate.fail_on_slo and gate.slo
    search = load_campaign(ROOT / "examples" / "sim-rate-search-campaign.yaml")
    assert search.search == "rate" and search.mode == "rate" and search.rates and search.slo


def test_minimal_file_takes_the_documented_defaults() -> None:
    c = parse_campaign(MINIMAL)
    assert c.workload == (NamedWorkload("default", "D(16,8)"),)
    assert (c.steps, c.workers_per_host, c.events_uri) == ((1, 2, 4, 8), "auto", "runs")
    assert c.local_workers == c.expect_workers == usable_cpus()  # one worker process per CPU
    assert c.target == Target("http://127.0.0.1:8000")


def test_toml_and_yaml_read_the_same(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        'name = "t"\nsteps = "1,2"\n[target]\nurl = "http://127.0.0.1:8000/"\n'
        '[[workload]]\nname = "a"\nspec = "D(8,4)"\n[[workload]]\nname = "b"\nspec = "D(16,4)"\n'
        '[engine]\nlaunch_args = ["vllm", "serve", "m x"]\n'
    )
    (tmp_path / "c.yaml").write_text(
        "name: t\nsteps: [1, 2]\ntarget: {url: 'http://127.0.0.1:8000'}\n"
        "workload: [{name: a, spec: 'D(8,4)'}, {name: b, spec: 'D(16,4)'}]\n"
        "engine: {launch_args: \"vllm serve 'm x'\"}\n"
    )
    assert load_campaign(tmp_path / "c.toml") == load_campaign(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"stpes": [1]}, "unknown key 'stpes' (did you mean 'steps'?) (docs/campaign-config.md)"),
        ({"target": {"url": "http://h:1", "ulr": 1}}, "unknown key 'target.ulr'"),
        ({"steps": "1,x"}, "key 'steps' must be a list of integers >= 1"),
        ({"steps": [0, 2]}, "key 'steps' must be a list of integers >= 1"),
        ({"step_duration": "10s"}, "key 'step_duration' must be a number of seconds"),
        ({"step_warmup": 40}, "key 'step_warmup' must be shorter than step_duration"),
        ({"cold_requests": -1}, "key 'cold_requests' must be >= 0"),
        ({"workers": "many"}, "key 'workers' must be a number of local worker processes >= 1, "
                              "'auto' (one per CPU) or 'external', not 'many'"),
        ({"workers_per_host": 0}, "key 'workers_per_host' must be a number of local worker "
                                  "processes >= 1, 'auto' (one per CPU) or 'external', not 0"),
        ({"workers_per_host": -1}, "key 'workers_per_host' must be a number of local worker"),
        ({"workers_per_host": True}, "key 'workers_per_host' must be a number of local worker"),
        ({"workers_per_host": 2.5}, "key 'workers_per_host' must be a number of local worker"),
        ({"workers": "external"}, "key 'expect_workers' is required with workers: external"),
        ({"workers_per_host": "external"},
         "key 'expect_workers' is required with workers_per_host: external"),
        ({"workers": 2, "expect_workers": 3}, "key 'expect_workers' must equal workers (2)"),
        ({"workers_per_host": 2, "workers": 2},
         "key 'workers' and 'workers_per_host' are one setting (workers is its old name): keep "
         "only workers_per_host"),
        ({"workers_per_hosts": 2}, "unknown key 'workers_per_hosts' (did you mean "
                                   "'workers_per_host'?)"),
        ({"workload": "D(1"}, "key 'workload' is not a valid workload"),
        ({"workload": [{"name": "a"}]}, "missing required key 'workload[0].spec'"),
        ({"workload": [{"name": "a", "spec": "D(8,4)", "x": 1}]}, "unknown key 'workload[0].x'"),
        ({"slo": "ttft_p99=fast"}, "key 'slo' is not a valid SLO"),
        ({"fail_on_slo": "yes"}, "key 'fail_on_slo' must be true or false"),
        ({"fail_on_slo": True}, "key 'fail_on_slo' needs step objectives in slo"),
        ({"target": {"url": "127.0.0.1:8000"}}, "key 'target.url' must be an http:// or https://"),
        ({"target": None}, "missing required key 'target'"),
        ({"target": {"model": "m"}}, "missing required key 'target.url'"),
        ({"step_duration": 0}, "key 'step_duration' must be > 0, not 0"),
        ({"step_duration": -5}, "key 'step_duration' must be > 0, not -5"),
        ({"step_duration": float("nan")}, "key 'step_duration' must be > 0, not nan"),
        ({"worker_wait": float("inf")}, "key 'worker_wait' must be > 0, not inf"),
        ({"step_warmup": -1}, "key 'step_warmup' must be >= 0, not -1"),
        ({"master_port": 70000}, "key 'master_port' must be <= 65535, not 70000"),
        ({"workload": "D(0,8)"}, "the prompt length must be >= 1 token, not 0"),
        ({"workload": [{"name": "a", "spec": "U(0,4)/(1,2)"}]}, "key 'workload[0].spec' is not a valid workload"),
        ({"target": {"url": "http://h:1", "api_key_env": "MY-KEY"}}, "must name an environment variable"),
        ({"engine": {"hardware": {"gpu": 1}}}, "key 'engine.hardware' must be a string"),
        ({"extra": ["--host", "http://x"]}, "key 'extra' sets --host, which the campaign controls: use target.url"),
        ({"extra": "--seed 3"}, "key 'extra' must be a list of Locust arguments"),
        ({"name": "my campaign"}, "key 'name' must be letters, digits"),
        ({"events_uri": "ftp://x/y"}, "key 'events_uri' events URI scheme 'ftp' is not supported"),
        ({"rates": []}, "key 'rates' must be a list of requests/s such as [0.5, 1, 2], not []"),
        ({"rates": 4}, "key 'rates' must be a list of requests/s such as [0.5, 1, 2], not 4"),
        ({"rates": [1, 0]}, "key 'rates' must be a list of numbers > 0 (requests/s)"),
        ({"rates": "1,-2"}, "key 'rates' must be a list of numbers > 0 (requests/s)"),
        ({"rates": "1,x"}, "key 'rates' must be a list of numbers > 0 (requests/s)"),
        ({"rates": [1, True]}, "key 'rates' must be a list of numbers > 0 (requests/s)"),
        ({"rates": [1, float("inf")]}, "key 'rates' must be a list of numbers > 0 (requests/s)"),
        ({"rates": [1, 2], "steps": [1, 2]}, "key 'steps' and key 'rates' are both set: give steps (concurrency) or rates (requests/s), not both"),
        ({"rates": [1], "arrival": "uniform"}, "key 'arrival' must be poisson, constant or gamma:CV with CV > 0"),
        ({"rates": [1], "arrival": "gamma:0"}, "key 'arrival' must be poisson, constant or gamma:CV with CV > 0"),
        ({"rates": [1], "arrival": "gamma:x"}, "key 'arrival' must be poisson, constant or gamma:CV"),
        ({"rates": [1], "arrival": 2}, "key 'arrival' must be a string"),
        ({"rates": [1], "max_concurrency": -1}, "key 'max_concurrency' must be >= 0, not -1"),
        ({"rates": [1], "max_concurrency": 2.5}, "key 'max_concurrency' must be an integer"),
        ({"rates": [1], "over_cap": "queue"}, "key 'over_cap' must be wait or drop, not 'queue'"),
        ({"arrival": "constant"}, "key 'arrival' applies to open-loop steps: give rates too"),
        ({"max_concurrency": 8}, "key 'max_concurrency' applies to open-loop steps: give rates too"),
        ({"over_cap": "drop"}, "key 'over_cap' applies to open-loop steps: give rates too"),
        ({"search": "yes"}, "key 'search' must be off or concurrency or rate, not 'yes'"),
        ({"search": True}, "key 'search' must be off or concurrency or rate, not True"),
        ({"search": "rate", "slo": "ttft_p99=0.5"}, "key 'search' is rate: it needs rates (the coarse levels)"),
        ({"search": "concurrency", "rates": [1], "slo": "ttft_p99=0.5"}, "key 'search' is concurrency: it searches steps, not rates; use search: rate"),
        ({"search": "concurrency"}, "key 'search' needs slo with a step objective to judge each level by"),
        ({"search": "concurrency", "slo": "ttft=1"}, "key 'search' needs slo with a step objective"),
        ({"search": "concurrency", "slo": "ttft_p99=0.5", "fail_on_slo": True}, "key 'fail_on_slo' does not apply to a capacity search"),
        ({"search_precision": 0}, "key 'search_precision' must be between 0 and 1 (exclusive) such as 0.05, not 0"),
        ({"search_precision": 1}, "key 'search_precision' must be between 0 and 1 (exclusive)"),
        ({"search_precision": float("nan")}, "key 'search_precision' must be between 0 and 1"),
        ({"search_precision": "5%"}, "key 'search_precision' must be a number between 0 and 1"),
        ({"search_min_requests": 0}, "key 'search_min_requests' must be >= 1, not 0"),
        ({"search_min_requests": 1.5}, "key 'search_min_requests' must be an integer"),
        ({"extra": ["--rates", "1,2"]}, "key 'extra' sets --rates, which the campaign controls: use rates"),
        ({"extra": ["--search=rate"]}, "key 'extra' sets --search, which the campaign controls: use search"),
        ({"extra": ["--slo", "ttft_p99=1"]}, "key 'extra' sets --slo, which the campaign controls: use slo"),
    ],
)  # fmt: skip
def test_problems_are_one_line_naming_the_key(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_campaign({**MINIMAL, **change}, source="c.yaml")
    message = str(info.value)
    assert message.startswith("c.yaml: ") and "\n" not in message
    assert expected in message


def test_every_unknown_and_missing_key_is_named_in_one_line() -> None:
    data = {
        "stpes": [1],
        "target": {"ulr": "http://h:1", "modle": "m"},
        "engine": {"hardwear": "x"},
        "workload": [{"name": "a", "spec": "D(8,4)", "wieght": 1}, {"nmae": "b", "spec": "D(1,1)"}],
        "zzz": 1,
    }
    with pytest.raises(UsageError) as info:
        parse_campaign(data, source="c.yaml")
    assert str(info.value) == (
        "c.yaml: unknown keys 'stpes' (did you mean 'steps'?), 'zzz', 'target.ulr' (did you "
        "mean 'url'?), 'target.modle' (did you mean 'model'?), 'engine.hardwear' (did you mean "
        "'hardware'?), 'workload[0].wieght', 'workload[1].nmae' (did you mean 'name'?); "
        "missing required keys 'target.url', 'workload[1].name' (docs/campaign-config.md)"
    )
    with pytest.raises(UsageError, match="missing required keys 'target', 'workload' "):
        parse_campaign({}, source="c.yaml")


def test_file_level_problems(tmp_path: Path) -> None:
    cases = {
        "bad.yaml": ("target: [\n", "not valid YAML at line"),
        "bad.toml": ("target = \n", "not valid TOML"),
        "list.yaml": ("- 1\n", "the file must be a mapping of keys"),
        "c.json": ("{}", "campaign files end in .yaml, .yml or .toml"),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(UsageError, match=re.escape(expected)):
            load_campaign(tmp_path / name)
    with pytest.raises(UsageError, match="cannot read campaign file"):
        load_campaign(tmp_path / "missing.yaml")


def test_external_workers() -> None:
    c = parse_campaign(
        {
            **MINIMAL,
            "workers_per_host": "external",
            "expect_workers": 3,
            "master_port": 5557,
            "master_bind_host": "10.0.0.5",
        }  # fmt: skip
    )
    assert c.external_workers and c.local_workers == 0 and c.expect_workers == 3
    cmd = master_command(c, c.workload[0], "r1", 5557)
    assert cmd[cmd.index("--expect-workers") + 1] == "3"
    assert cmd[cmd.index("--master-bind-host") + 1] == "10.0.0.5"
    assert worker_command(c, 5557)[-3:] == ["10.0.0.5", "--master-port", "5557"]


def test_workers_per_host_auto_is_one_worker_process_per_usable_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "usable_cpus", lambda: 6)
    for given in ({}, {"workers_per_host": "auto"}, {"workers": "auto"}):
        c = parse_campaign({**MINIMAL, **given})
        assert (c.workers_per_host, c.local_workers, c.expect_workers) == ("auto", 6, 6)
        cmd = master_command(c, c.workload[0], "r1", 5557)
        assert cmd[cmd.index("--expect-workers") + 1] == "6"  # the master waits for all six
    assert workers_line(c) == "6 worker processes: one per CPU (workers_per_host: auto)"
    with pytest.raises(UsageError, match=re.escape("must equal workers_per_host (auto: 6 here)")):
        parse_campaign({**MINIMAL, "workers_per_host": "auto", "expect_workers": 2})


def test_usable_cpus_is_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    assert usable_cpus() == 2
    monkeypatch.delattr(config.os, "sched_getaffinity")
    monkeypatch.setattr(config.os, "cpu_count", lambda: 5)
    assert usable_cpus() == 5


def test_workers_per_host_n_and_its_old_name_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "usable_cpus", lambda: 2)
    monkeypatch.setattr(runner, "usable_cpus", lambda: 2)
    for key in ("workers_per_host", "workers"):
        c = parse_campaign({**MINIMAL, key: 3, "expect_workers": 3})
        assert (c.workers_per_host, c.local_workers, c.expect_workers) == (3, 3, 3)
    assert workers_line(c).startswith("3 worker processes (workers_per_host: 3); more than the 2")
    one = parse_campaign({**MINIMAL, "workers_per_host": 1})
    assert workers_line(one) == "1 worker process (workers_per_host: 1)"
    assert parse_campaign({**MINIMAL, "workers_per_host": "4"}).local_workers == 4


def test_the_workers_option_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "usable_cpus", lambda: 4)
    external = parse_campaign({**MINIMAL, "workers_per_host": "external", "expect_workers": 9})
    c = _with_workers(external, "auto")
    assert (c.workers_per_host, c.local_workers, c.expect_workers) == ("auto", 4, 4)
    c = _with_workers(external, "3")
    assert (c.external_workers, c.local_workers, c.expect_workers) == (False, 3, 3)
    for bad in ("0", "-1", "many", "external", "2.5", ""):
        with pytest.raises(UsageError) as caught:
            _with_workers(external, bad)
        assert str(caught.value) == (
            "--workers must be 'auto' (one per CPU) or a number of local worker processes >= 1, "
            f"not {bad!r} (external workers: workers_per_host: external in the file)"
        )


def test_processes_in_extra_is_refused() -> None:
    with pytest.raises(UsageError, match="sets --processes, which the campaign controls: use "
                       "workers_per_host"):  # fmt: skip
        parse_campaign({**MINIMAL, "extra": ["--processes", "4"]})


def test_engine_metadata_and_extra_reach_the_master_command() -> None:
    c = parse_campaign(
        {
            **MINIMAL,
            "name": "base",
            "target": {"url": "http://h:1", "model": "m"},
            "engine": {"hardware": "1x H100", "launch_args": ["vllm", "serve", "a b"]},
            "extra": ["--seed", 7],
        }  # fmt: skip
    )
    cmd = master_command(c, c.workload[0], "r1", 1234)
    metadata = json.loads(cmd[cmd.index("--metadata") + 1])
    assert metadata == {"campaign": "base", "workload_name": "default",
                        "hardware": "1x H100", "launch_args": "vllm serve 'a b'"}  # fmt: skip
    assert cmd[-2:] == ["--seed", "7"]
    assert cmd[cmd.index("--model") + 1] == "m" and cmd[cmd.index("--run-id") + 1] == "r1"


def test_open_loop_and_search_keys_take_their_values_and_defaults() -> None:
    c = parse_campaign(MINIMAL)
    assert (c.rates, c.arrival, c.max_concurrency, c.over_cap) == ((), "poisson", 0, "wait")
    assert (c.search, c.search_precision, c.search_min_requests) == ("off", 0.05, 100)
    assert c.mode == "concurrency" and c.levels == (1.0, 2.0, 4.0, 8.0)
    c = parse_campaign(
        {**MINIMAL, "rates": [0.5, 1, 2], "arrival": "Gamma:2.0", "max_concurrency": 16,
         "over_cap": "drop", "search": "rate", "slo": "ttft_p99=0.5",
         "search_precision": 0.1, "search_min_requests": 20}
    )  # fmt: skip
    assert (c.rates, c.steps, c.mode, c.levels) == ((0.5, 1.0, 2.0), (), "rate", (0.5, 1.0, 2.0))
    assert (c.arrival, c.max_concurrency, c.over_cap) == ("gamma:2", 16, "drop")
    assert (c.search, c.search_precision, c.search_min_requests) == ("rate", 0.1, 20)
    assert parse_campaign({**MINIMAL, "rates": " 1, 2.5 "}).rates == (1.0, 2.5)
    assert parse_campaign({**MINIMAL, "rates": [1], "arrival": "constant"}).arrival == "constant"
    concurrency = parse_campaign({**MINIMAL, "search": "concurrency", "slo": "ttft_p99=0.5"})
    assert concurrency.search == "concurrency" and concurrency.steps == (1, 2, 4, 8)


def test_a_bare_yaml_off_is_search_off(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("target: {url: 'http://127.0.0.1:8000'}\nworkload: D(8,4)\nsearch: off\n")
    assert load_campaign(path).search == "off"  # YAML 1.1 reads `off` as false


def test_every_open_loop_and_search_flag_is_owned() -> None:
    for flag in ("--rates", "--arrival", "--max-concurrency", "--over-cap", "--search", "--slo",
                 "--search-precision", "--search-min-requests"):  # fmt: skip
        key = OWNED_FLAGS[flag]
        assert key == flag.removeprefix("--").replace("-", "_")
        assert key in {f.name for f in fields(Campaign)}


def _flag(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_rate_steps_and_search_reach_the_master_command() -> None:
    c = parse_campaign(
        {**MINIMAL, "rates": [0.5, 2, 1.25], "arrival": "gamma:2", "max_concurrency": 16,
         "over_cap": "drop", "search": "rate", "slo": "ttft_p99=0.5,ttft=1",
         "search_precision": 0.1, "search_min_requests": 20}
    )  # fmt: skip
    cmd = master_command(c, c.workload[0], "r1", 1234)
    assert "--steps" not in cmd  # rates replace the steps
    assert _flag(cmd, "--rates") == "0.5,2,1.25"
    assert (_flag(cmd, "--arrival"), _flag(cmd, "--max-concurrency")) == ("gamma:2", "16")
    assert _flag(cmd, "--over-cap") == "drop"
    assert (_flag(cmd, "--search"), _flag(cmd, "--slo")) == ("rate", "ttft_p99=0.5,ttft=1")
    assert (_flag(cmd, "--search-precision"), _flag(cmd, "--search-min-requests")) == ("0.1", "20")


def test_closed_loop_commands_carry_steps_and_the_slo_only_when_set() -> None:
    plain = master_command(parse_campaign(MINIMAL), NamedWorkload("a", "D(8,4)"), "r1", 1)
    assert _flag(plain, "--steps") == "1,2,4,8"
    for flag in ("--rates", "--arrival", "--max-concurrency", "--over-cap", "--search", "--slo",
                 "--search-precision", "--search-min-requests"):  # fmt: skip
        assert flag not in plain
    c = parse_campaign({**MINIMAL, "steps": [2, 4], "slo": "ttft_p99=0.5"})
    with_slo = master_command(c, c.workload[0], "r1", 1)
    assert _flag(with_slo, "--slo") == "ttft_p99=0.5" and "--search" not in with_slo
    c = parse_campaign({**MINIMAL, "steps": [2, 4], "slo": "e2e_p99=9", "search": "concurrency"})
    search = master_command(c, c.workload[0], "r1", 1)
    assert (_flag(search, "--steps"), _flag(search, "--search")) == ("2,4", "concurrency")
    assert (_flag(search, "--search-precision"), _flag(search, "--search-min-requests")) == (
        "0.05",
        "100",
    )


def test_a_search_gets_a_deadline_for_every_probe_at_its_longest() -> None:
    plain = parse_campaign({**MINIMAL, "steps": [1, 2, 4], "step_duration": 10})
    search = parse_campaign(
        {**MINIMAL, "steps": [1, 2, 4], "step_duration": 10, "search": "concurrency",
         "slo": "ttft_p99=0.5"}
    )  # fmt: skip
    assert estimated_seconds(search) == estimated_seconds(plain)
    assert search_probes(search) == 3 + SEARCH_BISECT_PROBES
    # (coarse levels + bisection probes) x 4 x step_duration, doubled, plus the margins and
    # the last step's drain
    probes = (3 + SEARCH_BISECT_PROBES) * (4 * 10 + 0.5) + 5
    assert run_deadline(search) == search.worker_wait + 2 * probes + 180 + DRAIN_TIMEOUT_S
    assert run_deadline(search) > run_deadline(plain) + 2 * 15 * 30
    longer = parse_campaign(
        {**MINIMAL, "steps": [1, 2, 4], "step_duration": 20, "search": "concurrency",
         "slo": "ttft_p99=0.5"}
    )  # fmt: skip
    assert run_deadline(longer) > run_deadline(search)


def test_rate_steps_count_like_steps_and_a_fine_search_gets_more_probes() -> None:
    rates = parse_campaign({**MINIMAL, "rates": [1, 2, 4], "step_duration": 10})
    steps = parse_campaign({**MINIMAL, "steps": [1, 2, 4], "step_duration": 10})
    # the same steps; either run's last step may take the drain bound for its requests in flight
    assert run_deadline(rates) == run_deadline(steps) > 2 * 30 + DRAIN_TIMEOUT_S
    fine = parse_campaign(
        {**MINIMAL, "rates": [0.1, 100], "search": "rate", "slo": "ttft_p99=0.5",
         "search_precision": 0.001}
    )  # fmt: skip
    # bisecting 0.1..100 down to 0.1 % of 0.1 takes ceil(log2(99.9 / 0.0001)) = 20 probes
    assert search_probes(fine) == 2 + 20


def _keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    nested = {"target": Target, "engine": Engine, "workload": NamedWorkload}
    for f in fields(cls):
        name = f"{prefix}{f.name}"
        out.append(name)
        if cls is Campaign and f.name in nested:
            sub = nested[f.name]
            assert is_dataclass(sub)
            out += _keys(sub, f"{name}[]." if f.name == "workload" else f"{name}.")
        if cls is Engine and f.name == "configurations":
            out += _keys(EngineConfig, f"{name}[].")
    return out


def test_every_config_key_is_documented() -> None:
    doc = (ROOT / "docs" / "campaign-config.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", doc, flags=re.MULTILINE))
    missing = [k for k in _keys(Campaign) if k not in documented]
    assert not missing, f"keys missing from docs/campaign-config.md: {missing}"


def test_session_keys_reach_the_master_command_only_when_set() -> None:
    c = parse_campaign({**MINIMAL, "turns": "U(2,4)", "think_time": 2, "history": "window:3",
                        "followup_workload": "D(8,4)", "tool_rate": 0.25, "tool_latency": "exp(1)"})  # fmt: skip
    cmd = master_command(c, c.workload[0], "r1", 1)
    assert _flag(cmd, "--turns") == "U(2,4)" and _flag(cmd, "--think-time") == "2"
    assert _flag(cmd, "--history") == "window:3" and _flag(cmd, "--followup-workload") == "D(8,4)"
    assert _flag(cmd, "--tool-rate") == "0.25" and _flag(cmd, "--tool-latency") == "exp(1)"
    plain = master_command(parse_campaign(MINIMAL), NamedWorkload("a", "D(8,4)"), "r1", 1)
    assert not {"--turns", "--think-time", "--history", "--tool-rate"} & set(plain)


@pytest.mark.parametrize(
    ("change", "expected"),
    [({"turns": 0}, "key 'turns' is not valid (must be an integer >= 1"),
     ({"think_time": "soon"}, "key 'think_time' is not valid (not understood"),
     ({"history": "window:0"}, "key 'history' is not valid"),
     ({"followup_workload": "conversations:x.jsonl"}, "key 'followup_workload' is not valid"),
     ({"tool_rate": 1.5}, "key 'tool_rate' must be between 0 and 1 (inclusive)"),
     ({"tool_latency": [1]}, "key 'tool_latency' must be a number or a string")],
)  # fmt: skip
def test_bad_session_keys_are_one_line(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_campaign({**MINIMAL, **change})
    assert expected in str(info.value) and "\n" not in str(info.value)
