"""The public surface of `analysis`, and that it never pulls in locust or gevent."""

from __future__ import annotations

import subprocess
import sys

import analysis

REPORT_API = {
    "build_report", "summarize_run", "load_run", "compare_runs", "compare_summaries",
    "parse_slo", "Report", "RunData", "Completeness", "Comparison", "Slo",
    "DistributionSummary",
}  # fmt: skip


def test_report_names_are_exported() -> None:
    assert set(analysis.__all__) >= REPORT_API
    for name in analysis.__all__:
        assert hasattr(analysis, name), name


def test_report_modules_import_no_locust_gevent_or_pyplot() -> None:
    code = (
        "import sys, analysis, analysis.report.summary, analysis.render.report_html, analysis.compare.runs, "
        "analysis.render.plots, infra.commands.report, infra.commands.compare; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('locust', 'gevent') "
        "or m == 'matplotlib.pyplot']; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
