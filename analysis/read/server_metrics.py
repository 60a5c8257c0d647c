"""The target's own metrics, scraped by the master during the run (docs/events.md).

    frame = read_server_metrics(store, keys)   # None when the run has none (no /metrics)

One row per scrape attempt, ordered by time: `scraped_at_ns` (master wall clock), `ok`,
`running`, `waiting`, `kv_cache_usage` (0..1; NaN where the server exports no such gauge
or the scrape failed), `error`. Unreadable parts or lines are skipped and named in the
returned warnings; they never stop a report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import pandas as pd

from analysis.kernel.layout import is_server_metrics_key
from analysis.kernel.storage import ObjectStore, StorageError

COUNTERS: Final = {
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
"""Counters read from the allowlisted series (`values`, summed over their labels), by
column: speculative decoding's (vLLM's names; `llmload sim --spec-draft-tokens` exports
them too). NaN in a scrape that has none."""
COLUMNS: Final = ("scraped_at_ns", "ok", "running", "waiting", "kv_cache_usage", "error",
                  *COUNTERS)  # fmt: skip
GAUGES: Final = ("running", "waiting", "kv_cache_usage")


@dataclass
class ServerMetrics:
    """The scrapes of one run; `frame` has COLUMNS, sorted by `scraped_at_ns`."""

    frame: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return int((~self.frame["ok"]).sum())

    @property
    def samples(self) -> int:
        return int(self.frame["ok"].sum())


def _number(value: object) -> float:
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else float("nan")
    )


def _counters(values: object) -> dict[str, float]:
    """COUNTERS from a scrape's `values` (`name{labels}` -> value), each summed over labels."""
    out = {column: float("nan") for column in COUNTERS}
    if not isinstance(values, dict):
        return out
    for series, value in values.items():
        name = str(series).split("{", 1)[0]
        for column, wanted in COUNTERS.items():
            if name == wanted and not math.isnan(number := _number(value)):
                out[column] = number if math.isnan(out[column]) else out[column] + number
    return out


def scrape_records(
    store: ObjectStore, parts: list[str], what: str, warnings: list[str]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each readable line of the scrape `parts` as (scraped_at_ns, record), in order.

    An unreadable part, or a part's unreadable lines, is skipped and named in `warnings`
    (`what` names the series: "server metrics", "accelerator metrics").
    """
    for key in parts:
        try:
            text = store.get(key).decode("utf-8")
        except (StorageError, OSError, UnicodeDecodeError) as exc:
            warnings.append(f"{what} part {key} could not be read (skipped): {exc}")
            continue
        bad = 0
        for line in text.splitlines():
            try:
                obj = json.loads(line)
                at = int(obj["scraped_at_ns"])
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            yield at, obj
        if bad:
            warnings.append(f"{what} part {key}: {bad} unreadable line(s) skipped")


def read_server_metrics(store: ObjectStore, keys: list[str]) -> ServerMetrics | None:
    """Read every `server_metrics/part-*.jsonl` among `keys`; None when there is none."""
    parts = sorted(k for k in keys if is_server_metrics_key(k))
    if not parts:
        return None
    rows: list[dict[str, object]] = []
    warnings: list[str] = []
    for at, obj in scrape_records(store, parts, "server metrics", warnings):
        ok = obj.get("ok") is True
        rows.append(
            {
                "scraped_at_ns": at,
                "ok": ok,
                **{g: _number(obj.get(g)) if ok else float("nan") for g in GAUGES},
                "error": None if ok else str(obj.get("error") or "unknown"),
                **_counters(obj.get("values") if ok else None),
            }
        )
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame = frame.astype({"scraped_at_ns": "int64", "ok": "bool"})
    frame = frame.sort_values("scraped_at_ns", ignore_index=True)
    metrics = ServerMetrics(frame, warnings)
    if metrics.failures:
        warnings.append(
            f"{metrics.failures} of {len(frame)} scrapes of the server's /metrics failed: "
            "the server-metrics plot has gaps"
        )
    return metrics
