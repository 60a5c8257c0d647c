"""Sub-millisecond sleeps for the engine loop.

asyncio's selector (epoll) rounds every timeout *up* to a whole millisecond, which would
quantise ms-level engine steps (a 1.0 ms step takes ~1.1 ms, a 1.9 ms one ~2.1 ms). A helper
thread does the sleeping with `time.sleep` (clock_nanosleep, ~0.1 ms late at most) and wakes
the loop; it costs one thread handoff per engine step, never one per token.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class PreciseTimer:
    """`await timer.sleep_until(deadline)` with `deadline` on the loop's clock (monotonic)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._requests: queue.SimpleQueue[tuple[float, asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="llmload-sim-timer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            deadline, future = item
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                self._loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # the loop closed meanwhile
                return

    async def sleep_until(self, deadline: float) -> None:
        future: asyncio.Future[None] = self._loop.create_future()
        self._requests.put((deadline, future))
        await future

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join()
