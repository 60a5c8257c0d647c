"""How the sink runs in the background: gevent greenlets (inside Locust) or plain threads.

The sink's logic is the same either way; a runtime supplies spawning, waiting, waking and a
place to run blocking calls (fsync, Parquet writes) without stalling the caller's loop.

- `GeventRuntime`: a greenlet; blocking calls go to gevent's hub threadpool so the event
  loop keeps serving the request greenlets; `pause()` lets the loop poll (I/O, timers) between
  slices of CPU work. `run_background` is for the heavy ones while requests run (writing and
  uploading a part): a thread of the sink's own at BACKGROUND_NICE.
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


BACKGROUND_NICE = 10
"""The nice value of `GeventRuntime.run_background`'s thread. Writing a part (Parquet, zstd)
takes 10-20 ms of CPU; at normal priority the kernel shares the worker's core with it half
and half, so a worker using most of its core fell behind its open-loop schedule for as long
as the write lasted (1,500 arrivals/s: slip p99 20-90 ms with a part sealed in the window,
8-12 ms without). At nice 10 the thread gets about a tenth of a core the loop also wants and
all of the time the loop waits for I/O. Not lower: the lowest priorities (19, as tried) leave a
thread almost nothing beside other busy processes, and a loaded machine then held a part for
seconds. Only while requests run: start-up and the last parts at close use the hub's pool."""


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
    def run_background(self, fn: Callable[..., T], *args: Any) -> T: ...
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

    def run_background(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)  # the sink's own thread already: no loop to keep

    def blocks_on_sockets(self) -> bool:
        return False


class GeventRuntime:
    """A greenlet; blocking calls in the hub's threadpool; `pause()` yields to the loop."""

    name = "gevent"

    def __init__(self) -> None:
        import gevent
        import gevent.event
        import gevent.monkey

        self._gevent = gevent
        self._event_cls = gevent.event.Event
        self._sockets_patched = gevent.monkey.is_module_patched("socket")
        self._background: Any = None  # the run_background thread's pool, made on first use

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
        return _returned(self._gevent.get_hub().threadpool.apply(_outcome, (fn, args)))

    def run_background(self, fn: Callable[..., T], *args: Any) -> T:
        """`run_blocking` in a thread of the sink's own at BACKGROUND_NICE (a gevent
        threadpool of one: the pipeline waits for each call)."""
        if self._background is None:
            from gevent.threadpool import ThreadPool

            self._background = ThreadPool(1)
        return _returned(self._background.apply(_background_outcome, (fn, args)))

    def blocks_on_sockets(self) -> bool:
        """True when socket I/O would block the whole loop (sockets not monkey-patched)."""
        return not self._sockets_patched


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """(True, fn(*args)), or (False, the exception it raised): for a call in another thread."""
    try:
        return True, fn(*args)
    except Exception as exc:
        return False, exc


def _returned(outcome: tuple[bool, Any]) -> Any:
    """The value of an `_outcome`, or its exception raised here, in the caller."""
    ok, value = outcome
    if ok:
        return value
    raise value


def _background_outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """`_outcome` at BACKGROUND_NICE. On Linux a nice value is the calling thread's own
    (setpriority with who=0), so only this thread is lowered; lowering needs no rights."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or refused: the call runs as it is
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
