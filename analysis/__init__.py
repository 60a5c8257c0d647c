"""llmload analysis: turn a run's events into metrics and reports. Never imports locust/gevent."""

from analysis.compare import Comparison, compare_runs, compare_summaries
from analysis.errors import (
    EventDataError,
    InvalidTimelineError,
    LlmloadError,
    SchemaVersionError,
    UsageError,
)
from analysis.load import Completeness, RunData, load_run
from analysis.metrics import RequestMetrics, Samples, compute_request_metrics
from analysis.report import Report, build_report, summarize_run
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
