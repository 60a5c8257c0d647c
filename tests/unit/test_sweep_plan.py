"""Engine sweeps: the campaign's `engine` section, the configurations it plans, the Pareto
front and the best configuration, the sweep state a resumed sweep reads (docs/sweeps.md;
the engine process: tests/integration/test_sweep_engine.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.compare.sweep import SweepEntry, SweepPoint, mark_pareto, pick_best
from analysis.kernel.errors import UsageError
from infra.campaign.config import EngineConfig, flag_args, parse_campaign
from infra.campaign.sweep import STATE_FILE, entries_of, fingerprint, load_state, save_state

BASE: dict[str, Any] = {"target": {}, "workload": "D(16,8)"}


def _campaign(**engine: Any) -> Any:
    return parse_campaign({**BASE, "engine": engine})


def test_a_matrix_plans_every_combination_first_flag_slowest() -> None:
    campaign = _campaign(command="vllm serve m --port {port}",
                         sweep={"max-num-seqs": [1, 4], "enable-chunked-prefill": [True, False]})  # fmt: skip
    plan = campaign.engine.plan()
    assert [c.name for c in plan] == [
        "max-num-seqs-1.enable-chunked-prefill-true", "max-num-seqs-1.enable-chunked-prefill-false",
        "max-num-seqs-4.enable-chunked-prefill-true", "max-num-seqs-4.enable-chunked-prefill-false",
    ]  # fmt: skip
    assert plan[1].args == ("--max-num-seqs", "1", "--no-enable-chunked-prefill")
    assert campaign.engine.command == ("vllm", "serve", "m", "--port", "{port}")
    assert campaign.target.url == ""  # each configuration's engine gives it
    assert campaign.engine.is_sweep


def test_flag_args_and_a_lone_command() -> None:
    assert flag_args("x", True) == ["--x"]
    assert flag_args("x", False) == ["--no-x"]
    assert flag_args("gpu-memory-utilization", 0.5) == ["--gpu-memory-utilization", "0.5"]
    assert _campaign(command=["s", "--port", "{port}"]).engine.plan() == (EngineConfig("default"),)
    plain = parse_campaign({**BASE, "target": {"url": "http://127.0.0.1:8000"},
                            "engine": {"hardware": "1x H100"}})  # fmt: skip
    assert not plain.engine.is_sweep
    assert plain.engine.metadata() == {"hardware": "1x H100"}


def test_named_configurations_and_urls() -> None:
    campaign = _campaign(command="s --port {port}", env={"A": 1}, accelerators=2,
                         configurations=[
                             {"name": "tp2", "args": "--tensor-parallel-size 2", "env": {"B": "x"}},
                             {"name": "theirs", "url": "http://10.0.0.5:8000/", "accelerators": 8},
                         ])  # fmt: skip
    tp2, theirs = campaign.engine.plan()
    assert tp2 == EngineConfig("tp2", ("--tensor-parallel-size", "2"), {"B": "x"})
    assert theirs.url == "http://10.0.0.5:8000" and not theirs.started
    assert theirs.accelerators == 8 and campaign.engine.accelerators == 2
    assert campaign.engine.env == {"A": "1"}


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"target": {}}, "missing required key 'target.url'"),
        ({"target": {"url": "http://127.0.0.1:1"}, "engine": {"command": "s --port {port}"}},
         "'target.url' is set for each configuration"),
        ({"engine": {"command": "s"}}, "must place the port llmload picks"),
        ({"engine": {"sweep": {"a": [1]}, "configurations": [{"name": "x", "url": "http://a:1"}]}},
         "keep one"),
        ({"engine": {"configurations": [{"name": "x"}]}}, "needs engine.command to start it"),
        ({"engine": {"command": "s --port {port}", "sweep": {"a": []}}}, "must be a list of values"),
        ({"engine": {"command": "s --port {port}", "sweep": {"a b": [1]}}}, "not an engine flag"),
        ({"engine": {"configurations": [{"name": "x", "url": "http://a:1", "args": ["-v"]}]}},
         "args and env cannot apply"),
        ({"engine": {"command": "s --port {port}",
                     "configurations": [{"name": "x"}, {"name": "x"}]}}, "duplicate names"),
        ({"engine": {"command": "s --port {port}", "configurations": [{"name": "x", "argz": 1}]}},
         "unknown key 'engine.configurations[0].argz' (did you mean 'args'?)"),
        ({"engine": {"command": "s 'open", "port": 8000}}, "not a shell command line"),
        ({"engine": {"command": "s --port {port}", "ready_path": "v1/models"}}, "starting with '/'"),
        ({"engine": {"command": "s --port {port}", "env": {"A": [1]}}}, "environment variables"),
    ],
)  # fmt: skip
def test_a_bad_engine_section_is_one_line(data: dict[str, Any], said: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_campaign({**BASE, **data})
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


def _point(config: str, per_user: float, per_accel: float, slo: bool | None = True) -> SweepPoint:
    nan = float("nan")
    return SweepPoint(config, "default", "c=4", 4.0, "concurrency", 1.0, per_accel, 1.0,
                      per_accel, per_user, nan, nan, nan, nan, nan, nan, nan, nan, slo, False)  # fmt: skip


def test_the_pareto_front_and_the_best_under_the_slo() -> None:
    points = [
        _point("a", 100, 500),  # front: the fastest per user
        _point("b", 50, 1000),  # front
        _point("c", 40, 900),  # beaten by b on both
        _point("d", 20, 2000, slo=False),  # front, but misses the SLO
        _point("e", 50, 1000),  # ties b: neither beats the other
        _point("f", float("nan"), 5000),  # no TPOT: never on the front
    ]
    mark_pareto(points)
    assert [p.config for p in points if p.pareto] == ["a", "b", "d", "e"]
    best = pick_best(points, "default")
    assert best is not None and best.config == "f"  # highest per accelerator that passes
    best = pick_best(points[:5], "default")
    assert best is not None and best.config == "b"
    assert pick_best([_point("x", 1, 1, slo=False)], "default") is None


def test_the_state_resumes_only_the_same_plan(tmp_path: Path) -> None:
    campaign = _campaign(command="s --port {port}", sweep={"max-num-seqs": [1, 2]})
    state = load_state(tmp_path, campaign, resume=False)
    state["configurations"]["max-num-seqs-1"] = {
        "config": {"name": "max-num-seqs-1", "args": ["--max-num-seqs", "1"], "env": {},
                   "url": "", "accelerators": 0},
        "status": "done", "startup_s": 1.0, "error": "", "log_tail": "",
        "runs": [{"run_id": "r1", "run_uri": "runs/r1", "workload": "default", "repeat": 1}],
    }  # fmt: skip
    save_state(tmp_path, state)
    assert json.loads((tmp_path / STATE_FILE).read_text())["sweep_id"] == state["sweep_id"]
    assert load_state(tmp_path, campaign, resume=True) == state
    more = _campaign(command="s --port {port}", sweep={"max-num-seqs": [1, 2, 4]})
    assert fingerprint(more) == fingerprint(campaign)  # another configuration: same plan
    longer = dataclasses.replace(campaign, step_duration=60.0)
    with pytest.raises(UsageError, match="written for another plan"):
        load_state(tmp_path, longer, resume=True)
    assert load_state(tmp_path, longer, resume=False)["sweep_id"] != state["sweep_id"]
    (entry,) = entries_of(state)
    assert entry == SweepEntry("max-num-seqs-1", "runs/r1", args="--max-num-seqs 1",
                               startup_s=1.0, run_id="r1")  # fmt: skip
