"""The library entry: a run's events in, percentile reports per step out.

    report = build_report("s3://bench/runs/r1", "out/", slo="ttft_p99=0.5,tpot=0.05")  # analysis.render.build
    report.summary            # one row per step (+ the cold group), columns as in docs/reports.md
    report.sessions           # one row per session (None: the run has no sessions)
    report.slo_failed, report.best_concurrency, report.best_rate, report.search
    report.warnings, report.files

Without an SLO of its own the report judges by the run's (`--slo` recorded in the manifest's
config), and says so (`slo_source`).

`summarize_run` does the computing without writing anything (compare uses it).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from analysis.derive.chunkfacts import EngineChunkFacts, MemoryChunkFacts, by_folder
from analysis.derive.energy import add_accelerator
from analysis.derive.metrics import (
    RequestMetrics,
    Samples,
    compute_request_metrics,
    request_timing,
    with_chunk_metrics,
)
from analysis.derive.speculation import add_speculation
from analysis.judge.search import SearchSummary, summarize_search
from analysis.judge.stopping import stopped_info
from analysis.judge.verdict import Limits, Verdict, judge_run, parse_limits
from analysis.kernel.errors import UsageError
from analysis.kernel.slo import Slo, parse_slo
from analysis.read.accelerator import AcceleratorMetrics
from analysis.read.clocks import clock_warnings
from analysis.read.completeness import Completeness
from analysis.read.engine import Engine
from analysis.read.load import RunData, read_requests
from analysis.read.server_metrics import ServerMetrics
from analysis.steps.aggregate import StepTable, aggregate_steps
from analysis.steps.outofcore import (
    DiskStep,
    bootstrap_steps,
    covers,
    engine_steps,
    write_requests,
    write_sessions,
)

SUMMARY_SCHEMA_VERSION: Final = "1.6"
"""Version of summary.json (and the summary.csv columns); major changes break readers."""

SUMMARY_KIND: Final = "llmload.summary"

_RUN_FIELDS = ("run_id", "status", "created_at", "ended_at", "target", "versions", "hosts")
_RUN_FIELDS_MORE = ("workers", "config", "cold_start", "steps", "hardware")


@dataclass
class Report:
    """Everything a report shows; `files` names what build_report wrote."""

    run_id: str
    run_uri: str
    manifest: dict[str, Any]
    completeness: Completeness
    slo: Slo
    table: StepTable
    warnings: list[str]
    files: dict[str, Path] = field(default_factory=dict)
    server_metrics: ServerMetrics | None = None  # the target's /metrics during the run
    accelerator: AcceleratorMetrics | None = None  # the accelerators' telemetry (its readings)
    slo_source: str = "option"  # "option" (given to the report) or "run" (the run's own --slo)
    search: SearchSummary | None = None  # the run's capacity search, verdicts checked exactly
    itl: Samples | None = None  # per-token ITL samples (None: summarised out of core)
    verdict: Verdict | None = None  # the validity verdict (analysis/judge/verdict.py)
    disk_steps: dict[int, DiskStep] | None = None
    """Out of core: what the bootstrap draws of each step row (by position; bootstrap_steps),
    when asked for (compare, repeats); None in memory."""

    @property
    def summary(self) -> pd.DataFrame:
        """summary.csv: the step rows, each with the run's verdict (`run_verdict`)."""
        frame = self.table.frame
        if self.verdict is not None:
            frame["run_verdict"] = self.verdict.verdict
        return frame

    @property
    def notes(self) -> list[str]:
        """What stayed below every limit (summary.json `notes`): not warnings."""
        return self.verdict.notes if self.verdict is not None else []

    @property
    def per_request(self) -> pd.DataFrame:
        return self.table.per_request

    @property
    def sessions(self) -> pd.DataFrame | None:
        """One row per session (sessions.csv); None when the run has no sessions."""
        if self.table.sessions is not None:
            return self.table.sessions.frame
        if self.table.sessions_file is not None:  # the engine's path: read back when asked
            return pq.read_table(self.table.sessions_file).to_pandas()
        return None

    @property
    def turns(self) -> list[dict[str, Any]]:
        """The by-turn table (summary.json `turns`); empty when the run has no sessions."""
        return self.table.turns

    @property
    def simulated(self) -> bool:
        return bool((self.manifest.get("target") or {}).get("simulated"))

    @property
    def step_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.table.rows if r["group"] == "step"]

    @property
    def slo_failed(self) -> bool:
        return any(r["slo_pass"] is False for r in self.step_rows)

    @property
    def open_loop(self) -> bool:
        """The run has rate (open-loop) steps."""
        return any(r.get("mode") == "rate" for r in self.step_rows)

    @property
    def best_concurrency(self) -> int | None:
        """The highest concurrency whose step meets every SLO objective (None: none or no SLO).

        Concurrency steps only: a rate step's `concurrency` is its cap, not a load level."""
        passing = [int(r["concurrency"]) for r in self._passing_steps() if r.get("mode") != "rate"]
        return max(passing) if passing else None

    def _passing_steps(self) -> list[dict[str, Any]]:
        """One row per step that meets the SLO: with `--by model` a step has a row per model,
        and it passes only when every model's row does (each model is served by the step)."""
        by_step: dict[Any, list[dict[str, Any]]] = {}
        for row in self.step_rows:
            by_step.setdefault(row["step"], []).append(row)
        return [rows[0] for rows in by_step.values() if all(r["slo_pass"] is True for r in rows)]

    @property
    def best_rate(self) -> float | None:
        """The highest intended rate (requests/s) whose rate step meets every SLO objective
        (None: no rate step meets it, no SLO, or a concurrency run)."""
        passing = [
            float(r["rate"])
            for r in self._passing_steps()
            if r.get("mode") == "rate" and r.get("rate") is not None
        ]
        return max(passing) if passing else None

    def run_metadata(self) -> dict[str, Any]:
        meta = {k: self.manifest.get(k) for k in (*_RUN_FIELDS, *_RUN_FIELDS_MORE)}
        meta["run_id"] = self.run_id
        return meta

    def to_json(self) -> dict[str, Any]:
        """summary.json: schema version, run metadata, completeness, SLO, warnings, steps,
        turns."""
        return jsonable(
            {
                "schema_version": SUMMARY_SCHEMA_VERSION,
                "kind": SUMMARY_KIND,
                "run_id": self.run_id,
                "run_uri": self.run_uri,
                "simulated": self.simulated,
                "run": self.run_metadata(),
                "completeness": self.completeness.to_dict(),
                "slo": {
                    **self.slo.to_dict(),
                    "failed": self.slo_failed if self.slo.objectives else None,
                    "best_concurrency": self.best_concurrency,
                    "best_rate": self.best_rate,
                    "source": self.slo_source if self.slo else None,
                },
                "search": self.search.to_dict() if self.search is not None else None,
                "stopped": stopped_info(self.manifest),
                "verdict": self.verdict.to_dict() if self.verdict is not None else None,
                "warnings": self.warnings,
                "notes": self.notes,
                "steps": self.table.rows,
                "turns": self.table.turns,
            }
        )


