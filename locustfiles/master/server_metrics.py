"""The target's own metrics during a run: the master scrapes Prometheus `/metrics` every few s.

    scraper = ServerMetricsScraper(store, run_id, "http://engine:8000/metrics", interval=2.0)
    scraper.start()            # a background greenlet (the master runs under gevent)
    ...
    scraper.stop()             # one last scrape, then the remaining samples are written

Each scrape becomes one JSON line (docs/events.md, "Server metrics"): the engine gauges
(running, waiting, KV-cache usage; `analysis/kernel/prometheus.py`) plus the allowlisted series.
Lines go to `<run_id>/server_metrics/part-<seq>.jsonl`, a new part every `flush_every`
seconds and at stop; keys are never overwritten.

A target without `/metrics` (404, or an answer that is not Prometheus text, or no gauge
llmload knows) turns the scraper off after one try, quietly: nothing is written. Once the
target has answered, a failed scrape is a line with `ok: false`, logged and counted; nothing
here ever raises into the run.

The scraper is the base of the accelerator telemetry's (`locustfiles/master/accelerator.py`):
a subclass names what it scrapes (`what`), reads one line (`read_line`), keys its parts
(`part_key`) and says how loudly a source without metrics is reported (`absent_level`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import urllib3

from analysis.kernel.layout import run_key, server_metrics_key
from analysis.kernel.prometheus import (
    PrometheusFormatError,
    Sample,
    allowed,
    engine_gauges,
    parse_prometheus,
)
from analysis.kernel.storage import ObjectStore
from locustfiles.request.exchange import exchange

log = logging.getLogger("llmload.server_metrics")

SPEC_DECODE_NAMES: tuple[str, ...] = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
"""Speculative decoding's counters (analysis/derive/speculation.py): vLLM exports them only
when it decodes speculatively."""

DEFAULT_ALLOWLIST: tuple[str, ...] = (
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    *SPEC_DECODE_NAMES,
    "llmload_sim_kv_cache_reserved_tokens",
    "llmload_sim_requests_cancelled_total",
    "llmload_sim_engine_lag_seconds_total",
)
"""Series kept beside the gauges (exact names, or prefixes ending in `*`)."""

_MAX_VALUES = 200  # series per line at most: an allowlist like `vllm:*` must not explode


class NoMetrics(Exception):
    """The target does not expose Prometheus metrics here."""


def fetch_prometheus(
    pool: urllib3.PoolManager, url: str, headers: dict[str, str], timeout: float
) -> tuple[int, float, list[Sample]]:
    """GET a Prometheus text page: (wall-clock ns at the start, elapsed ms, samples).

    Raises NoMetrics where the page is missing (404/405) or not Prometheus text, OSError on
    another status, or the transport's error; `timeout` bounds it all.
    """
    at_ns = time.time_ns()
    t0 = time.perf_counter()
    resp = exchange(pool, "GET", url, None, headers, timeout)
    if resp.error is not None:
        raise resp.error
    elapsed_ms = (time.perf_counter() - t0) * 1000
    if resp.status in (404, 405):
        raise NoMetrics(f"HTTP {resp.status}")
    if resp.status != 200:
        raise OSError(f"HTTP {resp.status}")
    try:
        samples = parse_prometheus(resp.data.decode("utf-8", "replace"))
    except PrometheusFormatError as exc:
        raise NoMetrics(f"not Prometheus text: {exc}") from None
    return at_ns, elapsed_ms, samples


def scrape_once(
    pool: urllib3.PoolManager,
    url: str,
    headers: dict[str, str],
    timeout: float,
    allowlist: Sequence[str] = DEFAULT_ALLOWLIST,
) -> dict[str, Any]:
    """One scrape as a JSON-able line. Raises NoMetrics, or urllib3/OSError on failure."""
    at_ns, elapsed_ms, samples = fetch_prometheus(pool, url, headers, timeout)
    gauges = engine_gauges(samples)
    if gauges.empty:
        raise NoMetrics("no running/waiting/KV-cache gauge")
    values = {s.key: s.value for s in samples if allowed(s.name, allowlist)}
    return {
        "scraped_at_ns": at_ns,
        "ok": True,
        "elapsed_ms": round(elapsed_ms, 3),
        "running": gauges.running,
        "waiting": gauges.waiting,
        "kv_cache_usage": gauges.kv_cache_usage,
        "sources": dict(gauges.sources),
        "values": dict(list(values.items())[:_MAX_VALUES]),
    }


class ServerMetricsScraper:
    """Scrapes `url` every `interval` seconds in a greenlet; writes JSONL parts to `store`."""

    what = "server metrics"  # in log lines
    absent_level = logging.INFO  # a target without /metrics: said once, quietly

    def __init__(
        self,
        store: ObjectStore,
        run_id: str,
        url: str,
        interval: float,
        *,
        headers: dict[str, str] | None = None,
        allowlist: Sequence[str] = DEFAULT_ALLOWLIST,
        flush_every: float = 30.0,
        timeout: float | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.url = url
        self.interval = interval
        self.headers = dict(headers or {})
        self.allowlist = tuple(allowlist)
        self.flush_every = flush_every
        self.timeout = timeout if timeout is not None else max(1.0, min(interval, 5.0))
        self.samples = 0  # successful scrapes
        self.failures = 0  # failed scrapes after the target first answered
        self.parts = 0
        self.absent: str | None = None  # why the target has no metrics (scraping off)
        self._lines: list[dict[str, Any]] = []
        self._answered = False
        self._write_failure: str | None = None  # why the latest part write failed
        self._last_flush = time.monotonic()
        self._greenlet: Any = None
        self._stopping: Any = None
        self._pool: urllib3.PoolManager | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        import gevent
        import gevent.event

        self._pool = urllib3.PoolManager(num_pools=2, maxsize=1, retries=False)
        self._stopping = gevent.event.Event()
        self._greenlet = gevent.spawn(self._loop)

    def stop(self) -> None:
        """Stop the loop, take a last sample (the run's end), write what is left."""
        greenlet, self._greenlet = self._greenlet, None  # once, also if called again meanwhile
        if greenlet is not None:
            self._stopping.set()
            greenlet.join(self.timeout + 5)  # a scrape or a part write in progress
            greenlet.kill(block=True, timeout=1)
            if self.absent is None:
                self.scrape()
            self.flush()
        if self.samples or self.failures:
            log.info(
                "llmload: %s: %d sample(s), %d failed scrape(s), %d part(s)",
                self.what,
                self.samples,
                self.failures,
                self.parts,
            )

    def _loop(self) -> None:
        next_at = time.monotonic()
        while self.absent is None and not self._stopping.is_set():
            self.scrape()
            if time.monotonic() - self._last_flush >= self.flush_every:
                self.flush()
            next_at = max(next_at + self.interval, time.monotonic())  # late: no catching up
            self._stopping.wait(max(0.0, next_at - time.monotonic()))

    # -- work --------------------------------------------------------------------------
    def read_line(self) -> dict[str, Any]:
        """One scrape as a line; raises NoMetrics, or anything else on a failed scrape."""
        assert self._pool is not None
        return scrape_once(self._pool, self.url, self.headers, self.timeout, self.allowlist)

    def part_key(self, seq: int) -> str:
        """The run-relative key of part `seq`."""
        return server_metrics_key(seq)

    def scrape(self) -> None:
        """One attempt; never raises."""
        try:
            line = self.read_line()
        except NoMetrics as exc:
            if not self._answered:
                self.absent = str(exc)
                log.log(self.absent_level, "llmload: no %s at %s (%s): not scraped",
                        self.what, self.url, exc)  # fmt: skip
                return
            self._failed(str(exc))
            return
        except Exception as exc:  # scraping must never disturb the run: recorded, counted
            self._failed(f"{type(exc).__name__}: {str(exc)[:160]}")
            return
        self._answered = True
        self.samples += 1
        self._lines.append(line)

    def _failed(self, error: str) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 10 == 0:
            log.warning(
                "llmload: %s scrape of %s failed (%d so far): %s",
                self.what,
                self.url,
                self.failures,
                error,
            )
        self._lines.append({"scraped_at_ns": time.time_ns(), "ok": False, "error": error})

    def flush(self) -> None:
        """Write the buffered lines as the next part (only once the target has answered)."""
        self._last_flush = time.monotonic()
        if not self._lines or not self._answered:
            return
        lines, self._lines = self._lines, []
        data = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()
        key = run_key(self.run_id, self.part_key(self.parts))
        try:
            self.store.put(key, data)
            self.parts += 1
        except Exception as exc:  # a store outage keeps these samples for the next try
            reason = (str(exc) or type(exc).__name__)[:200]
            log.debug("llmload: %s write failed", self.what, exc_info=True)
            if reason != self._write_failure:  # once per cause, not at every flush
                log.error("llmload: could not write %s part %s (%s); its samples are kept "
                          "and written with the next part", self.what, key, reason)  # fmt: skip
            self._write_failure = reason
            self._lines = lines + self._lines
        else:
            self._write_failure = None
