"""An engine sweep: the campaign's plan once per engine configuration (docs/sweeps.md).

    outcome = run_sweep(campaign, out_root, echo=print, resume=False)
    outcome.sweep.best, outcome.folder          # <out_root>/sweep-<name>/

For each configuration of `campaign.engine.plan()`, in order: start its engine (or take the
URL of one already running), wait until it is ready (its start-up time and log kept), run
the campaign's plan against it (every workload, every repeat: runner.run_campaign), stop it
and check that its port and processes are gone. A configuration whose engine does not start,
or whose run fails, is recorded with its log's tail and the sweep goes on; one whose engine
exits during its plan is recorded as `crashed`, its runs kept. After each configuration the
state file `<out_root>/sweep-<name>/sweep-state.json` is written; `resume=True` skips the
configurations it records as done (with the same arguments). Then the sweep report
(analysis/compare/sweep.py) is written to the same folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from analysis.kernel.errors import UsageError
from infra.campaign.config import Campaign, EngineConfig
from infra.campaign.engine import EngineProcess, EngineStartError
from infra.campaign.runner import CampaignError, Echo, RunResult, run_campaign, scoped_environ

STATE_FILE: Final = "sweep-state.json"
STATE_VERSION: Final = 1


@dataclass
class SweepOutcome:
    folder: Path
    state: dict[str, Any]
    results: list[RunResult]
    sweep: Any  # analysis.compare.sweep.Sweep (None when nothing ran)
    files: dict[str, Path]


def sweep_folder(campaign: Campaign, out_root: Path) -> Path:
    return out_root / f"sweep-{campaign.name}"


def fingerprint(campaign: Campaign) -> str:
    """The plan every configuration runs (the campaign less its configurations): a resumed
    sweep must run the same one, or its configurations would not be comparable."""
    engine = dataclasses.replace(campaign.engine, sweep=(), configurations=())
    plain = dataclasses.asdict(dataclasses.replace(campaign, engine=engine))
    text = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _config_record(config: EngineConfig) -> dict[str, Any]:
    return {"name": config.name, "args": list(config.args), "env": dict(config.env),
            "url": config.url, "accelerators": config.accelerators}  # fmt: skip


def load_state(folder: Path, campaign: Campaign, resume: bool) -> dict[str, Any]:
    """The sweep's state: the one on disk when resuming (UsageError if it was written for
    another plan), else a new one."""
    path = folder / STATE_FILE
    if resume and path.exists():
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: cannot read the sweep state ({exc}); run without "
                             "--resume to start the sweep over") from None  # fmt: skip
        if state.get("fingerprint") != fingerprint(campaign):
            raise UsageError(
                f"{path} was written for another plan (the campaign file changed beyond its "
                "engine configurations): run without --resume to start the sweep over"
            )
        return dict(state)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return {"version": STATE_VERSION, "name": campaign.name,
            "sweep_id": f"{campaign.name}-{stamp}-s{uuid.uuid4().hex[:8]}",
            "fingerprint": fingerprint(campaign), "configurations": {}}  # fmt: skip


def save_state(folder: Path, state: Mapping[str, Any]) -> None:
    """Written whole to a temporary file, then renamed: a crash leaves the old or the new."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / STATE_FILE)


def _done(state: Mapping[str, Any], config: EngineConfig) -> bool:
    record = state["configurations"].get(config.name)
    return bool(record and record.get("status") in ("done", "crashed")
                and record.get("config") == _config_record(config))  # fmt: skip


def run_sweep(
    campaign: Campaign,
    out_root: Path,
    *,
    echo: Echo = print,
    resume: bool = False,
    env: Mapping[str, str] | None = None,
) -> SweepOutcome:
    """Run the plan once per configuration, then write the sweep report; see the docstring."""
    folder = sweep_folder(campaign, out_root)
    state = load_state(folder, campaign, resume)
    plan = campaign.engine.plan()
    echo(f"engine sweep {state['sweep_id']}: {len(plan)} configuration(s): "
         f"{', '.join(c.name for c in plan)}; state in {folder / STATE_FILE}")  # fmt: skip
    results: list[RunResult] = []
    save_state(folder, state)
    for config in plan:
        if resume and _done(state, config):
            echo(f"configuration {config.name}: done in an earlier try of this sweep; skipped")
            continue
        record = _run_config(campaign, config, folder, state["sweep_id"], out_root, echo, env,
                             results)  # fmt: skip
        state["configurations"][config.name] = record
        save_state(folder, state)
    ordered = {c.name: state["configurations"][c.name] for c in plan
               if c.name in state["configurations"]}  # fmt: skip
    state["configurations"] = ordered
    save_state(folder, state)
    sweep, files = write_report(state, folder, campaign.slo, env)
    if sweep is not None:
        for workload in sweep.workloads:
            for line in sweep.headlines(workload):
                echo(f"sweep {workload}: {line}")
    echo(f"sweep report: {files.get('sweep.md', folder)}")
    return SweepOutcome(folder, state, results, sweep, files)


