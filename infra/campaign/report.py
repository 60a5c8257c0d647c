"""The campaign's report step: build a run's report and say what it found.

report = report_run(run_uri, out_dir, slo)        # files in out_dir, as `llmload report`
print(describe(report))                           # step table, SLO verdict, report path
"""

from __future__ import annotations

from pathlib import Path

from analysis.present import SIMULATED_BANNER, step_table
from analysis.report import Report, build_report
from analysis.report_md import md_table


def report_run(run_uri: str, out_dir: Path, slo: str) -> Report:
    return build_report(run_uri, out_dir, slo or None, html=True, progress=False)


def describe(report: Report, label: str = "") -> str:
    """What a person reads after a run: the per-step table, labelled when simulated."""
    lines = []
    heading = f"{label}run {report.run_id}"
    if report.simulated:
        lines += [f"{heading}: SIMULATED engine", SIMULATED_BANNER]
    else:
        lines.append(heading)
    lines.append(md_table(*step_table(report)))
    if report.slo.objectives:
        best = report.best_concurrency
        verdict = "FAILED" if report.slo_failed else "met"
        lines.append(
            f"SLO {verdict}; highest concurrency meeting it: {best if best is not None else 'none'}"
        )
    main = report.files.get("report.html") or report.files.get("report.md")
    lines.append(f"report: {Path(main).resolve() if main else 'not written'}")
    return "\n".join(lines)


def failing_steps(report: Report) -> list[str]:
    return [str(r["step"]) for r in report.step_rows if r["slo_pass"] is False]
