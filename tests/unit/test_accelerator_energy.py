"""The accelerator telemetry's pieces by hand: the per-step energy, power, use and cost
(analysis/derive/energy.py) over windows computed by hand, the reading of the stored lines
(analysis/read/accelerator.py), the NVML source with a fake `pynvml`
(locustfiles/master/accelerator.py) and the simulated GPUs' model (infra/simserver/gpus.py)."""

from __future__ import annotations

import json
import math
import sys
import types
from typing import Any

import pandas as pd
import pytest

from analysis.derive.energy import ENERGY_COLUMNS, add_accelerator, energy_j
from analysis.kernel.layout import accelerator_metrics_key
from analysis.kernel.storage import open_store
from analysis.read.accelerator import COLUMNS, AcceleratorMetrics, read_accelerator
from infra.simserver.gpus import GpuConfig, SimGpus
from locustfiles.master import accelerator as source
from locustfiles.master.server_metrics import NoMetrics

S = 1_000_000_000  # ns
NAN = float("nan")


def telemetry(
    *readings: tuple[float, str, dict[str, float]], simulated: bool = False
) -> AcceleratorMetrics:
    """Readings (seconds, gpu, columns) as the reader's frame."""
    rows = [{"scraped_at_ns": int(t * S), "gpu": gpu, **values, "simulated": simulated}
            for t, gpu, values in readings]  # fmt: skip
    frame = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    frame["simulated"] = frame["simulated"].astype(bool)
    return AcceleratorMetrics(frame)


def row(start_s: float, end_s: float, tps: float = 100.0) -> dict[str, Any]:
    return {"group": "step", "window_start_ns": int(start_s * S), "window_end_ns": int(end_s * S),
            "output_tokens_per_s": tps}  # fmt: skip


def test_energy_is_the_counters_growth_interpolated_at_the_bounds_summed_over_gpus() -> None:
    # gpu a: 0 J at 0 s, 1000 J at 10 s (100 W); gpu b: 0 then 2000 J (200 W)
    t = telemetry((0, "a", {"energy_mj": 0.0, "power_w": 999.0}), (10, "a", {"energy_mj": 1e6}),
                  (0, "b", {"energy_mj": 0.0}), (10, "b", {"energy_mj": 2e6}))  # fmt: skip
    rows = [row(2, 6, tps=50)]
    assert add_accelerator(rows, t, {}) == []
    r = rows[0]
    assert r["accel_energy_j"] == pytest.approx(4 * 100 + 4 * 200)  # the counter, not power
    assert r["accel_power_w_mean"] == pytest.approx(300)
    assert r["accel_j_per_output_token"] == pytest.approx(1200 / (50 * 4))
    assert r["accelerators"] == 2 and r["accel_simulated"] is False
    assert r["output_tokens_per_s_per_accelerator"] == 25
    assert math.isnan(r["cost_per_1m_output_tokens"])


def test_without_a_counter_the_power_is_integrated_by_trapezoids() -> None:
    # 100 W at 0 s, 300 W at 4 s, 300 W at 8 s: over [2, 6] the power is 200, 300, 300 W at
    # 2, 4, 6 s: (200 + 300) / 2 * 2 + 300 * 2 = 1100 J
    t = telemetry((0, "0", {"power_w": 100.0}), (4, "0", {"power_w": 300.0}),
                  (8, "0", {"power_w": 300.0}))  # fmt: skip
    assert energy_j(t.frame, 2 * S, 6 * S) == pytest.approx(1100)
    assert math.isnan(energy_j(t.frame, 2 * S, 9 * S))  # past the last reading: not covered


