"""The accelerators' telemetry, read by the master during the run (docs/events.md,
"Accelerator metrics").

    telemetry = read_accelerator(store, keys)   # None when the run has none

One row per reading and GPU, ordered by time: `scraped_at_ns` (master wall clock), `gpu`
(its UUID, else `Hostname/gpu`, else the `gpu` label), then `COLUMNS`' values in DCGM's units
(NaN where the source had no such series), and `simulated` (the series carried
`simulated="true"`). Failed readings have no rows; they are counted (`failures`). Unreadable
parts or lines are skipped and named in the warnings; they never stop a report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

import pandas as pd

from analysis.kernel.layout import is_accelerator_metrics_key
from analysis.kernel.storage import ObjectStore
from analysis.read.server_metrics import scrape_records

SERIES: Final = {
    "power_w": ("DCGM_FI_DEV_POWER_USAGE",),
    "energy_mj": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),
    "util_pct": ("DCGM_FI_DEV_GPU_UTIL",),
    "fb_used_mib": ("DCGM_FI_DEV_FB_USED",),
    "fb_free_mib": ("DCGM_FI_DEV_FB_FREE",),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK",),
    "mem_clock_mhz": ("DCGM_FI_DEV_MEM_CLOCK",),
    "throttle_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP",),
}
"""Each column and the DCGM names it is read from (the first present wins)."""
COLUMNS: Final = ("scraped_at_ns", "gpu", *SERIES, "simulated")

_SERIES = re.compile(r"^([^{]+)(?:\{(.*)\})?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class AcceleratorMetrics:
    """The readings of one run; `frame` has COLUMNS, sorted by `scraped_at_ns` then `gpu`."""

    frame: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    failures: int = 0  # failed readings (an exporter that did not answer)
    sources: tuple[str, ...] = ()  # "dcgm", "nvml"

    @property
    def gpus(self) -> int:
        """The distinct GPUs the telemetry shows."""
        return int(self.frame["gpu"].nunique())

    @property
    def simulated(self) -> bool:
        return bool(self.frame["simulated"].any())


def _gpu_of(labels: dict[str, str]) -> str:
    if labels.get("UUID"):
        return labels["UUID"]
    gpu = labels.get("gpu", "")
    return f"{labels['Hostname']}/{gpu}" if labels.get("Hostname") else gpu


def _rows(at: int, values: dict[str, object]) -> list[dict[str, object]]:
    """A reading's rows: one per GPU."""
    gpus: dict[str, dict[str, object]] = {}
    for series, value in values.items():
        match = _SERIES.match(str(series))
        if match is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        row = gpus.setdefault(_gpu_of(labels), {"simulated": False})
        row["simulated"] = row["simulated"] or labels.get("simulated") == "true"
        for column, names in SERIES.items():
            if match.group(1) in names and column not in row:
                row[column] = float(value)
    return [{"scraped_at_ns": at, "gpu": gpu, **row} for gpu, row in sorted(gpus.items())]


def read_accelerator(store: ObjectStore, keys: list[str]) -> AcceleratorMetrics | None:
    """Read every `accelerator_metrics/part-*.jsonl` among `keys`; None when there is none."""
    parts = sorted(k for k in keys if is_accelerator_metrics_key(k))
    if not parts:
        return None
    rows: list[dict[str, object]] = []
    warnings: list[str] = []
    failures = 0
    sources: set[str] = set()
    for at, obj in scrape_records(store, parts, "accelerator metrics", warnings):
        values = obj.get("values") if obj.get("ok") is True else None
        if not isinstance(values, dict):
            failures += 1
            continue
        sources.add(str(obj.get("source") or "dcgm"))
        rows.extend(_rows(at, values))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame = frame.astype({"scraped_at_ns": "int64", "gpu": "str", "simulated": "bool",
                          **dict.fromkeys(SERIES, "float64")})  # fmt: skip
    frame = frame.sort_values(["scraped_at_ns", "gpu"], ignore_index=True)
    if failures:
        warnings.append(f"{failures} reading(s) of the accelerator telemetry failed: the "
                        "accelerator columns have gaps")  # fmt: skip
    return AcceleratorMetrics(frame, warnings, failures, tuple(sorted(sources)))
