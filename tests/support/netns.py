"""Hosts of their own on one machine: network namespaces on a private bridge.

    with Hosts(["target", "master", "worker-a", "worker-b"]) as hosts:
        hosts.ip("master")                           # 10.213.77.11
        proc = hosts.popen("worker-a", ["locust", ...], log=path)
        hosts.link_down("worker-b"); hosts.link_up("worker-b")

Each host is a namespace `ll<id>-<name>` with its loopback up and one veth interface on a
bridge that lives in a namespace of its own (`ll<id>-sw`): no interface, address or route
is added to the machine's own namespace, so nothing here can reach or be reached from
outside, and nothing outside is ever a target. Addresses are 10.213.77.0/24 inside the
namespaces only; hosts may have extra addresses (`extra_ips`). Everything started here is
stopped, and every namespace deleted, on exit, also after a failure.

Needs root and `ip` (iproute2); `available()` says whether namespaces can be made here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

SUBNET = "10.213.77"


def available() -> str | None:
    """None when namespaces can be made here, else why not (one line)."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"llprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(("-n", ns) if ns else ()), *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")


class Hosts:
    """A set of namespaces on one bridge (see the module docstring)."""

    def __init__(self, names: Sequence[str], extra_ips: dict[str, list[str]] | None = None) -> None:
        self.id = uuid.uuid4().hex[:4]
        self.names = list(names)
        self.extra_ips = extra_ips or {}
        self.switch = f"ll{self.id}-sw"
        self.procs: list[subprocess.Popen[Any]] = []
        self._logs: list[IO[Any]] = []
        self._made: list[str] = []

    def ns(self, name: str) -> str:
        return f"ll{self.id}-{name}"

    def ip(self, name: str) -> str:
        return f"{SUBNET}.{10 + self.names.index(name)}"

    def _veth(self, name: str) -> tuple[str, str]:
        index = self.names.index(name)
        return f"ll{self.id}h{index}", f"ll{self.id}s{index}"  # host end, switch end (<= 15)

    def __enter__(self) -> Hosts:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        for ns in [self.switch, *(self.ns(n) for n in self.names)]:
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for name in self.names:
            host_end, switch_end = self._veth(name)
            _ip("link", "add", host_end, "netns", self.ns(name), "type", "veth", "peer", "name",
                switch_end, "netns", self.switch)  # fmt: skip
            _ip("link", "set", switch_end, "master", "br0", ns=self.switch)
            _ip("link", "set", switch_end, "up", ns=self.switch)
            _ip("addr", "add", f"{self.ip(name)}/24", "dev", host_end, ns=self.ns(name))
            for extra in self.extra_ips.get(name, []):
                _ip("addr", "add", f"{extra}/24", "dev", host_end, ns=self.ns(name))
            _ip("link", "set", host_end, "up", ns=self.ns(name))

    # -- processes ------------------------------------------------------------------------
    def popen(self, name: str, cmd: Sequence[str], log: Path | None = None,
              env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[Any]:  # fmt: skip
        """`cmd` in host `name`'s namespace; stopped on close. Output to `log` (or discarded)."""
        out: Any = subprocess.DEVNULL
        if log is not None:
            out = open(log, "ab")  # noqa: SIM115 (closed on close)
            self._logs.append(out)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(name), *cmd], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(self, name: str, cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(["ip", "netns", "exec", self.ns(name), *cmd], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=cwd, stdin=subprocess.DEVNULL)  # fmt: skip

    # -- faults ---------------------------------------------------------------------------
    def link_down(self, name: str) -> None:
        """Cut host `name` off the bridge (its cable pulled: nothing in or out)."""
        _ip("link", "set", self._veth(name)[1], "down", ns=self.switch)

    def link_up(self, name: str) -> None:
        _ip("link", "set", self._veth(name)[1], "up", ns=self.switch)

    def block(self, name: str, address: str) -> None:
        """Host `name` can no longer reach `address` (a blackhole route in its namespace)."""
        _ip("route", "add", "blackhole", f"{address}/32", ns=self.ns(name))

    def unblock(self, name: str, address: str) -> None:
        _ip("route", "del", "blackhole", f"{address}/32", ns=self.ns(name))

    # -- teardown -------------------------------------------------------------------------
    def stop(self, proc: subprocess.Popen[Any], grace: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL after `grace`; its exit status."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        return proc.returncode

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc, grace=5.0)
        self.procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        for ns in reversed(self._made):  # deleting a namespace deletes its interfaces
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
