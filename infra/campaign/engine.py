"""One engine configuration's server, started and stopped by a sweep (docs/sweeps.md).

    with EngineProcess(campaign.engine, config, log_dir) as engine:
        engine.start()          # EngineStartError: it exited or was not ready in time
        engine.url              # http://127.0.0.1:<port>
        ...                     # the plan runs
        engine.crashed          # it exited during the plan (the log's tail: engine.log_tail())
    # leaving: SIGTERM to its process group, SIGKILL after engine.stop_timeout, then the
    # port and the process group are checked gone (EngineStopError otherwise)

The engine runs in a process group of its own (procs.Children), its output in
`<log_dir>/engine-<name>.log`. Readiness is `GET <url><ready_path>` answering 200 (vLLM,
SGLang, `transformers serve` and `llmload sim` all answer /v1/models once they serve).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from pathlib import Path
from types import TracebackType

from analysis.kernel.errors import LlmloadError
from infra.campaign.config import Engine, EngineConfig
from infra.campaign.procs import Children
from infra.ports import answers_200, free_port, port_open

READY_POLL_S = 0.5
"""Seconds between readiness probes."""
GONE_WAIT_S = 10.0
"""After the engine's process group ended: how long its port may take to close."""


class EngineStartError(LlmloadError):
    """The engine exited before it was ready, or was not ready within ready_timeout."""


class EngineStopError(LlmloadError):
    """The engine's port or processes outlived its stop: the next configuration cannot start."""


class EngineProcess:
    def __init__(self, engine: Engine, config: EngineConfig, log_dir: Path) -> None:
        self.engine, self.config = engine, config
        self.children = Children(log_dir)
        self.name = f"engine-{config.name}"
        self.port = engine.port or free_port(engine.host)
        host = engine.host if ":" not in engine.host else f"[{engine.host}]"
        self.url = config.url or f"http://{host}:{self.port}"
        self.command = [
            arg.replace("{port}", str(self.port)).replace("{host}", engine.host)
            for arg in engine.command
        ] + list(config.args)
        self.startup_s: float | None = None
        self._pgid: int | None = None

    @property
    def launch_args(self) -> str:
        """The engine's command line as run (the manifest's `launch_args`)."""
        return shlex.join(self.command) if self.config.started else ""

    @property
    def log_path(self) -> Path:
        return self.children.log_path(self.name)

    def log_tail(self, lines: int = 20) -> str:
        return self.children.log_tail(self.name, lines)

    @property
    def crashed(self) -> bool:
        """Whether an engine llmload started has exited on its own."""
        proc = self.children.procs.get(self.name)
        return proc is not None and proc.poll() is not None

    def start(self) -> None:
        """Start the engine (nothing for a configuration with a `url`) and wait until it
        answers its ready path; EngineStartError names why not, with its log's tail."""
        began = time.monotonic()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.engine.env, **self.config.env}
        proc = None
        if self.config.started:
            if port_open(self.engine.host, self.port):
                raise EngineStartError(
                    f"port {self.port} on {self.engine.host} is already taken: another "
                    "process serves there; stop it or leave engine.port at 0"
                )
            proc = self.children.start(self.name, self.command, env)
            self._pgid = proc.pid
        deadline = began + self.engine.ready_timeout
        probe = self.url + self.engine.ready_path
        while True:
            if proc is not None and proc.poll() is not None:
                raise EngineStartError(
                    f"the engine exited with status {proc.returncode} before it was ready "
                    f"(log {self.log_path})"
                )
            if answers_200(probe):
                self.startup_s = time.monotonic() - began
                return
            if time.monotonic() >= deadline:
                raise EngineStartError(
                    f"{probe} did not answer 200 within {self.engine.ready_timeout:g} s "
                    f"(engine.ready_timeout; log {self.log_path})"
                )
            time.sleep(READY_POLL_S)

    def stop(self) -> None:
        """Stop the engine's process group, then check that its processes and its port are
        gone (EngineStopError otherwise). Nothing for a configuration with a `url`."""
        if not self.config.started or self.name not in self.children.procs:
            self.children.stop_all()
            return
        self.children.stop(self.name, self.engine.stop_timeout)
        self.children.stop_all()
        deadline = time.monotonic() + GONE_WAIT_S
        while True:  # children of the engine may take a moment to be reaped
            left = _group_alive(self._pgid)
            listening = port_open(self.engine.host, self.port)
            if not (left or listening) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if left or listening:
            held = ((f"process group {self._pgid}", left), (f"port {self.port}", listening))
            what = " and ".join(name for name, bad in held if bad)
            raise EngineStopError(
                f"configuration {self.config.name}: {what} still in use after the engine was "
                f"stopped (SIGTERM, then SIGKILL after {self.engine.stop_timeout:g} s): the next "
                "configuration would not start clean; stop it by hand"
            )

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
        else:  # already failing: stop what runs, and let the first error speak
            with contextlib.suppress(EngineStopError):
                self.stop()


def _group_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
