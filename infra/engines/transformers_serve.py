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
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from types import TracebackType

from infra.engines.tiny_llama import OFFLINE_ENV
from infra.ports import free_port

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


class TransformersServe:
    """A `transformers serve` process pinned to one local model; a context manager."""

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
        self.model_dir = Path(model_dir).resolve()
        self.model_id = str(self.model_dir)
        self.workdir = Path(workdir).resolve()
        self.requested_port = port
        self.port = 0
        self.cb_num_blocks = cb_num_blocks
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_path = self.workdir / "transformers-serve.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> TransformersServe:
        if not (self.model_dir / "config.json").is_file():
            raise RuntimeError(f"{self.model_dir} holds no model (config.json missing)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self.requested_port else 3  # a free port can be taken before we bind
        for attempt in range(attempts):
            self.port = self.requested_port or free_port()
            with self.log_path.open("ab") as log:
                log.write(f"--- start {' '.join(self.command(self.port))}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    self.command(self.port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    start_new_session=True,  # its own process group: stop() signals only it
                )
            if self._wait_ready():
                return self
            self.stop()
            if attempt + 1 < attempts and "address already in use" in self.log_tail().lower():
                continue
            break
        raise RuntimeError(f"transformers serve did not become ready:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after `stop_timeout`; returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait(10)
        return proc.returncode

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the group start() created for this server

    def __enter__(self) -> TransformersServe:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the server's log --------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

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
    server = TransformersServe(args.model_dir, workdir, port=args.port)
    with server:
        print(f"transformers serve ready at {server.url}  model id: {server.model_id}", flush=True)
        print(f"log: {server.log_path}  (Ctrl-C stops it)", flush=True)
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
