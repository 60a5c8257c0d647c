"""Simulated GPUs: DCGM-like telemetry that follows the engine's load (`GET /metrics`).

    gpus = SimGpus(GpuConfig(count=2), clock=time.monotonic)
    gpus.busy(0.012)                       # the engine ran a step of 12 ms
    gpus.reading(kv_reserved_tokens=4096)  # {"DCGM_FI_DEV_POWER_USAGE": 212.0, ...} per GPU

Each of the `count` GPUs serves the one engine (tensor parallel): all are busy while it runs
a step. A GPU draws `idle_w + (peak_w - idle_w)` while busy and `idle_w` while not, so its
energy counter (mJ, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) since the server started is
exactly `idle_w * elapsed + (peak_w - idle_w) * busy_seconds`, and the power gauge is the
mean draw over the last second or so (`WINDOW_S`, measured between readings). Utilisation
is the busy share of that window; device memory a base plus the KV cache's reserved tokens
(split over the GPUs); the SM clock and the temperature rise with the busy share; the
throttle reasons stay 0. Every series carries `simulated="true"` (docs/simserver.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 1.0  # the power and utilisation gauges: the mean over at least this long


@dataclass(frozen=True)
class GpuConfig:
    """The simulated GPUs (`llmload sim --sim-gpus N --gpu-idle-watts W --gpu-peak-watts W`)."""

    count: int = 1
    idle_w: float = 60.0
    peak_w: float = 350.0
    memory_mib: float = 81559.0  # an 80 GB card
    base_mib: float = 18000.0  # weights, activations, the runtime
    kv_bytes_per_token: float = 131072.0  # 128 KiB: an 8B model's KV per token (fp16)
    idle_sm_mhz: float = 345.0
    peak_sm_mhz: float = 1980.0
    mem_mhz: float = 2619.0
    idle_temp_c: float = 32.0
    peak_temp_c: float = 68.0


class SimGpus:
    """The GPUs' state: the engine's busy time, and the readings taken of it."""

    def __init__(self, config: GpuConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.started = clock()
        self.busy_s = 0.0  # time the engine spent in steps
        self._readings: deque[tuple[float, float]] = deque([(self.started, 0.0)])

    def busy(self, seconds: float) -> None:
        """The engine ran a step this long."""
        self.busy_s += seconds

    def energy_mj(self, now: float) -> float:
        """Each GPU's energy since the server started, in mJ."""
        c = self.config
        busy = min(self.busy_s, now - self.started)
        return 1000.0 * (c.idle_w * (now - self.started) + (c.peak_w - c.idle_w) * busy)

    def busy_share(self, now: float) -> float:
        """The busy share since the oldest reading kept (at least WINDOW_S ago when there is
        one that old), 0..1."""
        readings = self._readings
        readings.append((now, self.busy_s))
        while len(readings) > 2 and now - readings[1][0] >= WINDOW_S:
            readings.popleft()
        then, busy_then = readings[0]
        if now <= then:
            return 0.0
        return min(1.0, max(0.0, (self.busy_s - busy_then) / (now - then)))

    def reading(self, kv_reserved_tokens: int) -> dict[str, list[tuple[int, float]]]:
        """Each DCGM series: [(gpu index, value)] for every GPU."""
        c, now = self.config, self.clock()
        share = self.busy_share(now)
        used = c.base_mib + kv_reserved_tokens * c.kv_bytes_per_token / c.count / (1 << 20)
        used = min(used, c.memory_mib)
        one = {
            "DCGM_FI_DEV_POWER_USAGE": c.idle_w + (c.peak_w - c.idle_w) * share,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy_mj(now),
            "DCGM_FI_DEV_GPU_UTIL": round(100.0 * share),
            "DCGM_FI_DEV_FB_USED": round(used),
            "DCGM_FI_DEV_FB_FREE": round(c.memory_mib - used),
            "DCGM_FI_DEV_SM_CLOCK": round(c.idle_sm_mhz + (c.peak_sm_mhz - c.idle_sm_mhz) * share),
            "DCGM_FI_DEV_MEM_CLOCK": c.mem_mhz,
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0,
            "DCGM_FI_DEV_GPU_TEMP": round(c.idle_temp_c + (c.peak_temp_c - c.idle_temp_c) * share),
        }
        return {name: [(i, float(v)) for i in range(c.count)] for name, v in one.items()}
