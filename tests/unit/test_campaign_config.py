"""Campaign files: every example parses, every problem is one line naming the key, every key
is documented, and the engine metadata reaches the master's command line."""

from __future__ import annotations

import json
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import UsageError
from infra.campaign import Campaign, Engine, NamedWorkload, Target, load_campaign, parse_campaign
from infra.campaign.runner import master_command, worker_command

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.*ml"))

MINIMAL: dict[str, Any] = {"target": {"url": "http://127.0.0.1:8000"}, "workload": "D(16,8)"}


def test_there_are_the_three_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"sim-campaign.yaml", "vllm-campaign.yaml", "ci-slo-gate.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    campaign = load_campaign(path)
    assert campaign.workload and campaign.steps
    assert campaign.target.url.startswith("http://127.0.0.1:")


def test_examples_cover_engine_metadata_and_the_slo_gate() -> None:
    vllm = load_campaign(ROOT / "examples" / "vllm-campaign.yaml")
    assert set(vllm.engine.metadata()) == {f.name for f in fields(Engine)}
    assert len(vllm.workload) > 1
    gate = load_campaign(ROOT / "examples" / "ci-slo-gate.yaml")
    assert gate.fail_on_slo and gate.slo


def test_minimal_file_takes_the_documented_defaults() -> None:
    c = parse_campaign(MINIMAL)
    assert c.workload == (NamedWorkload("default", "D(16,8)"),)
    assert (c.steps, c.workers, c.expect_workers, c.events_uri) == ((1, 2, 4, 8), 2, 2, "runs")
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
        ({"workers": "many"}, "key 'workers' must be a number of local workers >= 1 or 'external'"),
        ({"workers": "external"}, "key 'expect_workers' is required with workers: external"),
        ({"workers": 2, "expect_workers": 3}, "key 'expect_workers' must equal workers (2)"),
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
            "workers": "external",
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
    return out


def test_every_config_key_is_documented() -> None:
    doc = (ROOT / "docs" / "campaign-config.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", doc, flags=re.MULTILINE))
    missing = [k for k in _keys(Campaign) if k not in documented]
    assert not missing, f"keys missing from docs/campaign-config.md: {missing}"
