"""Child processes that never outlive the command that started them.

    with Children(log_dir) as children:
        master = children.start("master", [...], env)    # own process group, log file
        ...
    # leaving the block (normally, on an exception or Ctrl-C) stops every child in start
    # order (the master before its workers): SIGTERM to its process group, SIGKILL after a
    # grace period

Each child runs in a session of its own, so a Ctrl-C in the terminal reaches only this
process, which then stops the children in order (the Locust master first, so it can collect
the workers' events). On Linux a child also gets SIGTERM if this process dies outright.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO

STOP_GRACE_S = 10.0


class Children:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def start(
        self, name: str, cmd: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """Start `cmd` in its own process group, output to `<log_dir>/<name>.log`."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(name), "wb")  # noqa: SIM115 (closed in stop_all)
        self._logs.append(log)
        proc = subprocess.Popen(
            list(cmd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.procs[name] = proc
        return proc

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 12) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n".join(text)

    def stop(self, name: str, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the child's process group, SIGKILL it after `grace`; its exit status."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
            _signal_group(proc, signal.SIGKILL)  # the child, if still there, and its group
            proc.wait(grace)
        return proc.returncode

    def kill_all(self) -> None:
        """SIGKILL every child's process group now (a third stop signal: no waiting)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)

    def stop_all(self, grace: float = STOP_GRACE_S) -> None:
        with shielded():
            for name in list(self.procs):
                self.stop(name, grace)
            for log in self._logs:
                log.close()
            self._logs.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while cleaning up (the cleanup is bounded by timeouts)."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so `finally` blocks stop the children as on Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid


def _die_with_parent() -> None:
    """Linux: SIGTERM the child when this process dies (no orphans after a crash or kill -9)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