def test_means_maxima_and_the_throttle_mask_over_the_readings_in_the_window() -> None:
    t = telemetry(
        (0, "0", {"util_pct": 0.0, "fb_used_mib": 100.0, "throttle_reasons": 0.0}),
        (1, "0", {"util_pct": 50.0, "fb_used_mib": 300.0, "sm_clock_mhz": 1000.0,
                  "throttle_reasons": 1.0}),  # idle: not throttled
        (1, "1", {"util_pct": 70.0, "fb_used_mib": 200.0, "sm_clock_mhz": 2000.0,
                  "throttle_reasons": 4.0}),  # a power cap (0x4): this reading is throttled
        (2, "0", {"util_pct": 90.0, "fb_used_mib": 250.0, "throttle_reasons": 5.0}),
        (3, "0", {"util_pct": 10.0, "throttle_reasons": 0.0}),
        (4, "0", {"util_pct": 100.0, "fb_used_mib": 9999.0}),
        simulated=True,
    )  # fmt: skip
    rows = [row(1, 3)]
    add_accelerator(rows, t, {"accelerators": 8, "accelerator_hour_price": 3.6})
    r = rows[0]
    assert r["accel_util_pct_mean"] == pytest.approx((50 + 70 + 90 + 10) / 4)
    assert r["accel_memory_used_mib_max"] == 300
    assert r["accel_sm_clock_mhz_mean"] == 1500
    assert r["accel_throttled_pct"] == pytest.approx(100 * 2 / 3)  # readings at 1 and 2 s of 3
    assert r["accel_simulated"] is True
    assert math.isnan(r["accel_energy_j"]) and math.isnan(r["accel_j_per_output_token"])
    assert r["accelerators"] == 8  # the option wins over the 2 GPUs seen
    assert r["cost_per_1m_output_tokens"] == pytest.approx(3.6 * 8 / 3600 / 100 * 1e6)


def test_missing_telemetry_is_nan_never_zero_and_a_price_alone_counts_one_accelerator() -> None:
    rows = [row(0, 10)]
    warnings = add_accelerator(rows, None, {"accelerator_hour_price": 2.0})
    r = rows[0]
    assert set(r) >= set(ENERGY_COLUMNS)
    assert r["accel_simulated"] is None
    for column in set(ENERGY_COLUMNS) - {"accel_simulated", "cost_per_1m_output_tokens"}:
        assert math.isnan(r[column]), column
    assert r["cost_per_1m_output_tokens"] == pytest.approx(2.0 / 3600 / 100 * 1e6)
    assert len(warnings) == 1 and "--accelerators" in warnings[0]


def test_the_reader_keeps_one_row_per_gpu_and_counts_failed_and_bad_lines(tmp_path: Any) -> None:
    store = open_store(str(tmp_path))
    values = {
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-a",gpu="0",simulated="true"}': 100.0,
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{UUID="GPU-a",gpu="0",simulated="true"}': 4,
        'DCGM_FI_DEV_POWER_USAGE{Hostname="h",gpu="1"}': 80.0,
    }
    lines = [{"scraped_at_ns": 5, "ok": True, "source": "dcgm", "values": values},
             {"scraped_at_ns": 6, "ok": False, "error": "HTTP 500"}]  # fmt: skip
    text = "".join(json.dumps(x) + "\n" for x in lines) + "not json\n"
    store.put(accelerator_metrics_key(0), text.encode())
    read = read_accelerator(store, [accelerator_metrics_key(0), "server_metrics/part-0.jsonl"])
    assert read is not None
    assert list(read.frame["gpu"]) == ["GPU-a", "h/1"] and read.gpus == 2 and read.simulated
    assert list(read.frame["power_w"]) == [100.0, 80.0]
    assert read.frame["throttle_reasons"].iloc[0] == 4 and math.isnan(read.frame["energy_mj"][0])
    assert read.failures == 1 and read.sources == ("dcgm",)
    assert any("1 unreadable line" in w for w in read.warnings)
    assert read_accelerator(store, []) is None


class _NvmlError(Exception):
    pass