def _run_config(
    campaign: Campaign, config: EngineConfig, folder: Path, sweep_id: str, out_root: Path,
    echo: Echo, env: Mapping[str, str] | None, results: list[RunResult],
) -> dict[str, Any]:  # fmt: skip
    """One configuration: its engine started, the plan run, the engine stopped; its record."""
    record: dict[str, Any] = {"config": _config_record(config), "status": "failed",
                              "startup_s": None, "runs": [], "error": "", "log_tail": "",
                              "started_at": time.time()}  # fmt: skip
    engine = EngineProcess(campaign.engine, config, folder / "logs")
    record["log"] = str(engine.log_path) if config.started else ""
    record["url"] = engine.url
    accelerators = config.accelerators or campaign.engine.accelerators
    record["config"]["accelerators"] = accelerators
    with engine:
        what = f"starting {engine.launch_args}" if config.started else f"using {engine.url}"
        echo(f"configuration {config.name}: {what}")
        try:
            engine.start()
        except EngineStartError as exc:
            record.update(status="failed_start", error=str(exc), log_tail=engine.log_tail())
            echo(f"configuration {config.name}: failed to start: {exc}; the sweep goes on")
            return record
        record["startup_s"] = round(engine.startup_s or 0.0, 3)
        echo(f"configuration {config.name}: ready at {engine.url} after "
             f"{record['startup_s']:.1f} s")  # fmt: skip
        facts = dataclasses.replace(campaign.engine, launch_args=engine.launch_args or None)
        run_plan = dataclasses.replace(
            campaign, target=dataclasses.replace(campaign.target, url=engine.url), engine=facts,
            accelerators=accelerators or campaign.accelerators,
        )  # fmt: skip
        tags = {"engine_config": config.name, "sweep_id": sweep_id}
        try:
            done = run_campaign(run_plan, out_root, echo=echo, tags=tags, label=config.name,
                                env=env)  # fmt: skip
        except CampaignError as exc:
            record.update(status="crashed" if engine.crashed else "failed", error=str(exc)[:2000],
                          log_tail=engine.log_tail())  # fmt: skip
            echo(f"configuration {config.name}: its run failed: {str(exc).splitlines()[0]}")
            return record
        results.extend(done)
        record["runs"] = [{"run_id": r.run_id, "run_uri": _absolute(r.run_uri),
                           "workload": r.workload.name,
                           "repeat": r.repeat, "report": str(r.out_dir)} for r in done]  # fmt: skip
        if engine.crashed:
            record.update(status="crashed", log_tail=engine.log_tail(),
                          error="the engine exited during the plan")  # fmt: skip
            echo(f"configuration {config.name}: the engine exited during its plan")
        else:
            record["status"] = "done"
    return record


def _absolute(uri: str) -> str:
    """A run's URI as the state keeps it: a local path made absolute (the sweep report may be
    built again from another folder)."""
    if "://" in uri:
        return uri
    return str(Path(uri).absolute())


def entries_of(state: Mapping[str, Any]) -> list[Any]:
    """The sweep report's entries: each configuration's first run of each workload (its
    other repeats are in the repeats reports), or one entry without a run."""
    from analysis.compare.sweep import SweepEntry

    out = []
    for name, record in state["configurations"].items():
        config = record.get("config", {})
        common = {"config": name, "args": " ".join(config.get("args") or []) or config.get("url", ""),
                  "accelerators": int(config.get("accelerators") or 0),
                  "status": record.get("status", "failed"), "startup_s": record.get("startup_s"),
                  "error": record.get("error", ""), "log_tail": record.get("log_tail", "")}  # fmt: skip
        firsts = [r for r in record.get("runs", []) if r.get("repeat", 1) == 1]
        if not firsts:
            out.append(SweepEntry(run_uri=None, **common))
        for run in firsts:
            out.append(SweepEntry(run_uri=run["run_uri"], workload=run["workload"],
                                  run_id=run["run_id"], **common))  # fmt: skip
    return out


def write_report(
    state: Mapping[str, Any], folder: Path, slo: str | None, env: Mapping[str, str] | None = None
) -> tuple[Any, dict[str, Path]]:
    """Build and write the sweep report from a state; (None, {}) when no configuration ran."""
    from analysis.compare.sweep import build_sweep
    from analysis.compare.sweep_report import write_sweep

    entries = entries_of(state)
    if not entries:
        return None, {}
    with scoped_environ(env or {}):
        sweep = build_sweep(entries, slo or None, name=str(state.get("name", "sweep")))
    return sweep, write_sweep(sweep, folder)


def sweep_failed(outcome: SweepOutcome) -> bool:
    """Whether any configuration did not complete its plan."""
    return any(r.get("status") != "done" for r in outcome.state["configurations"].values())


__all__ = ["STATE_FILE", "SweepOutcome", "load_state", "run_sweep", "write_report"]
