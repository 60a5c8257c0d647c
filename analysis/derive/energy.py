"""Energy, power and cost per step, from the accelerators' telemetry (docs/metrics.md,
"Accelerator telemetry").

    warnings = add_accelerator(rows, run.accelerator, manifest)   # every row gains ENERGY_COLUMNS

Per summary row, over its window (`window_start_ns`..`window_end_ns`, the master's clock, as
the readings are):

- `accel_energy_j`: each GPU's energy counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ)
  read at the window's bounds, interpolated linearly between the readings around each bound
  (as speculation.py reads the server's counters), its growth summed over the GPUs; a GPU
  without the counter counts its power integrated over the window instead (trapezoids
  through the readings, the power interpolated at the bounds). NaN where no GPU's readings
  cover the window;
- `accel_power_w_mean = accel_energy_j / window_s` (all GPUs together);
- `accel_j_per_output_token = accel_energy_j / (output_tokens_per_s * window_s)`: the
  window's output tokens are its throughput times its length;
- `accel_util_pct_mean`, `accel_sm_clock_mhz_mean`: the mean over the readings in the window
  (every GPU's); `accel_memory_used_mib_max`: the most memory one GPU used in them;
- `accel_throttled_pct`: the share of the readings in the window in which some GPU's clocks
  were held down for a reason other than idling (a reasons mask with a bit other than 0x1);
- `accel_simulated`: the telemetry carried `simulated="true"` (the simulator's);
- `accelerators`: `--accelerators`, else the GPUs the telemetry shows, else NaN;
  `output_tokens_per_s_per_accelerator` the step's throughput over them;
- `cost_per_1m_output_tokens = price * accelerators / 3600 / output_tokens_per_s * 1e6`
  with `--accelerator-hour-price` (NaN without; one accelerator, with a warning, when their
  number is unknown).

The telemetry is the accelerators', so it counts all of their work in the window: this run's
requests, any other client's, anything else they ran. Missing is NaN, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.derive.speculation import value_at
from analysis.read.accelerator import AcceleratorMetrics

ENERGY_COLUMNS: Final = (
    "accelerators", "output_tokens_per_s_per_accelerator", "accel_energy_j",
    "accel_j_per_output_token", "accel_power_w_mean", "accel_util_pct_mean",
    "accel_memory_used_mib_max", "accel_sm_clock_mhz_mean", "accel_throttled_pct",
    "accel_simulated", "cost_per_1m_output_tokens",
)  # fmt: skip

IDLE_REASON: Final = 0x1  # DCGM's / NVML's "GPU idle" clocks reason: not a throttle

_NAN = float("nan")


def _gpu_energy_j(gpu: pd.DataFrame, start: float, end: float) -> float:
    """One GPU's energy over [start, end] in J: its counter's growth, else its power integrated."""
    have = gpu[gpu["energy_mj"].notna()]
    if len(have):
        t = have["scraped_at_ns"].to_numpy(np.float64)
        v = have["energy_mj"].to_numpy(np.float64)
        grown = value_at(t, v, end) - value_at(t, v, start)
        return grown / 1000.0 if grown >= 0 else _NAN  # a counter that went back: reset
    have = gpu[gpu["power_w"].notna()]
    t = have["scraped_at_ns"].to_numpy(np.float64)
    w = have["power_w"].to_numpy(np.float64)
    if len(t) == 0 or start < t[0] or end > t[-1]:
        return _NAN
    inside = (t > start) & (t < end)
    ts = np.concatenate(([start], t[inside], [end]))
    ws = np.concatenate(([value_at(t, w, start)], w[inside], [value_at(t, w, end)]))
    return float(np.sum((ws[1:] + ws[:-1]) / 2 * np.diff(ts))) / 1e9


def energy_j(frame: pd.DataFrame, start: float, end: float) -> float:
    """All GPUs' energy over [start, end] (ns), in J; NaN where none covers it."""
    per_gpu = [_gpu_energy_j(g, start, end) for _, g in frame.groupby("gpu", sort=True)]
    known = [e for e in per_gpu if not math.isnan(e)]
    return float(sum(known)) if known else _NAN


def _mean(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.mean()) if len(values) else _NAN


def _max(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.max()) if len(values) else _NAN


def _throttled_pct(window: pd.DataFrame) -> float:
    """The share of readings in which some GPU was throttled (a bit other than idle)."""
    have = window[window["throttle_reasons"].notna()]
    if not len(have):
        return _NAN
    masks = have["throttle_reasons"].astype(np.int64)
    throttled = (masks & ~IDLE_REASON) != 0
    by_reading = throttled.groupby(have["scraped_at_ns"]).any()
    return 100.0 * float(by_reading.mean())


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _NAN
    return float(value)


def accelerator_columns(
    row: Mapping[str, Any], telemetry: AcceleratorMetrics | None, accelerators: float,
    price: float,
) -> dict[str, Any]:  # fmt: skip
    """One summary row's ENERGY_COLUMNS."""
    out: dict[str, Any] = dict.fromkeys(ENERGY_COLUMNS, _NAN)
    out["accel_simulated"] = telemetry.simulated if telemetry is not None else None
    out["accelerators"] = accelerators
    tps = _number(row.get("output_tokens_per_s"))
    if tps > 0 and not math.isnan(accelerators):
        out["output_tokens_per_s_per_accelerator"] = tps / accelerators
    if price > 0 and tps > 0:
        count = 1.0 if math.isnan(accelerators) else accelerators
        out["cost_per_1m_output_tokens"] = price * count / 3600.0 / tps * 1e6
    start, end = row.get("window_start_ns"), row.get("window_end_ns")
    if telemetry is None or start is None or end is None or not end > start:
        return out
    seconds = (float(end) - float(start)) / 1e9
    frame = telemetry.frame
    energy = energy_j(frame, float(start), float(end))
    out["accel_energy_j"] = energy
    out["accel_power_w_mean"] = energy / seconds
    tokens = tps * seconds
    out["accel_j_per_output_token"] = energy / tokens if tokens > 0 else _NAN
    at = frame["scraped_at_ns"]
    window = frame[(at >= start) & (at <= end)]
    out["accel_util_pct_mean"] = _mean(window["util_pct"])
    out["accel_memory_used_mib_max"] = _max(window["fb_used_mib"])
    out["accel_sm_clock_mhz_mean"] = _mean(window["sm_clock_mhz"])
    out["accel_throttled_pct"] = _throttled_pct(window)
    return out


def add_accelerator(
    rows: list[dict[str, Any]], telemetry: AcceleratorMetrics | None, config: Mapping[str, Any]
) -> list[str]:
    """Every summary row gains ENERGY_COLUMNS (after the rest); returns the warnings.
    `config`: the run's options (the manifest's), for `accelerators` and the hour price."""
    given = _number(config.get("accelerators"))
    price = _number(config.get("accelerator_hour_price"))
    price = price if price > 0 else 0.0
    if given > 0:
        accelerators = given
    elif telemetry is not None and telemetry.gpus > 0:
        accelerators = float(telemetry.gpus)
    else:
        accelerators = _NAN
    warnings = []
    if price and math.isnan(accelerators):
        warnings.append("cost_per_1m_output_tokens counts one accelerator: their number is "
                        "unknown (no telemetry); give --accelerators")  # fmt: skip
    if telemetry is not None and telemetry.frame.empty:
        warnings.append("the accelerator telemetry holds no reading: its columns are empty")
    for row in rows:
        row.update(accelerator_columns(row, telemetry, accelerators, price))
    return warnings
