"""`llmload campaign --repeat 5` against the simulator, then `llmload report --campaign`.

The simulator's TTFT is known from its parameters (docs/simserver.md, infra/simserver/
engine.py): with the prefix cache off and no per-sequence or per-KV-token decode cost, a
request that finds the engine idle is admitted at once and its first token comes out of its
prefill step, which lasts `decode_base + prefill_per_token x prompt_tokens`. The prompt
lengths vary (`U(10,400)`), which gives each step a spread of TTFTs to resample; the steps
are open-loop rates low enough that a request seldom finds another one in the engine.

The configured TTFT p50 of a step is that formula at the median prompt length of the
requests the step measured (the model is monotone in the prompt length, so the median of
the modelled TTFTs is the model at the median prompt; the repeats send the same seeded
prompts). Every step's interval must contain it, allowing below the interval what the
model leaves out: the HTTP round trip before the engine sees the request (the client writes
it, the server parses it and answers with its head and role event before admitting it, the
client reads them). The client measures exactly that as TTFE, so the allowance is the
step's TTFE p50 over the runs, not a guess: about 0.5 ms on an idle machine, a few ms on a
busy one. The formula also leaves out the wake-up of the prefill step: the simulator's
engine sleeps each step on a timer thread that hands over to its loop (infra/simserver/
clock.py: ~0.1-0.5 ms late on a VM), allowed as STEP_WAKE_S. (While the first event was
timed when the client's loop got to it, TTFE carried that much and more; since the headers'
read is kernel-timed it does not, and an interval once missed by 0.03 ms without it.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.compare.bootstrap import nearest_rank_median
from tests.support.chat import start_sim

LLMLOAD = str(Path(sys.executable).parent / "llmload")
DECODE_BASE_S = 0.0005
PREFILL_PER_TOKEN_S = 100e-6
STEP_WAKE_S = 0.0005  # the prefill step's timer wake-up (module docstring)
SIM_ARGS = (
    "--prefix-cache", "off",  # the runs resend the same seeded prompts: no cache hits
    "--decode-base-ms", str(DECODE_BASE_S * 1e3),
    "--prefill-per-token-us", str(PREFILL_PER_TOKEN_S * 1e6),
    "--decode-per-seq-us", "0", "--decode-per-kv-token-ns", "0", "--output-len", "4",
)  # fmt: skip


def configured_ttft_s(prompt_tokens: float) -> float:
    """The simulator's TTFT of a request that finds the engine idle (module docstring)."""
    return DECODE_BASE_S + PREFILL_PER_TOKEN_S * prompt_tokens


def _campaign_file(path: Path, url: str, events: Path) -> Path:
    path.write_text(
        f"""
name: rep
target: {{url: "{url}"}}
workload: "U(10,400)/(4,4)"
rates: [3, 6]
step_duration: 8
step_warmup: 1
cold_requests: 0
workers: 1
worker_wait: 30
events_uri: {events}
"""
    )
    return path


@pytest.mark.slow
@pytest.mark.alone  # interval coverage over timings: nothing beside it
def test_five_repeats_give_intervals_that_contain_the_configured_ttft(tmp_path: Path) -> None:
    events, reports = tmp_path / "runs", tmp_path / "reports"
    with start_sim(tmp_path / "sim", *SIM_ARGS) as sim:
        config = _campaign_file(tmp_path / "c.yaml", sim.url, events)
        out = subprocess.run(
            [LLMLOAD, "campaign", str(config), "--out", str(reports), "--repeat", "5"],
            capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    campaign_id = re.search(r"campaign id (\S+) ", out.stdout).group(1)  # type: ignore[union-attr]
    run_ids = sorted(p.name for p in events.iterdir() if p.is_dir())
    assert len(run_ids) == 5
    manifests = [json.loads((events / r / "manifest.json").read_text()) for r in run_ids]
    assert sorted(m["config"]["repeat"] for m in manifests) == [1, 2, 3, 4, 5]
    assert {m["config"]["campaign_id"] for m in manifests} == {campaign_id}
    where = reports / "repeats-default"
    assert f"repeats of 5 runs (median and 95% interval per step): {where.resolve()}" in out.stdout

    doc = json.loads((where / "repeats.json").read_text())
    assert doc["kind"] == "llmload.repeats" and doc["simulated"] is True
    assert sorted(doc["runs"]) == run_ids
    prompts = pd.concat(
        pd.read_parquet(reports / r / "requests.parquet") for r in run_ids
    )  # each run's own report, written as the campaign ran
    measured = prompts[prompts["steady"] & ~prompts["cold"] & (prompts["status"] == "ok")]
    ttft = {f["rate"]: f for f in doc["figures"] if f["figure"] == "ttft_p50_s"}
    assert sorted(ttft) == [3.0, 6.0]
    for rate, figure in ttft.items():
        step = measured[measured["rate"] == rate]
        expected = configured_ttft_s(nearest_rank_median(step["prompt_tokens"].to_numpy(float)))
        allowance = nearest_rank_median(step["ttfe_s"].to_numpy(float)) + STEP_WAKE_S
        assert figure["enough"], figure["why"]
        low, high = figure["ci_low"], figure["ci_high"]
        assert low - allowance <= expected <= high, (rate, expected, allowance, figure)
        assert low < high  # the prompt lengths' spread: not a degenerate interval

    # The same runs reported again by campaign id: every run's report and the repeats files.
    again = tmp_path / "again"
    out = subprocess.run(
        [LLMLOAD, "report", "--campaign", campaign_id, "--events-uri", str(events),
         "--out", str(again), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for name in ("repeats.csv", "repeats.json", "repeats.md", "repeats.html"):
        assert (again / name).is_file(), name
    assert all((again / r / "summary.json").is_file() for r in run_ids)
    assert json.loads((again / "repeats.json").read_text())["figures"] == doc["figures"]
