"""Start `transformers serve` (continuous batching, CPU) on a free loopback port, and stop it.

    with TransformersServe(model_dir, workdir) as server:   # waits until /health answers
        server.url, server.model_id, server.log_path
        mark = server.log_mark(); ...; server.access_counts(since=mark)

or from a shell (foreground, Ctrl-C stops it):

    python -m infra.engines.transformers_serve MODEL_DIR [--port 8000] [--workdir DIR]

What it sets, and why:
- `--continuous-batching --cb-num-blocks 256`: the default KV cache size takes ~10 GB;
  256 blocks are plenty for a tiny model.
- `--device cpu --host 127.0.0.1 --log-level info`: loopback only; `info` turns on uvicorn's
  access log, one line per request with its status, which tests compare with llmload's rows.
- `--default-seed 0`: reproducible sampling.
- Offline: `HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE`, no telemetry, no update check, and a
  private `HF_HOME` under the work directory (with an empty `hub/` so `/v1/models`, which
  lists the hub cache rather than the served model, answers `{"data": []}` instead of 500).
- The model id to request is the model directory exactly as passed (`model_id`): the server
  is pinned to it and answers 400 to any other id.

Readiness is `GET /health` = 200 (the model is loaded before the port opens). Stopping sends
SIGTERM to the server's own process group, then SIGKILL after a grace period. Output goes to
`<workdir>/transformers-serve.log`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

from infra.engines.process import EngineProcess
from infra.engines.tiny_llama import OFFLINE_ENV

CB_NUM_BLOCKS = 256
_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


def transformers_executable() -> str:
    """The `transformers` CLI of this Python environment, else the one on PATH."""
    here = Path(sys.executable).parent / "transformers"
    if here.is_file():
        return str(here)
    found = shutil.which("transformers")
    if not found:
        raise RuntimeError(
            "the `transformers` CLI is not installed; install requirements-engine.txt "
            "(CPU torch first), e.g. `make test-engine` builds .venv-engine"
        )
    return found


class TransformersServe(EngineProcess):
    """A `transformers serve` process pinned to one local model; a context manager."""

    NAME = "transformers serve"
    LOG_NAME = "transformers-serve.log"
    POLL_S = 0.2

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        workdir: str | os.PathLike[str],
        *,
        port: int = 0,
        cb_num_blocks: int = CB_NUM_BLOCKS,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(model_dir, workdir, port=port, extra_args=extra_args,
                         startup_timeout=startup_timeout, stop_timeout=stop_timeout)  # fmt: skip
        self.cb_num_blocks = cb_num_blocks

    def command(self, port: int) -> list[str]:
        return [
            transformers_executable(), "serve", self.model_id,
            "--continuous-batching", "--cb-num-blocks", str(self.cb_num_blocks),
            "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "info", "--default-seed", "0", *self.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        hf_home = self.workdir / "hf-home"
        (hf_home / "hub").mkdir(parents=True, exist_ok=True)
        return {**os.environ, **OFFLINE_ENV, "HF_HOME": str(hf_home), "PYTHONUNBUFFERED": "1"}

    # -- the server's log ------------------------------------------------------------
    def log_mark(self) -> int:
        """A position in the log; `access_counts(since=mark)` counts only what came after."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def access_counts(self, since: int = 0, path: str = "/v1/chat/completions") -> Counter[int]:
        """HTTP status -> number of POSTs to `path` in uvicorn's access log after `since`."""
        with self.log_path.open("rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", "replace")
        counts: Counter[int] = Counter()
        for m in _ACCESS.finditer(text):
            if m["method"] == "POST" and m["path"] == path:
                counts[int(m["status"])] += 1
        return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.engines.transformers_serve",
        description="Run `transformers serve` (continuous batching, CPU, offline) on a local model.",
    )
    parser.add_argument("model_dir", help="a save_pretrained model directory (see tiny_llama)")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--workdir", default="", help="log and HF_HOME (default: MODEL_DIR.serve)")
    args = parser.parse_args(argv)
    workdir = args.workdir or str(Path(args.model_dir).resolve()) + ".serve"
    TransformersServe(args.model_dir, workdir, port=args.port).serve_until_interrupted(
        "transformers serve"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
