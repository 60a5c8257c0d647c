"""`build_report`: a run's events in, every report file out (the library's entry).

    report = build_report("s3://bench/runs/r1", "out/", slo="ttft_p99=0.5,tpot=0.05")

It loads (analysis.read.load), summarises (analysis.report.summary) and renders (report_md, report_html):
the renderers read a `Report`, so they sit above analysis.report.summary and this module above them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from analysis.judge.verdict import parse_limits
from analysis.kernel.errors import UsageError
from analysis.kernel.slo import Slo, parse_slo
from analysis.read.engine import (
    DEFAULT_MEMORY_LIMIT,
    Engine,
    engine_share,
    over_limit_warning,
    parse_memory_limit,
)
from analysis.read.load import load_run
from analysis.render.report_html import render_html
from analysis.render.report_md import render_markdown
from analysis.report.summary import (
    CSV_ROWS,
    Report,
    check_out_dir,
    make_out_dir,
    summarize_run,
    write_tables,
)


def build_report(
    run_uri: str,
    out_dir: str | Path,
    slo: Slo | str | None = None,
    *,
    html: bool = True,
    progress: bool = True,
    progress_stream: TextIO | None = None,
    csv_rows: int = CSV_ROWS,
    in_memory: bool = False,
    memory_limit: str = DEFAULT_MEMORY_LIMIT,
    spill_dir: str | None = None,
    by: str | None = None,
    validity: str | None = None,
    jobs: int | None = None,
    bootstrap: tuple[int, int] | None = None,
) -> Report:
    """Load the run at `run_uri`, summarise it, and write every report file into `out_dir`.

    The chunk table is read out of core by the engine (analysis/read/engine.py, DuckDB under
    `memory_limit`, spilling to `spill_dir`), not loaded; `in_memory=True` loads it and
    computes with numpy instead (the reference path: the same figures). The SLO spec is
    parsed before anything is read, so a bad spec writes nothing. `by="model"`: one summary
    row per step and model; `validity`: the verdict's limits (`--validity`, analysis/judge/verdict.py);
    `jobs`: the engine's threads (`--jobs`; default: the machine's cores), all under the one
    memory limit; `bootstrap`: (slices, seed) to keep what the bootstrap draws of each step
    (repeats: analysis/report/summary.summarize_run).
    """
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be 1 or more (the engine's threads), not {jobs}")
    slo = slo if isinstance(slo, Slo) else parse_slo(slo)
    limits = parse_limits(validity)  # a bad spec fails before anything is read, too
    memory_limit = parse_memory_limit(memory_limit)
    check_out_dir(out_dir)  # a file in the way fails before the run is read
    run = load_run(run_uri, progress=progress, progress_stream=progress_stream, chunks=in_memory,
                   requests=in_memory)  # fmt: skip
    if in_memory:
        report = summarize_run(run, slo, by=by, validity=limits)
    else:
        # the limit bounds the process: the engine gets what the process does not hold
        with Engine(engine_share(memory_limit), spill_dir, jobs, on_disk=True) as engine:
            report = summarize_run(run, slo, engine, by, limits, bootstrap)
            if not run.requests_on_disk:  # read into memory: a run not covered out of core
                warning = over_limit_warning(memory_limit, run.requests)
                if warning:
                    report.warnings.append(warning)
    out = make_out_dir(out_dir)
    files = write_tables(report, out, csv_rows)
    files["report.md"] = out / "report.md"
    files["report.md"].write_text(render_markdown(report), encoding="utf-8")
    if html:
        files["report.html"] = out / "report.html"
        files["report.html"].write_text(render_html(report), encoding="utf-8")
    report.files = files
    return report
