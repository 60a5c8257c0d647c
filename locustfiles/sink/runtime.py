"""How the sink runs in the background: gevent greenlets (inside Locust) or plain threads.

The sink's logic is the same either way; a runtime supplies spawning, waiting, waking and a
place to run blocking calls (fsync, Parquet writes) without stalling the caller's loop.

- `GeventRuntime`: a greenlet; blocking calls go to a thread of the sink's own (a gevent
  threadpool of one, at the lowest CPU priority) so the event loop keeps serving the request
  greenlets; `pause()` lets the loop poll (I/O, timers) between slices of CPU work.
- `ThreadRuntime`: a daemon thread; blocking calls run inline (they only block that thread).

`pick_runtime("auto")` chooses gevent when `threading` is monkey-patched (as under Locust).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

PAUSE_S = 0.0002
"""How long `GeventRuntime.pause()` gives the loop between slices of CPU work."""

BACKGROUND_NICE = 19
"""The nice value of the sink's blocking work (`GeventRuntime.run_blocking`): writing a part
(Parquet, zstd) takes tens of ms of CPU, and at normal priority the kernel shares the core
with it, so a worker using its whole core stalled in 5-12 ms slices for as long as the write
lasted (measured at 1,500 arrivals/s: slip p99 49-93 ms with a part sealed in the window,
9-12 ms without). At nice 19 the loop keeps the core and the write takes the idle time; it
never starves: a nice-19 thread still gets its share of a busy core."""


class Waitable(Protocol):
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> Any: ...


class Task(Protocol):
    def join(self, timeout: float | None = None) -> Any: ...


class Runtime(Protocol):
    name: str

    def spawn(self, fn: Callable[[], None], name: str) -> Task: ...
    def event(self) -> Waitable: ...
    def sleep(self, seconds: float) -> None: ...
    def pause(self) -> None: ...
    def run_blocking(self, fn: Callable[..., T], *args: Any) -> T: ...
    def blocks_on_sockets(self) -> bool: ...


class ThreadRuntime:
    """A daemon thread; blocking calls run where they are made."""

    name = "threads"

    def spawn(self, fn: Callable[[], None], name: str) -> Task:
        thread = threading.Thread(target=fn, name=name, daemon=True)
        thread.start()
        return thread

    def event(self) -> Waitable:
        return threading.Event()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def pause(self) -> None:
        pass

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def blocks_on_sockets(self) -> bool:
        return False


class GeventRuntime:
    """A greenlet; blocking calls in a thread of its own at BACKGROUND_NICE (not the hub's
    threadpool, which also resolves host names for new connections); `pause()` yields to
    the loop."""

    name = "gevent"

    def __init__(self) -> None:
        import gevent
        import gevent.event
        import gevent.monkey

        self._gevent = gevent
        self._event_cls = gevent.event.Event
        self._sockets_patched = gevent.monkey.is_module_patched("socket")
        self._pool: Any = None  # made on first use, in the loop's thread

    def spawn(self, fn: Callable[[], None], name: str) -> Task:
        greenlet = self._gevent.spawn(fn)
        greenlet.name = name
        return greenlet

    def event(self) -> Waitable:
        return self._event_cls()

    def sleep(self, seconds: float) -> None:
        self._gevent.sleep(max(0.0, seconds))

    def pause(self) -> None:
        # Not sleep(0): that only runs greenlets already waiting to run, without polling for
        # I/O or timers, so a long encode made of many sleep(0) slices still holds every
        # stream's reads for its whole length (measured: 30-75 ms at 60k rows/s). A timer,
        # however short, makes the loop poll between slices.
        self._gevent.sleep(PAUSE_S)

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        # The exception comes back as a value and is raised here, in the caller: raised in
        # the pool's thread, gevent's hub would also print its traceback to stderr, once per
        # failed call (a full disk printed one per part and retry).
        if self._pool is None:
            from gevent.threadpool import ThreadPool

            self._pool = ThreadPool(1)  # the pipeline waits for each call: one at a time
        ok, value = self._pool.apply(_background_outcome, (fn, args))
        if ok:
            return value
        raise value

    def blocks_on_sockets(self) -> bool:
        """True when socket I/O would block the whole loop (sockets not monkey-patched)."""
        return not self._sockets_patched


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """(True, fn(*args)), or (False, the exception it raised): for a call in another thread."""
    try:
        return True, fn(*args)
    except Exception as exc:
        return False, exc


def _background_outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """`_outcome` at BACKGROUND_NICE: on Linux the nice value is the calling thread's own
    (setpriority with who=0), so only the sink's thread is lowered; lowering needs no rights."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or refused: the write runs as before
        pass
    return _outcome(fn, args)


def pick_runtime(kind: str = "auto") -> Runtime:
    """`auto`: gevent when threading is monkey-patched (as under Locust), else threads."""
    if kind == "threads":
        return ThreadRuntime()
    if kind == "gevent":
        return GeventRuntime()
    if kind != "auto":
        raise ValueError(f"unknown runtime {kind!r}; use auto, gevent or threads")
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return GeventRuntime()
    return ThreadRuntime()
