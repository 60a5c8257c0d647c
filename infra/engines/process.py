"""One real engine's server process on a free loopback port: started, waited for, stopped.

The lifecycle `transformers serve` and vLLM share (infra/engines/transformers_serve.py,
vllm_serve.py): each subclass says what to run (`command`, `environment`) and names its log;
this starts it in a process group of its own, retries once on a port taken before it bound,
waits for `GET /health` = 200, and stops it with SIGTERM to the group, then SIGKILL after a
grace period (so no engine-core child outlives it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from infra.ports import answers_200, free_port


class EngineProcess:
    """A server process pinned to one local model; a context manager (`start`, `stop`)."""

    NAME = "engine"  # how errors name it
    LOG_NAME = "engine.log"  # its output, under the work directory
    POLL_S = 0.5  # between /health tries

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        workdir: str | os.PathLike[str],
        *,
        port: int,
        extra_args: tuple[str, ...],
        startup_timeout: float,
        stop_timeout: float,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.model_id = str(self.model_dir)  # the id to request: the directory as served
        self.workdir = Path(workdir).resolve()
        self.requested_port = port
        self.port = 0
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_path = self.workdir / self.LOG_NAME
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Self:
        if not (self.model_dir / "config.json").is_file():
            raise RuntimeError(f"{self.model_dir} holds no model (config.json missing)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self.requested_port else 2  # a free port can be taken before we bind
        for attempt in range(attempts):
            self.port = self.requested_port or free_port()
            command = self.command(self.port)
            with self.log_path.open("ab") as log:
                log.write(f"--- start {' '.join(command)}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    cwd=self.workdir,
                    start_new_session=True,  # its own process group: stop() signals only it
                )
            if self._wait_ready():
                return self
            self.stop()
            if attempt + 1 < attempts and "address already in use" in self.log_tail().lower():
                continue
            break
        raise RuntimeError(f"{self.NAME} did not become ready:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if answers_200(self.url + "/health"):
                return True
            time.sleep(self.POLL_S)
        return False

    def stop(self) -> int | None:
        """SIGTERM to the process group, then SIGKILL after `stop_timeout`; the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.stop_timeout)
        # a child (vLLM's engine core) must not outlive it: the whole group, whatever is left
        self._signal(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        return proc.returncode

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the group start() created for this server

    def __enter__(self) -> Self:
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

    def serve_until_interrupted(self, banner: str) -> None:
        """Run in the foreground until the process ends or Ctrl-C (the modules' `main`)."""
        with self:
            print(f"{banner} ready at {self.url}  model id: {self.model_id}", flush=True)
            print(f"log: {self.log_path}  (Ctrl-C stops it)", flush=True)
            try:
                while self.proc is not None and self.proc.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
