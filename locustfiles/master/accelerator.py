"""The accelerators' telemetry during a run (`--accelerator-metrics`): power, energy, use.

    scraper = AcceleratorScraper(store, run_id, "http://gpu-host:9400/metrics", interval=2.0)
    scraper = AcceleratorScraper(store, run_id, "nvml", interval=2.0)   # this host's GPUs
    scraper.start() ... scraper.stop()

The source is a DCGM exporter's Prometheus endpoint, or NVML (`nvidia-ml-py`, imported only
then) on the master's own host. Either way each scrape becomes one JSON line of the same
shape (docs/events.md, "Accelerator metrics"): the DCGM series of `DCGM_NAMES`, keyed
`name{labels}`; NVML's carry DCGM's names and a `gpu="<index>"` label, in DCGM's units
(W, mJ, %, MiB, MHz, °C). Lines go to `<run_id>/accelerator_metrics/part-<seq>.jsonl`.

It is the server scraper's loop (locustfiles/master/server_metrics.py), with its robustness:
an exporter that cannot be reached is a warning every few failed scrapes, one that has no
DCGM series (or NVML without a driver) a warning once, and scraping stops; never a failed run.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import urllib3

from analysis.kernel.layout import accelerator_metrics_key
from analysis.kernel.storage import ObjectStore
from locustfiles.master.server_metrics import NoMetrics, ServerMetricsScraper, fetch_prometheus

log = logging.getLogger("llmload.accelerator")

NVML: Final = "nvml"
"""The --accelerator-metrics value that reads this host's GPUs through NVML."""

POWER: Final = "DCGM_FI_DEV_POWER_USAGE"  # W
ENERGY: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since boot (a counter)
UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"  # %
FB_USED: Final = "DCGM_FI_DEV_FB_USED"  # MiB
FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"  # MiB
SM_CLOCK: Final = "DCGM_FI_DEV_SM_CLOCK"  # MHz
MEM_CLOCK: Final = "DCGM_FI_DEV_MEM_CLOCK"  # MHz
THROTTLE: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"  # bitmask
CLOCKS_EVENT: Final = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"  # the same, DCGM's newer name
TEMP: Final = "DCGM_FI_DEV_GPU_TEMP"  # °C

DCGM_NAMES: Final = (POWER, ENERGY, UTIL, FB_USED, FB_FREE, SM_CLOCK, MEM_CLOCK, THROTTLE,
                     CLOCKS_EVENT, TEMP)  # fmt: skip
"""The series kept of a DCGM exporter's scrape."""

LABELS: Final = ("gpu", "UUID", "Hostname", "modelName", "simulated")
"""The labels kept of each series (DCGM adds driver versions, PCI ids, pods...)."""

_MAX_VALUES = 400  # series per line at most (40 GPUs of the ten names)


def _key(name: str, labels: Sequence[tuple[str, str]]) -> str:
    kept = [(k, v) for k, v in labels if k in LABELS]
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in kept) + "}" if kept else "")


def scrape_dcgm(
    pool: urllib3.PoolManager, url: str, headers: dict[str, str], timeout: float
) -> dict[str, Any]:
    """One scrape of a DCGM exporter as a line. Raises NoMetrics, or urllib3/OSError."""
    at_ns, elapsed_ms, samples = fetch_prometheus(pool, url, headers, timeout)
    values = {_key(s.name, s.labels): s.value for s in samples if s.name in DCGM_NAMES}
    if not values:
        raise NoMetrics("no DCGM_FI_DEV_* series (is it a DCGM exporter?)")
    return {
        "scraped_at_ns": at_ns,
        "ok": True,
        "elapsed_ms": round(elapsed_ms, 3),
        "source": "dcgm",
        "values": dict(list(values.items())[:_MAX_VALUES]),
    }


def load_nvml() -> Any:
    """pynvml, initialised; NoMetrics when it is not installed or finds no driver."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        raise NoMetrics("pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no GPU
        raise NoMetrics(f"NVML: {exc or type(exc).__name__}") from None
    return nvml


def _reading(nvml: Any) -> Callable[[Callable[[], Any]], float | None]:
    """A reader of one NVML value: None where the GPU does not support it."""
    error = getattr(nvml, "NVMLError", Exception)

    def read(call: Callable[[], Any]) -> float | None:
        try:
            return float(call())
        except (error, AttributeError, TypeError, ValueError):
            return None

    return read


def _gpu_values(
    nvml: Any, h: Any, read: Callable[[Callable[[], Any]], float | None]
) -> dict[str, float | None]:
    """One GPU's series (None where it does not support one)."""
    mib = float(1 << 20)
    memory = None
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(h)
    except getattr(nvml, "NVMLError", Exception):
        pass
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    return {
        POWER: read(lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),  # mW
        ENERGY: read(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h)),  # mJ
        UTIL: read(lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
        FB_USED: read(lambda: memory.used / mib) if memory is not None else None,
        FB_FREE: read(lambda: memory.free / mib) if memory is not None else None,
        SM_CLOCK: read(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
        MEM_CLOCK: read(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
        THROTTLE: read(lambda: reasons(h)) if reasons is not None else None,
        TEMP: read(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
    }


def nvml_values(nvml: Any) -> dict[str, float]:
    """Every GPU's series under DCGM's names and units, labelled `gpu="<index>"`."""
    read = _reading(nvml)
    values: dict[str, float] = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        series = _gpu_values(nvml, nvml.nvmlDeviceGetHandleByIndex(index), read)
        label = f'{{gpu="{index}"}}'
        values.update({name + label: v for name, v in series.items() if v is not None})
    return values


def scrape_nvml(nvml: Any) -> dict[str, Any]:
    """One reading of this host's GPUs through NVML, as a line."""
    at_ns = time.time_ns()
    t0 = time.perf_counter()
    values = nvml_values(nvml)
    if not values:
        raise NoMetrics("NVML sees no GPU")
    return {
        "scraped_at_ns": at_ns,
        "ok": True,
        "elapsed_ms": round((time.perf_counter() - t0) * 1000, 3),
        "source": NVML,
        "values": values,
    }


class AcceleratorScraper(ServerMetricsScraper):
    """The accelerators' telemetry every `interval` s, from `source` (a DCGM exporter's URL,
    or "nvml"), written as `accelerator_metrics` parts."""

    what = "accelerator metrics"
    absent_level = logging.WARNING  # asked for by name: its absence is worth a warning

    def __init__(self, store: ObjectStore, run_id: str, source: str, interval: float,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(store, run_id, source, interval, allowlist=DCGM_NAMES, **kwargs)
        self._nvml: Any = None

    @property
    def kind(self) -> str:
        """ "nvml" or "dcgm": what the manifest records beside the source."""
        return NVML if self.url == NVML else "dcgm"

    def start(self) -> None:
        if self.kind == NVML:
            try:
                self._nvml = load_nvml()
            except NoMetrics as exc:
                self.absent = str(exc)
                log.warning("llmload: no accelerator metrics from NVML (%s): not scraped", exc)
                return
        super().start()

    def stop(self) -> None:
        super().stop()
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:  # shutting down: nothing left to do about it
                log.debug("llmload: nvmlShutdown failed", exc_info=True)

    def read_line(self) -> dict[str, Any]:
        if self.kind == NVML:
            return scrape_nvml(self._nvml)
        assert self._pool is not None
        return scrape_dcgm(self._pool, self.url, self.headers, self.timeout)

    def part_key(self, seq: int) -> str:
        return accelerator_metrics_key(seq)
