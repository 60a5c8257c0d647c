"""SIGTERM and SIGINT are a normal way to stop a run (`timeout`, `docker stop`, Kubernetes,
Ctrl-C), on a headless (or autostarted) run or master; a web UI master keeps Locust's own
handling (SIGTERM ends the run through `quitting`, Ctrl-C quits).

First signal: one line; the run ends at the next tick as `aborted` (the manifest names the
signal in `stopped_by`): users stop, in-flight requests are recorded aborted, every worker
flushes its events and confirms (the finish handshake), the final manifest is written, and
the process exits 128 + the signal's number (143 for SIGTERM, 130 for SIGINT).
Second signal: one line saying what the end is waiting for. Third: the process exits at
once with the same status; what the workers had not uploaded stays in their spools
(`llmload upload-spool`).

Locust installs its own SIGTERM handler only after a headless shape run has ended, so
without this a SIGTERM during the run killed the process with nothing flushed.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import gevent

from locustfiles.master.side import MasterSide

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The status a run stopped by `signum` exits with: 128 + its number, as shells report."""
    return 128 + signum


class SignalStop:
    """Counts the stop signals one master receives and acts on each (see the module doc)."""

    def __init__(self, environment: Any, master: MasterSide) -> None:
        self.environment = environment
        self.master = master
        self.received = 0
        self.quitting = False  # Locust is on its way out already (its own SIGTERM handler)

    def install(self) -> SignalStop:
        """Called in Locust's main greenlet (its init event), which is told when to exit."""
        self._main = gevent.getcurrent()
        for signum in SIGNALS:
            gevent.signal_handler(signum, self.on_signal, signum)
        self.environment.events.quitting.add_listener(self._on_quitting)
        return self

    def _on_quitting(self, **_: Any) -> None:
        self.quitting = True

    def _exit_through_locust(self) -> None:
        """Locust's own way out, as on Ctrl-C: KeyboardInterrupt in its main greenlet (it
        fires `quitting`, then exits with the environment's process_exit_code). Not when
        Locust is quitting already: a web UI process keeps Locust's SIGTERM handler, which
        may shut it down first; a KeyboardInterrupt thrown then lands in the interpreter's
        exit, as a traceback."""
        if self.quitting:
            return
        gevent.get_hub().loop.run_callback(self._throw)

    def _throw(self) -> None:
        if not self.quitting and not self._main.dead:
            self._main.throw(KeyboardInterrupt)

    def on_signal(self, signum: int) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        coordinator = self.master.coordinator
        if self.received == 1 and (coordinator is None or coordinator.finished_at is not None):
            self._exit_through_locust()  # no run going (e.g. after an autostarted run): exit
        elif self.received == 1 and coordinator is not None:
            self.environment.process_exit_code = exit_status(signum)
            _say(f"llmload: {name}: stopping the run; in-flight requests are recorded aborted "
                 "and every worker flushes its events (send it again to see what is waited "
                 "for, a third time to exit at once)")  # fmt: skip
            coordinator.stop_for_signal(name)
            self._exit_after_the_run()
        elif self.received == 2:
            waiting = coordinator.waiting_for() if coordinator is not None else "nothing"
            _say(f"llmload: {name} again: waiting for {waiting}; a third signal exits at once")
        else:
            spool = "their spools" if self.master.distributed() else "the spool"
            _say(f"llmload: {name} a third time: exiting now; events not yet uploaded stay in "
                 f"{spool}: upload them with llmload upload-spool")  # fmt: skip
            os._exit(exit_status(signum))

    def _exit_after_the_run(self) -> None:
        """A headless run exits when its shape ends; an autostarted one keeps its web UI:
        exit once the shape has ended the run."""
        if getattr(self.environment.parsed_options, "headless", False):
            return
        shape = getattr(self.environment.runner, "shape_greenlet", None)
        if shape is None:
            self._exit_through_locust()
        else:
            shape.link(lambda _: self._exit_through_locust())


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