def jsonable(value: Any) -> Any:
    """NaN and pandas/numpy scalars made JSON-safe (NaN -> null: missing, never 0)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_slo(manifest: dict[str, Any]) -> str:
    """The SLO the run itself was given (`--slo`, manifest config `slo`); "" when none."""
    spec = (manifest.get("config") or {}).get("slo")
    return spec.strip() if isinstance(spec, str) else ""


def _choose_slo(slo: Slo, manifest: dict[str, Any], warnings: list[str]) -> tuple[Slo, str]:
    """The report's SLO: the one given, else the run's own; and where it came from."""
    spec = run_slo(manifest)
    if slo or not spec:
        return slo, "option"
    try:
        return parse_slo(spec), "run"
    except UsageError as exc:
        warnings.append(f"the run's own SLO {spec!r} cannot be read ({exc}); give --slo")
        return slo, "option"


def summarize_run(
    run: RunData,
    slo: Slo | str | None = None,
    engine: Engine | None = None,
    by: str | None = None,
    validity: Limits | str | None = None,
    bootstrap: tuple[int, int] | None = None,
    requests_file: bool = True,
) -> Report:
    """Compute the per-request metrics and the per-step summary of a loaded run.

    Without an SLO (None or empty) the run's own `--slo` is used when its manifest has one.
    A run loaded without its chunks (`load_run(..., chunks=False)`) is summarised out of core
    by `engine` (analysis/read/engine.py; one with the default memory limit when None).
    `by="model"`: one summary row per step and model (analysis.steps.aggregate.BY_CHOICES).
    `validity`: the limits of the validity verdict (`--validity`, analysis/judge/verdict.py).
    `bootstrap`: (slices, seed) when the run's steps are to be resampled (compare, repeats):
    a run summarised out of core keeps what the bootstrap draws of each step (`disk_steps`).
    `requests_file=False`: out of core, requests.parquet is not written (compare's summaries).
    """
    slo = slo if isinstance(slo, Slo) else parse_slo(slo)
    limits = validity if isinstance(validity, Limits) else parse_limits(validity)
    saturation = (limits["cpu"], limits["lag_ms"])
    warnings: list[str] = [*run.warnings]
    slo, slo_source = _choose_slo(slo, run.manifest, warnings)
    if run.requests_on_disk:
        with contextlib.ExitStack() as stack:
            if engine is None:
                engine = stack.enter_context(Engine(on_disk=True))
            if covers(run):
                report = _summarize_on_disk(run, slo, slo_source, engine, by, limits, warnings,
                                            requests_file)  # fmt: skip
                if bootstrap is not None:
                    report.disk_steps = bootstrap_steps(engine, run, report.table, slo,
                                                        *bootstrap)  # fmt: skip
                return report
        read_requests(run)  # not covered out of core yet: the in-memory request path
    if run.chunks is not None:
        metrics = compute_request_metrics(run.requests, run.chunks)
        table = aggregate_steps(run, metrics, slo, MemoryChunkFacts(metrics, run.requests,
                                run.chunks), by, saturation)  # fmt: skip
    else:
        with contextlib.ExitStack() as stack:
            if engine is None:
                engine = stack.enter_context(Engine())
            batches = by_folder(run.chunk_paths or [])  # one worker's parts at a time
            facts = EngineChunkFacts(engine, run.requests, batches, run.chunk_filesystem)
            timing = request_timing(run.requests)
            per_request = with_chunk_metrics(timing, facts.per_request)
            metrics = RequestMetrics(per_request, None, None, facts.orphan_chunks)
            table = aggregate_steps(run, metrics, slo, facts, by, saturation)
    return _report(run, slo, slo_source, table, limits, warnings, metrics.itl)


def _summarize_on_disk(
    run: RunData, slo: Slo, slo_source: str, engine: Engine, by: str | None, limits: Limits,
    warnings: list[str], requests_file: bool = True,
) -> Report:  # fmt: skip
    """summarize_run of a run whose request rows stay on disk (analysis/steps/outofcore.py);
    requests.parquet is written by the engine into a folder of the report's own, which
    write_tables moves into the output folder."""
    saturation = (limits["cpu"], limits["lag_ms"])
    table = engine_steps(run, engine, slo, by, saturation)
    folder = tempfile.mkdtemp(prefix="llmload-requests-", dir=engine.spill_root)
    table.requests_file = Path(folder) / "requests.parquet"
    report = _report(run, slo, slo_source, table, limits, warnings, None)
    # removed with the report: write_tables moves the file out of it first
    weakref.finalize(report, shutil.rmtree, folder, True)
    if not requests_file:
        table.requests_file = None
        return report
    write_requests(engine, table.requests_file, slo, table.answers_checked)
    if table.sessions_on_disk:
        table.sessions_file = Path(folder) / "sessions.parquet"
        write_sessions(engine, table.sessions_file)
    return report


def _report(
    run: RunData, slo: Slo, slo_source: str, table: StepTable, limits: Limits,
    warnings: list[str], itl: Samples | None,
) -> Report:  # fmt: skip
    warnings.extend(table.warnings)
    warnings.extend(clock_warnings(run.manifest))
    if run.request_rows == 0:
        warnings.append("the run holds no request rows: there is nothing to summarise")
    add_speculation(table.rows, run.server_metrics)  # the server's own counters, per step
    config = run.manifest.get("config") or {}
    warnings.extend(add_accelerator(table.rows, run.accelerator, config))  # energy, cost
    report = Report(run.run_id, run.uri, run.manifest, run.completeness, slo, table, warnings)
    report.server_metrics = run.server_metrics
    report.accelerator = run.accelerator
    report.slo_source = slo_source
    report.verdict = judge_run(table.rows, run.manifest, run.completeness, limits, warnings)
    report.itl = itl
    report.search = summarize_search(run.manifest, table, slo)
    if report.search is not None:
        warnings.extend(report.search.warnings)
    if report.simulated:
        warnings.insert(0, "the target was SIMULATED: these numbers are not inference performance")
    return report


CSV_ROWS: Final = 1_000_000
"""requests.csv is written up to this many requests (`--csv-rows`; 0: always): a CSV of
millions of rows is slower to write than the whole report and opened by nothing;
requests.parquet holds every request whatever the size."""


def write_tables(report: Report, out_dir: Path, csv_rows: int = CSV_ROWS) -> dict[str, Path]:
    """requests.parquet, requests.csv (up to `csv_rows` requests, 0: always), summary.csv,
    summary.json; sessions.parquet and sessions.csv when the run has sessions."""
    files = {
        "requests.parquet": out_dir / "requests.parquet",
        "summary.csv": out_dir / "summary.csv",
        "summary.json": out_dir / "summary.json",
    }
    written = report.table.requests_file
    if written is not None and written != files["requests.parquet"]:  # the engine's path
        shutil.move(written, files["requests.parquet"])
        report.table.requests_file = files["requests.parquet"]
        rows = report.table.request_rows
    else:
        table = pa.Table.from_pandas(report.per_request, preserve_index=False)
        pq.write_table(table, files["requests.parquet"])
        rows = len(table)
    if csv_rows and rows > csv_rows:
        report.warnings.append(
            f"requests.csv not written: {rows:,} requests are more than --csv-rows "
            f"{csv_rows:,}; requests.parquet holds them all (or give --csv-rows 0 to write the "
            "CSV anyway)"
        )
        (out_dir / "requests.csv").unlink(missing_ok=True)  # not a stale one of an earlier run
    else:
        files["requests.csv"] = out_dir / "requests.csv"
        _csv_of(files["requests.parquet"], files["requests.csv"])
    report.summary.to_csv(files["summary.csv"], index=False, na_rep="")
    on_disk = report.table.sessions_file
    if on_disk is not None:  # the engine's path: moved, and its CSV streamed from it
        files["sessions.parquet"] = out_dir / "sessions.parquet"
        files["sessions.csv"] = out_dir / "sessions.csv"
        if on_disk != files["sessions.parquet"]:
            shutil.move(on_disk, files["sessions.parquet"])
            report.table.sessions_file = files["sessions.parquet"]
        _csv_of(files["sessions.parquet"], files["sessions.csv"])
    elif report.sessions is not None:
        files["sessions.parquet"] = out_dir / "sessions.parquet"
        files["sessions.csv"] = out_dir / "sessions.csv"
        sessions = pa.Table.from_pandas(report.sessions, preserve_index=False)
        pq.write_table(sessions, files["sessions.parquet"])
        pacsv.write_csv(sessions, files["sessions.csv"])
    text = json.dumps(report.to_json(), indent=2, allow_nan=False)
    files["summary.json"].write_text(text + "\n", encoding="utf-8")
    return files


def _csv_of(parquet: Path, csv: Path) -> None:
    """A Parquet file's rows as CSV, streamed a batch at a time."""
    source = pq.ParquetFile(parquet)
    with pacsv.CSVWriter(csv, source.schema_arrow) as writer:
        for batch in source.iter_batches(batch_size=65_536):
            writer.write_batch(batch)


def check_out_dir(out_dir: str | Path) -> None:
    """Refuse, before any work, an output directory that is a file already (UsageError)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"cannot create the output directory {out} (a file of that name exists); "
            "give a folder as --out"
        )


def make_out_dir(out_dir: str | Path) -> Path:
    """Create an output directory; UsageError naming `--out` when it cannot be created."""
    check_out_dir(out_dir)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the output directory {out} ({exc.strerror}); give a writable --out"
        ) from None
    return out
