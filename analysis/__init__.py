"""llmload analysis: turn a run's events into metrics and reports. Never imports locust/gevent.

Rooms, each importing only from the rooms before it (tests/unit/test_import_graph.py):

    kernel  ->  read  ->  derive  ->  steps  ->  judge  ->  report  ->  render  ->  compare

The public names below are imported on first use (PEP 562), so that `import analysis.kernel.errors`
(every `llmload` command does it) does not pull in pandas, pyarrow and matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.compare.runs import Comparison, compare_runs, compare_summaries
    from analysis.derive.metrics import RequestMetrics, Samples, compute_request_metrics
    from analysis.derive.stats import DistributionSummary
    from analysis.kernel.errors import (
        EventDataError,
        InvalidTimelineError,
        LlmloadError,
        SchemaVersionError,
        UsageError,
    )
    from analysis.kernel.schema import CHUNKS_SCHEMA, REQUESTS_SCHEMA, SCHEMA_VERSION
    from analysis.kernel.slo import Slo, parse_slo
    from analysis.read.completeness import Completeness
    from analysis.read.load import RunData, load_run
    from analysis.render.build import build_report
    from analysis.report.summary import Report, summarize_run

ROOMS = ("kernel", "read", "derive", "steps", "judge", "report", "render", "compare")

__all__ = [
    "CHUNKS_SCHEMA",
    "REQUESTS_SCHEMA",
    "SCHEMA_VERSION",
    "Comparison",
    "Completeness",
    "DistributionSummary",
    "EventDataError",
    "InvalidTimelineError",
    "LlmloadError",
    "Report",
    "RequestMetrics",
    "RunData",
    "Samples",
    "SchemaVersionError",
    "Slo",
    "UsageError",
    "build_report",
    "compare_runs",
    "compare_summaries",
    "compute_request_metrics",
    "load_run",
    "parse_slo",
    "summarize_run",
]


_HOME = {
    "CHUNKS_SCHEMA": "analysis.kernel.schema",
    "Comparison": "analysis.compare.runs",
    "Completeness": "analysis.read.completeness",
    "DistributionSummary": "analysis.derive.stats",
    "EventDataError": "analysis.kernel.errors",
    "InvalidTimelineError": "analysis.kernel.errors",
    "LlmloadError": "analysis.kernel.errors",
    "REQUESTS_SCHEMA": "analysis.kernel.schema",
    "Report": "analysis.report.summary",
    "RequestMetrics": "analysis.derive.metrics",
    "RunData": "analysis.read.load",
    "SCHEMA_VERSION": "analysis.kernel.schema",
    "Samples": "analysis.derive.metrics",
    "SchemaVersionError": "analysis.kernel.errors",
    "Slo": "analysis.kernel.slo",
    "UsageError": "analysis.kernel.errors",
    "build_report": "analysis.render.build",
    "compare_runs": "analysis.compare.runs",
    "compare_summaries": "analysis.compare.runs",
    "compute_request_metrics": "analysis.derive.metrics",
    "load_run": "analysis.read.load",
    "parse_slo": "analysis.kernel.slo",
    "summarize_run": "analysis.report.summary",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
