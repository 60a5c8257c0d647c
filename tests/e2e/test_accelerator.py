"""Accelerator telemetry on the client's timeline: `--accelerator-metrics` pointed at the
simulator's /metrics (its DCGM-like series of `--sim-gpus 2`, labelled simulated="true"),
read by the master during a real master/worker run. The step's energy, power, utilisation,
memory and cost follow the simulator's power model and its own energy counter; an exporter
that cannot be reached is a warning, and the run still ends with its report."""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import pytest

from analysis import build_report
from analysis.derive.energy import ENERGY_COLUMNS
from infra.ports import free_port
from tests.support.chat import run_locust, start_sim

GPUS, IDLE_W, PEAK_W, PRICE = 2, 60.0, 350.0, 2.5
SHORT = ("--steps", "4", "--step-duration", "4", "--step-warmup", "1", "--cold-requests", "0",
         "--workload", "D(16,32)", "--scrape-interval", "0.5")  # fmt: skip


def sim_energy_j(url: str) -> float:
    """The simulator's own energy counters, all GPUs, in J."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) / 1000 for line in text.splitlines()
               if line.startswith("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{"))  # fmt: skip


def test_energy_power_and_cost_per_step_follow_the_simulated_gpus(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", "--sim-gpus", str(GPUS)) as sim:
        before = sim_energy_j(sim.url)
        result = run_locust(sim.url, tmp_path / "runs", *SHORT, "--accelerator-metrics",
                            f"{sim.url}/metrics", "--accelerator-hour-price", str(PRICE),
                            workers=1)  # fmt: skip
        after = sim_energy_j(sim.url)
    assert result.returncode == 0, result.output[-3000:]
    _, _, manifest = result.events()
    assert manifest["accelerator"]["kind"] == "dcgm" and manifest["accelerator"]["samples"] > 5
    assert list((result.run_dir() / "accelerator_metrics").glob("part-*.jsonl"))
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=True)
    (row,) = [r for r in report.step_rows if r["group"] == "step"]
    assert set(ENERGY_COLUMNS) <= set(row)
    assert row["accelerators"] == GPUS and row["accel_simulated"] is True
    window_s = row["window_s"]
    energy = row["accel_energy_j"]
    # between all GPUs idle and all at peak, and within what the simulator counted in all
    assert GPUS * IDLE_W * window_s * 0.98 < energy < GPUS * PEAK_W * window_s
    assert energy < after - before
    assert row["accel_power_w_mean"] == pytest.approx(energy / window_s)
    tokens = row["output_tokens_per_s"] * window_s
    assert row["accel_j_per_output_token"] == pytest.approx(energy / tokens)
    # the simulator's model: power = idle + (peak - idle) x busy share, per GPU
    util = row["accel_util_pct_mean"]
    assert 5 < util <= 100
    modelled = GPUS * (IDLE_W + (PEAK_W - IDLE_W) * util / 100)
    assert row["accel_power_w_mean"] == pytest.approx(modelled, rel=0.15)
    assert row["accel_memory_used_mib_max"] > 18000 and row["accel_sm_clock_mhz_mean"] > 345
    assert row["accel_throttled_pct"] == 0
    assert row["output_tokens_per_s_per_accelerator"] == pytest.approx(
        row["output_tokens_per_s"] / GPUS
    )
    assert row["cost_per_1m_output_tokens"] == pytest.approx(
        PRICE * GPUS / 3600 / row["output_tokens_per_s"] * 1e6
    )
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["steps"][-1]["accel_simulated"] is True
    markdown = (tmp_path / "report" / "report.md").read_text()
    section = markdown.split("## Accelerator", 1)[1].split("\n## ", 1)[0]
    assert "SIMULATED" in section and "J/token" in section
    assert 'id="plot-accelerator"' in (tmp_path / "report" / "report.html").read_text()


def test_an_unreachable_exporter_is_a_warning_and_the_run_still_reports(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--steps", "2", "--step-duration", "2",
                            "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(8,8)",
                            "--scrape-interval", "0.5", "--accelerator-metrics", dead,
                            "--accelerators", "4")  # fmt: skip
    assert result.returncode == 0, result.output[-3000:]
    assert "accelerator metrics scrape of" in result.output and "WARNING" in result.output
    _, _, manifest = result.events()
    assert manifest["accelerator"]["samples"] == 0 and manifest["accelerator"]["failures"] > 0
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False)
    (row,) = [r for r in report.step_rows if r["group"] == "step"]
    assert math.isnan(row["accel_energy_j"]) and row["accel_simulated"] is None
    assert row["accelerators"] == 4  # the option still counts
    assert row["output_tokens_per_s_per_accelerator"] == pytest.approx(
        row["output_tokens_per_s"] / 4
    )
    assert math.isnan(row["cost_per_1m_output_tokens"])  # no price
    assert "## Accelerator" not in (tmp_path / "report" / "report.md").read_text()
