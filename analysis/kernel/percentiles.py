"""The statistics every distribution summary reports, by name (column suffixes, SLO keys).

The runtime's live views and the SLO grammar use these names; `analysis.derive.stats`
computes them. No numpy, no pandas.
"""

from __future__ import annotations

from typing import Final

PERCENTILES: Final = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p999": 0.999}
"""Named percentiles of every DistributionSummary, in report order."""

STATS: Final = ("mean", *PERCENTILES, "max")
"""The statistics a summary reports for a metric (column suffixes in summary.csv)."""
