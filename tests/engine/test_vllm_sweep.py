"""An engine sweep on vLLM's CPU build (issue 39): `llmload campaign` starts vLLM with
`--max-num-seqs 1`, runs the plan, stops it, checks its port and processes gone, does the
same with `--max-num-seqs 4`, and writes the sweep report.

At concurrency 4, one sequence at a time makes three of the four users wait for each
answer, while four decode together: the tiny model's batched decode step costs far less than
four single ones on the CPU, so the throughput differs, and the report must find that
difference significant and name max-num-seqs 4 the best.

Needs vLLM and the engine environment, as tests/engine/test_vllm.py; skipped elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.engines.tiny_llama import OFFLINE_ENV
from infra.engines.vllm_serve import ENTRYPOINT, KVCACHE_GIB, MAX_MODEL_LEN, vllm_python
from tests.engine.test_vllm import (  # noqa: F401  (pytestmark: the same skips and mark)
    build_tiny_model,
    pytestmark,
)
from tests.support.targets import closed

LLMLOAD = str(Path(sys.executable).parent / "llmload")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory, "tiny-llama-hd64", "--head-dim-64")


def test_a_two_configuration_sweep_on_vllm(tiny_model: Path, tmp_path: Path) -> None:
    events, reports = tmp_path / "runs", tmp_path / "reports"
    (tmp_path / "hf-home" / "hub").mkdir(parents=True)
    command = [str(vllm_python()), "-m", ENTRYPOINT, "--model", str(tiny_model),
               "--host", "{host}", "--port", "{port}", "--seed", "0",
               "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager"]  # fmt: skip
    env = {**OFFLINE_ENV, "HF_HOME": str(tmp_path / "hf-home"),
           "VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_GIB), "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}  # fmt: skip
    config = tmp_path / "vllm-sweep.yaml"
    config.write_text(
        f"""
name: vsweep
target: {{}}
extra: ["--tokenizer", "{tiny_model}"]
workload: "D(16,32)"
steps: [4]
step_duration: 20
step_warmup: 2
cold_requests: 0
workers_per_host: 1
worker_wait: 60
events_uri: {events}
report_dir: {reports}
engine:
  command: {json.dumps(command)}
  env: {json.dumps(env)}
  ready_path: /health
  ready_timeout: 400
  accelerators: 1
  sweep:
    max-num-seqs: [1, 4]
"""
    )
    done = subprocess.run([LLMLOAD, "campaign", str(config)], capture_output=True, text=True,
                          timeout=1500)  # fmt: skip
    folder = reports / "sweep-vsweep"
    logs = "".join(f"\n--- {p.name} ---\n" + p.read_text()[-3000:]
                   for p in sorted((folder / "logs").glob("*.log")))  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:] + logs
    state = json.loads((folder / "sweep-state.json").read_text())
    assert list(state["configurations"]) == ["max-num-seqs-1", "max-num-seqs-4"]
    for record in state["configurations"].values():
        assert record["status"] == "done" and record["startup_s"] > 0
        assert closed(record["url"])  # stopped, its port free before the next started
    sweep = json.loads((folder / "sweep.json").read_text())
    assert sweep["simulated"] is False
    points = {p["config"]: p for p in sweep["points"]}
    one, four = points["max-num-seqs-1"], points["max-num-seqs-4"]
    assert four["output_tokens_per_s"] > one["output_tokens_per_s"]
    assert sweep["best"]["default"]["config"] == "max-num-seqs-4"
    (verdict,) = [v for v in sweep["verdicts"] if v["metric"] == "output_tokens_per_s"]
    assert verdict["step"] == "c=4" and verdict["other"] == "max-num-seqs-1"
    assert verdict["verdict"] == "best significantly better", verdict
    assert 'id="plot-pareto"' in (folder / "sweep.html").read_text()
    print(json.dumps({"points": sweep["points"], "verdicts": sweep["verdicts"],
                      "startup_s": {k: r["startup_s"] for k, r in
                                    state["configurations"].items()}}, indent=1))  # fmt: skip
