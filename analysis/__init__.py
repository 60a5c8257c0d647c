"""llmload analysis: turn a run's events into metrics and reports. Never imports locust/gevent."""

from analysis.errors import (
    EventDataError,
    InvalidTimelineError,
    LlmloadError,
    SchemaVersionError,
    UsageError,
)
from analysis.metrics import RequestMetrics, Samples, compute_request_metrics
from analysis.schema import CHUNKS_SCHEMA, REQUESTS_SCHEMA, SCHEMA_VERSION

__all__ = [
    "CHUNKS_SCHEMA",
    "REQUESTS_SCHEMA",
    "SCHEMA_VERSION",
    "EventDataError",
    "InvalidTimelineError",
    "LlmloadError",
    "RequestMetrics",
    "Samples",
    "SchemaVersionError",
    "UsageError",
    "compute_request_metrics",
]
