"""Deadlines for streams in flight without a timer per socket read.

A gevent socket with a timeout arms and disarms a timer on every read: at tens of thousands
of events per second that costs more than the event. So once a response's headers are in,
its socket has no timeout and one watchdog greenlet per process checks every in-flight
stream every CHECK_INTERVAL_S for the request timeout, the TTFT timeout and the stall
timeout. An expired stream's socket is shut down: the blocked read returns, and the request
is recorded with the watchdog's kind. Deadlines are thus kept to within CHECK_INTERVAL_S.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

import gevent

CHECK_INTERVAL_S = 0.05
_perf_ns = time.perf_counter_ns


class Watch:
    """One request's deadlines; `last` is the perf_counter_ns of its latest read, `progress`
    of its latest read that completed a data event: the stall timer's start, so bytes that
    carry no data (`: ping` comments, keep-alives) do not keep a stalled stream open."""

    __slots__ = ("expired", "last", "limits", "progress", "sock", "t0", "waiting_first")

    def __init__(self, limits: Any) -> None:
        self.limits = limits
        self.t0 = 0
        self.last = 0
        self.progress = 0
        self.waiting_first = True
        self.expired: str | None = None
        self.sock: Any = None

    def start(self, resp: Any) -> None:
        conn = getattr(resp, "_connection", None)
        self.sock = getattr(conn, "sock", None)
        self.last = self.progress = _perf_ns()
        if self.sock is not None:
            _watchdog.add(self)

    def stop(self) -> None:
        if self.sock is not None:
            _watchdog.discard(self)
            self.sock = None

    def check(self, now: int) -> str | None:
        lim = self.limits
        # no token yet and both deadlines past (equal limits): "no first token" says more
        if self.waiting_first and lim.ttft_timeout and now - self.t0 > lim.ttft_timeout * 1e9:
            return "ttft_timeout"
        if lim.request_timeout and now - self.t0 > lim.request_timeout * 1e9:
            return "total_timeout"
        # stalls count once tokens flow: before the first one, queueing and prefill are
        # the TTFT timeout's business (and the request timeout's)
        if (
            not self.waiting_first
            and lim.stall_timeout
            and now - self.progress > lim.stall_timeout * 1e9
        ):
            return "stall_timeout"
        return None

    def left_s(self, now: int, read_timeout: float) -> float:
        """Seconds the next read may wait: `read_timeout`, or less when a deadline is nearer."""
        lim = self.limits
        left = read_timeout
        if lim.request_timeout:
            left = min(left, lim.request_timeout - (now - self.t0) / 1e9)
        if self.waiting_first and lim.ttft_timeout:
            left = min(left, lim.ttft_timeout - (now - self.t0) / 1e9)
        if not self.waiting_first and lim.stall_timeout:
            left = min(left, lim.stall_timeout - (now - self.progress) / 1e9)
        return max(left, 0.0) + 0.01  # a hair past the deadline, so that check() sees it

    def detail(self) -> str:
        lim = self.limits
        limit = {"total_timeout": lim.request_timeout, "ttft_timeout": lim.ttft_timeout,
                 "stall_timeout": lim.stall_timeout}[self.expired or "total_timeout"]  # fmt: skip
        what = {"total_timeout": "request not finished", "ttft_timeout": "no first token",
                "stall_timeout": "no data"}[self.expired or "total_timeout"]  # fmt: skip
        return f"{what} within {limit} s"


class DeadlineExpired(ConnectionAbortedError):
    """A deadline passed while reading without the watchdog (see ReadDeadlines)."""


class ReadDeadlines:
    """The read clock of a process without the watchdog (`Limits.read_timeout`: `llmload
    check`): every read checks the watch's deadlines, so bytes that are not tokens (`: ping`
    comments) do not keep a stream waiting for its first token past the TTFT timeout, and
    the next read waits no longer than the nearest deadline. Costs a little per read: never
    the load's path (there the watchdog keeps the deadlines)."""

    __slots__ = ("read_timeout", "sock", "watch")

    def __init__(self, watch: Watch, sock: Any, read_timeout: float) -> None:
        self.watch = watch
        self.sock = sock
        self.read_timeout = read_timeout

    @property
    def last(self) -> int:
        return self.watch.last

    @last.setter
    def last(self, now: int) -> None:
        watch = self.watch
        watch.last = now
        kind = watch.check(now)
        if kind is not None:
            watch.expired = kind
            raise DeadlineExpired(watch.detail())
        if self.sock is not None:
            self.sock.settimeout(watch.left_s(now, self.read_timeout))


class _Watchdog:
    def __init__(self) -> None:
        self.watches: set[Watch] = set()
        self.greenlet: gevent.Greenlet | None = None

    def add(self, watch: Watch) -> None:
        self.watches.add(watch)
        if self.greenlet is None or self.greenlet.dead:
            self.greenlet = gevent.spawn(self._run)

    def discard(self, watch: Watch) -> None:
        self.watches.discard(watch)

    def _run(self) -> None:
        while self.watches:
            gevent.sleep(CHECK_INTERVAL_S)
            now = _perf_ns()
            for watch in list(self.watches):
                kind = watch.check(now)
                if kind is not None and watch.sock is not None:
                    watch.expired = kind
                    self.watches.discard(watch)
                    with contextlib.suppress(OSError):
                        watch.sock.shutdown(socket.SHUT_RDWR)


_watchdog = _Watchdog()