def fake_pynvml(gpus: int, energy: bool = True) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    memory = types.SimpleNamespace(used=2 * 1024**3, free=6 * 1024**3)

    def power(h: int) -> int:
        return 250_000 + h  # mW

    def total_energy(h: int) -> int:
        if not energy:
            raise _NvmlError("not supported")
        return 1_000_000 * (h + 1)

    functions: dict[str, Any] = {
        "NVMLError": _NvmlError, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2,
        "NVML_TEMPERATURE_GPU": 0, "inits": [],
        "nvmlInit": lambda: nvml.inits.append("init"),
        "nvmlShutdown": lambda: nvml.inits.append("shutdown"),
        "nvmlDeviceGetCount": lambda: gpus,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTotalEnergyConsumption": total_energy,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=40 + h, memory=3),
        "nvmlDeviceGetMemoryInfo": lambda h: memory,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1800 if kind == 1 else 2600,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 1,
        "nvmlDeviceGetTemperature": lambda h, sensor: 55,
    }  # fmt: skip
    for name, value in functions.items():
        setattr(nvml, name, value)
    return nvml


def test_the_nvml_source_speaks_dcgm_names_and_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(2))
    nvml = source.load_nvml()
    line = source.scrape_nvml(nvml)
    values = line["values"]
    assert line["ok"] is True and line["source"] == "nvml"
    assert values['DCGM_FI_DEV_POWER_USAGE{gpu="1"}'] == pytest.approx(250.001)
    assert values['DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"}'] == 1e6
    assert values['DCGM_FI_DEV_GPU_UTIL{gpu="1"}'] == 41
    assert (
        values['DCGM_FI_DEV_FB_USED{gpu="0"}'] == 2048
        and values['DCGM_FI_DEV_FB_FREE{gpu="0"}'] == 6144
    )
    assert values['DCGM_FI_DEV_SM_CLOCK{gpu="0"}'] == 1800
    assert values['DCGM_FI_DEV_MEM_CLOCK{gpu="0"}'] == 2600
    assert values['DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0"}'] == 1
    assert values['DCGM_FI_DEV_GPU_TEMP{gpu="1"}'] == 55
    assert nvml.inits == ["init"]


def test_nvml_without_a_feature_leaves_it_out_and_without_a_driver_is_no_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(1, energy=False))
    values = source.nvml_values(source.load_nvml())
    assert not any("ENERGY" in k for k in values) and 'DCGM_FI_DEV_POWER_USAGE{gpu="0"}' in values
    broken = fake_pynvml(1)
    broken.nvmlInit = lambda: (_ for _ in ()).throw(_NvmlError("Driver Not Loaded"))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    with pytest.raises(NoMetrics, match="Driver Not Loaded"):
        source.load_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    with pytest.raises(NoMetrics, match="nvidia-ml-py"):
        source.load_nvml()


def test_the_simulated_gpus_count_energy_exactly_and_power_over_the_last_window() -> None:
    now = [100.0]
    gpus = SimGpus(GpuConfig(count=2, idle_w=50, peak_w=250), clock=lambda: now[0])
    now[0] = 104.0
    gpus.busy(1.0)  # 1 s busy of 4
    reading = gpus.reading(kv_reserved_tokens=8192)
    energy = reading["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy == [(0, 1000 * (50 * 4 + 200 * 1.0)), (1, 1000 * (50 * 4 + 200 * 1.0))]
    assert reading["DCGM_FI_DEV_POWER_USAGE"][0][1] == pytest.approx(50 + 200 * 0.25)
    assert reading["DCGM_FI_DEV_GPU_UTIL"][0][1] == 25
    # 8192 tokens x 128 KiB split over 2 GPUs: 512 MiB each above the base
    assert reading["DCGM_FI_DEV_FB_USED"][0][1] == 18000 + 512
    assert reading["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"][1][1] == 0
    now[0] = 106.0
    gpus.busy(2.0)  # busy all of the last 2 s
    assert gpus.reading(0)["DCGM_FI_DEV_POWER_USAGE"][0][1] == pytest.approx(250)
