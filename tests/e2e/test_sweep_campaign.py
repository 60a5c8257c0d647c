"""Engine sweeps end to end: `llmload campaign` starts the simulator once per configuration,
runs the same plan against each, stops it, and writes the sweep report (docs/sweeps.md).

The simulator's engine holds at most `--max-num-seqs` sequences: at concurrency 4, four
users wait on one slot with 1, share two with 2 and all run with 4, so its throughput grows
with the setting (its decode step costs the same for one sequence as for four with these
parameters), and the report must find that difference significant, name max-num-seqs 4 the
best, and put it on the Pareto front. The second test mixes an engine someone else started
(a URL) with one that cannot start, then resumes the sweep.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat import start_sim
from tests.support.targets import closed

LLMLOAD = str(Path(sys.executable).parent / "llmload")
SIM = [sys.executable, "-m", "infra", "sim", "--port", "{port}", "--profile", "tiny",
       "--decode-per-seq-us", "0", "--decode-per-kv-token-ns", "0", "--sim-gpus", "2"]  # fmt: skip


def _file(path: Path, engine: str, events: Path, reports: Path, slo: str = "") -> Path:
    path.write_text(
        f"""
name: sw
target: {{}}
workload: "D(32,16)"
steps: [4]
step_duration: 4
step_warmup: 1
cold_requests: 0
workers_per_host: 1
worker_wait: 30
events_uri: {events}
report_dir: {reports}
{slo}
engine:
{engine}
"""
    )
    return path


def _campaign(config: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LLMLOAD, "campaign", str(config), *more], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def _manifest(events: Path, run_id: str) -> dict[str, Any]:
    return dict(json.loads((events / run_id / "manifest.json").read_text()))


def test_a_three_configuration_sweep_finds_the_best_and_its_significance(tmp_path: Path) -> None:
    events, reports = tmp_path / "runs", tmp_path / "reports"
    engine = (f"  command: {json.dumps(SIM)}\n  ready_timeout: 60\n"
              "  sweep:\n    max-num-seqs: [1, 2, 4]\n")  # fmt: skip
    config = _file(tmp_path / "sweep.yaml", engine, events, reports,
                   "slo: ttft_p99=0.5\naccelerator_metrics: target")  # fmt: skip
    done = _campaign(config)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = reports / "sweep-sw"
    state = json.loads((folder / "sweep-state.json").read_text())
    names = ["max-num-seqs-1", "max-num-seqs-2", "max-num-seqs-4"]
    assert list(state["configurations"]) == names
    for name, record in state["configurations"].items():
        assert record["status"] == "done", record
        assert 0 < record["startup_s"] < 60
        assert closed(record["url"]), f"{name}: its engine still answers at {record['url']}"
        assert Path(record["log"]).exists()
        (run,) = record["runs"]
        config_of_run = _manifest(events, run["run_id"])["config"]
        assert config_of_run["engine_config"] == name
        assert config_of_run["sweep_id"] == state["sweep_id"]
        assert f"--max-num-seqs {name[-1]}" in config_of_run["launch_args"]
        assert run["run_id"].endswith(name)
    sweep = json.loads((folder / "sweep.json").read_text())
    assert sweep["kind"] == "llmload.sweep" and sweep["simulated"] is True
    points = {p["config"]: p for p in sweep["points"]}
    throughput = [points[n]["output_tokens_per_s"] for n in names]
    assert throughput[0] < throughput[1] < throughput[2], throughput
    assert sweep["best"]["default"]["config"] == "max-num-seqs-4"
    assert points["max-num-seqs-4"]["pareto"] is True
    # two simulated GPUs per engine: tokens/s per accelerator is half of the instance's
    for p in sweep["points"]:
        assert p["accelerators"] == 2
        assert abs(p["tokens_per_s_per_accelerator"] - p["output_tokens_per_s"] / 2) < 1e-6
        assert p["j_per_output_token"] > 0
    verdicts = {(v["other"], v["metric"]): v for v in sweep["verdicts"]}
    for other in names[:2]:
        v = verdicts[(other, "output_tokens_per_s")]
        assert v["verdict"] == "best significantly better", v
        assert v["ci_high"] < 0
    assert "max-num-seqs-4 at c=4" in sweep["best_lines"]["default"]
    html = (folder / "sweep.html").read_text()
    assert 'id="plot-pareto"' in html and 'id="simulated-banner"' in html
    md = (folder / "sweep.md").read_text()
    assert "sweep-pareto.svg" in md and "SIMULATED" in md
    assert (folder / "sweep-pareto.svg").read_text().startswith("<?xml")
    # the CLI builds the same report again, judged by another SLO
    again = subprocess.run([LLMLOAD, "sweep", str(folder), "--slo", "ttft_p99=0.000001",
                            "--out", str(tmp_path / "again")], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "no configuration met the SLO" in again.stdout


@pytest.mark.slow  # 20 s: `make test-slow` (the three-configuration sweep stays in the default)
def test_a_failed_configuration_is_recorded_and_a_resumed_sweep_skips_what_finished(
    tmp_path: Path,
) -> None:
    events, reports = tmp_path / "runs", tmp_path / "reports"
    with start_sim(tmp_path / "sim", "--profile", "tiny") as sim:
        engine = (f"  command: {json.dumps(SIM)}\n  ready_timeout: 60\n  configurations:\n"
                  f"    - {{name: theirs, url: \"{sim.url}\", accelerators: 1}}\n"
                  "    - {name: broken, args: ['--no-such-flag']}\n")  # fmt: skip
        config = _file(tmp_path / "sweep.yaml", engine, events, reports)
        first = _campaign(config)
        assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
        assert "broken (failed start)" in first.stderr
        folder = reports / "sweep-sw"
        state = json.loads((folder / "sweep-state.json").read_text())
        theirs, broken = state["configurations"]["theirs"], state["configurations"]["broken"]
        assert theirs["status"] == "done" and theirs["log"] == ""
        assert broken["status"] == "failed_start" and broken["runs"] == []
        assert "unrecognized arguments: --no-such-flag" in broken["log_tail"]
        md = (folder / "sweep.md").read_text()
        assert "broken: failed start" in md
        assert "best: theirs at c=4" in md
        # the engine someone else started is left running
        assert not closed(sim.url)

        second = _campaign(config, "--resume")
        assert second.returncode == 1
        assert (
            "configuration theirs: done in an earlier try of this sweep; skipped" in second.stdout
        )
        resumed = json.loads((folder / "sweep-state.json").read_text())
        assert resumed["sweep_id"] == state["sweep_id"]
        assert resumed["configurations"]["theirs"]["runs"] == theirs["runs"]
        assert len(list(events.iterdir())) == 1  # no second run of `theirs`

    # another plan cannot resume this sweep
    changed = config.read_text().replace("step_duration: 4", "step_duration: 5")
    config.write_text(changed)
    third = _campaign(config, "--resume")
    assert third.returncode == 2
    assert "was written for another plan" in third.stderr


# An engine that serves, then dies on its own (`os._exit`) LLMLOAD_TEST_EXIT_AFTER_S seconds
# after it started: `llmload sim` run in-process, with a timer.
DYING = (
    "import os, runpy, sys, threading\n"
    "after = os.environ.get('LLMLOAD_TEST_EXIT_AFTER_S')\n"
    "def die():\n"
    "    print('engine: dying on purpose', flush=True)\n"
    "    os._exit(70)\n"
    "if after:\n"
    "    threading.Timer(float(after), die).start()\n"
    "sys.argv = ['infra', *sys.argv[1:]]\n"
    "runpy.run_module('infra', run_name='__main__')\n"
)


@pytest.mark.slow  # 25 s: `make test-slow`
def test_an_engine_that_dies_during_its_plan_is_recorded_and_the_sweep_goes_on(
    tmp_path: Path,
) -> None:
    events, reports = tmp_path / "runs", tmp_path / "reports"
    command = [sys.executable, "-c", DYING, "sim", "--port", "{port}", "--profile", "tiny"]
    engine = (f"  command: {json.dumps(command)}\n  ready_timeout: 60\n  configurations:\n"
              "    - {name: dies, env: {LLMLOAD_TEST_EXIT_AFTER_S: '9'}}\n"
              "    - {name: lives}\n")  # fmt: skip
    config = _file(tmp_path / "sweep.yaml", engine, events, reports).read_text()
    config = config.replace("step_duration: 4", "step_duration: 10")  # it dies mid-step
    path = tmp_path / "sweep.yaml"
    path.write_text(config)
    done = _campaign(path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    folder = reports / "sweep-sw"
    state = json.loads((folder / "sweep-state.json").read_text())
    dies, lives = state["configurations"]["dies"], state["configurations"]["lives"]
    assert dies["status"] == "crashed", dies
    assert "dying on purpose" in dies["log_tail"]
    assert closed(dies["url"])
    assert lives["status"] == "done" and lives["runs"]
    md = (folder / "sweep.md").read_text()
    assert "dies: crashed" in md
    assert "best: lives at c=4" in md
    if dies["runs"]:  # it died during the step (not before the run began): its run is kept
        assert "dies: the engine exited during its plan" in md
        run = dies["runs"][0]["run_id"]
        summary = json.loads((Path(dies["runs"][0]["report"]) / "summary.json").read_text())
        assert summary["run_id"] == run
        (step,) = summary["steps"]
        assert step["failed"] > 0 and step["errors_connect"] > 0  # after the crash: recorded
