"""llmload analysis: turn a run's events into metrics and reports. Never imports locust/gevent.

The public names below are imported on first use (PEP 562), so that `import analysis.errors`
(every `llmload` command does it) does not pull in pandas, pyarrow and matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.build import build_report
    from analysis.compare import Comparison, compare_runs, compare_summaries
    from analysis.completeness import Completeness
    from analysis.errors import (
        EventDataError,
        InvalidTimelineError,
        LlmloadError,
        SchemaVersionError,
        UsageError,
    )
    from analysis.load import RunData, load_run
    from analysis.metrics import RequestMetrics, Samples, compute_request_metrics
    from analysis.report import Report, summarize_run
    from analysis.schema import CHUNKS_SCHEMA, REQUESTS_SCHEMA, SCHEMA_VERSION
    from analysis.slo import Slo, parse_slo
    from analysis.stats import DistributionSummary

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
    "CHUNKS_SCHEMA": "analysis.schema",
    "Comparison": "analysis.compare",
    "Completeness": "analysis.completeness",
    "DistributionSummary": "analysis.stats",
    "EventDataError": "analysis.errors",
    "InvalidTimelineError": "analysis.errors",
    "LlmloadError": "analysis.errors",
    "REQUESTS_SCHEMA": "analysis.schema",
    "Report": "analysis.report",
    "RequestMetrics": "analysis.metrics",
    "RunData": "analysis.load",
    "SCHEMA_VERSION": "analysis.schema",
    "Samples": "analysis.metrics",
    "SchemaVersionError": "analysis.errors",
    "Slo": "analysis.slo",
    "UsageError": "analysis.errors",
    "build_report": "analysis.build",
    "compare_runs": "analysis.compare",
    "compare_summaries": "analysis.compare",
    "compute_request_metrics": "analysis.metrics",
    "load_run": "analysis.load",
    "parse_slo": "analysis.slo",
    "summarize_run": "analysis.report",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
