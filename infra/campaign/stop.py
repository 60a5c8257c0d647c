"""SIGTERM and SIGINT on a campaign: the run going ends as `aborted`, its events kept.

    with StopSignals() as stop:                    # for the whole campaign
        with stop.watching(run_id, master, children, grace_s):
            ...                                    # poll: stop.requested, stop.deadline(...)
        stop.raise_if_stopped()                    # CampaignStopped once the run has ended

The children run in sessions of their own, so a signal reaches only the campaign, which
passes it on (docs/reliability.md "Signals"):

- first: one line; the same signal goes to the Locust master, whose handler ends the run the
  normal way (users stop, in-flight requests are recorded aborted, every worker flushes and
  confirms, the final manifest says `aborted` and `stopped_by` the signal); the campaign
  waits for the master (at most `grace_s`) and its workers, runs no further workload and
  raises CampaignStopped (exit 128 + the signal: 143 SIGTERM, 130 SIGINT);
- second: one line saying what the campaign waits for (the master, or workers by name);
- third: one line; every child is killed at once (what the workers had not uploaded stays in
  their spools: `llmload upload-spool`) and CampaignStopped is raised.

A signal while no run is going (building a report, choosing a run id) stops the campaign at
once: there is nothing to flush.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from infra.campaign.procs import Children

SIGNALS = (signal.SIGTERM, signal.SIGINT)

Say = Callable[[str], None]


class CampaignStopped(KeyboardInterrupt):
    """The campaign was stopped by a signal: exit with `exit_status` (128 + the signal).

    A KeyboardInterrupt, so code that cleans up on Ctrl-C cleans up on this too."""

    def __init__(self, signum: int, run_id: str | None = None) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        self.run_id = run_id
        self.exit_status = 128 + signum
        super().__init__(f"stopped by {self.signal_name}")


@dataclass
class _Run:
    run_id: str
    run_uri: str
    children: Children
    master: Any  # subprocess.Popen[bytes]
    grace_s: float


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StopSignals:
    """Counts the stop signals the campaign receives and acts on each (see the module doc)."""

    def __init__(self, say: Say = _say) -> None:
        self.say = say
        self.received = 0
        self.signum: int | None = None
        self.stopped_at: float | None = None  # monotonic time of the first signal
        self.run: _Run | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextmanager
    def watching(
        self, run_id: str, run_uri: str, master: Any, children: Children, grace_s: float
    ) -> Iterator[None]:
        """While the block runs, a first signal is passed on to `master` (see the module doc)."""
        self.run = _Run(run_id, run_uri, children, master, grace_s)
        try:
            yield
        finally:
            self.run = None

    def deadline(self, deadline: float) -> float:
        """`deadline` (monotonic), brought forward to the master's grace once stopped."""
        if self.stopped_at is None or self.run is None:
            return deadline
        return min(deadline, self.stopped_at + self.run.grace_s)

    def raise_if_stopped(self) -> None:
        if self.signum is not None:
            raise CampaignStopped(self.signum)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        run = self.run
        if self.signum is None:
            self.signum = signum
            self.stopped_at = time.monotonic()
        if run is None:
            raise CampaignStopped(signum)  # no run going: nothing to flush
        if self.received == 1:
            self.say(
                f"llmload: {name}: stopping run {run.run_id}; its master ends it as aborted: "
                "in-flight requests are recorded aborted and every worker flushes its events "
                f"to {run.run_uri} (send it again to see what is waited for, a third time to "
                "exit at once)"
            )
            with suppress(ProcessLookupError):
                os.kill(run.master.pid, signum)  # the master's handler ends the run
        elif self.received == 2:
            self.say(
                f"llmload: {name} again: waiting for {self._waiting_for(run)}; "
                "a third signal exits at once"
            )
        else:
            self.say(
                f"llmload: {name} a third time: exiting now; events not yet uploaded stay in "
                "the workers' spools: upload them with llmload upload-spool"
            )
            run.children.kill_all()
            raise CampaignStopped(self.signum or signum, run.run_id)

    def _waiting_for(self, run: _Run) -> str:
        left = max(0.0, (self.stopped_at or time.monotonic()) + run.grace_s - time.monotonic())
        if run.master.poll() is None:
            return (
                f"the master of run {run.run_id} (pid {run.master.pid}) to end it: its workers' "
                f"flush and the final manifest (at most {left:.0f} s more)"
            )
        workers = _running(run.children.procs, skip="master")
        if workers:
            return f"{', '.join(workers)} of run {run.run_id} to exit"
        return f"run {run.run_id}'s processes to be reaped"


def _running(procs: Mapping[str, Any], skip: str) -> list[str]:
    return [name for name, proc in procs.items() if name != skip and proc.poll() is None]
