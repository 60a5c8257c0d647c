"""The server's Prometheus `/metrics` as `llmload check` sees it: one scrape, or a wait.

    scrape = read_gauge(target, url, names)        # GaugeReading(value, name, error)
    seconds = wait_until(target, url, names, lambda v: v <= baseline, timeout=5)

The parser and the gauge names are shared with the master's scraper
(`analysis/kernel/prometheus.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from analysis.kernel.prometheus import PrometheusFormatError, gauge_value, parse_prometheus
from infra.check.client import Target


@dataclass(frozen=True)
class GaugeReading:
    value: float | None
    name: str | None = None  # the metric the value came from
    error: str | None = None  # why there is no value

    @property
    def ok(self) -> bool:
        return self.value is not None


def read_gauge(
    target: Target, url: str, names: Sequence[str], timeout: float = 5.0
) -> GaugeReading:
    """The first of `names` the server exports at `url` (label sets summed)."""
    status, text, error = target.get_text(url, timeout=timeout)
    if error is not None:
        return GaugeReading(None, error=error)
    if status != 200:
        return GaugeReading(None, error=f"HTTP {status} from {url}")
    try:
        samples = parse_prometheus(text)
    except PrometheusFormatError as exc:
        return GaugeReading(None, error=f"not Prometheus text at {url} ({exc})")
    found = gauge_value(samples, names)
    if found is None:
        return GaugeReading(None, error=f"none of {', '.join(names)} at {url}")
    return GaugeReading(found[0], found[1])


def wait_until(
    target: Target,
    url: str,
    names: Sequence[str],
    predicate: Callable[[float], bool],
    timeout: float,
    poll: float = 0.05,
) -> tuple[float | None, GaugeReading]:
    """Seconds until the gauge satisfies `predicate` (None: not within `timeout`), last reading."""
    t0 = time.monotonic()
    while True:
        reading = read_gauge(target, url, names, timeout=max(1.0, min(timeout, 5.0)))
        elapsed = time.monotonic() - t0
        if reading.value is not None and predicate(reading.value):
            return elapsed, reading
        if elapsed >= timeout:
            return None, reading
        time.sleep(poll)
