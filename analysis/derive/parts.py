"""What a report's section adds to every summary row, declared once, in the derive module
that computes it.

A section of a report (docs/reports.md) shows columns of the summary rows: the open loop's
slip and cap waits, the sessions, the prefix cache, the request path. Each of those modules
declares one `RowPart`: its columns for one row, the warnings they earn, the per-request
columns it adds to requests.parquet and the run's own warnings. A part is made once per run
(`make`: what it computes over every request) and asked once per summary row.
`analysis/steps/aggregate.ROW_PARTS` lists the parts in column order; the report's sections
(`analysis/render/sections.py`) draw their tables from the same columns.

Adding a section's columns: a `Part` in the derive module that computes them, its `RowPart`
in that module, one entry in ROW_PARTS, and its `Section` (docs/architecture.md, "A new
report section").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.read.load import RunData


@dataclass(frozen=True)
class RunView:
    """What every part may compute from, once per run (per request, in the requests' order)."""

    run: RunData
    sent: np.ndarray  # send time on the master's clock (read.clocks.aligned_sent_ns)
    dropped: np.ndarray  # an open-loop arrival dropped at the cap: never sent
    ok: np.ndarray  # status ok
    ttft_s: np.ndarray
    e2e_s: np.ndarray


@dataclass(frozen=True)
class GroupView:
    """One summary row's group: the cold group, a step, or a step's model."""

    members: np.ndarray  # its sent requests whose send time is in its window
    ok: np.ndarray  # per request of the run: status ok
    step_entry: Mapping[str, Any] | None  # its step in the manifest (None: the cold group)
    rate_step: bool  # an open-loop step

    @property
    def latency(self) -> np.ndarray:
        """Its successful requests: what its latencies are over."""
        return self.members & self.ok


class Part:
    """One run's part of every summary row; by default it adds nothing."""

    def columns(self, group: GroupView) -> dict[str, Any]:
        return {}

    def warnings(self, name: str, row: Mapping[str, Any], group: GroupView) -> list[str]:
        """What the row's columns earn; `name` names the row (`step 2`)."""
        return []

    def per_request(self) -> dict[str, np.ndarray]:
        """Columns this part adds to requests.parquet (aggregate.PER_REQUEST_COLUMNS orders)."""
        return {}

    def run_warnings(self) -> list[str]:
        """Warnings about the whole run, once."""
        return []


@dataclass(frozen=True)
class RowPart:
    """A section's part of the summary rows: its name and how a run's part is made."""

    name: str
    make: Callable[[RunView], Part]
