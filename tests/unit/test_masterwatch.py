"""A worker's watch on its master: silent too long while a run goes on -> stop, flush, exit 1.

A fake environment stands in for Locust's (the watch uses its heartbeat event, the runner's
master address and quit(), and the worker context); the clock is a number the test moves.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gevent
import pytest

from locustfiles.worker.masterwatch import EXIT_MASTER_LOST, MasterWatch


class Hook:
    """Locust's EventHook, as the watch uses it (importing locust would monkey-patch)."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def fire(self, **kwargs: Any) -> None:
        for listener in self.listeners:
            listener(**kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def environment(running: bool = True) -> Any:
    runner = SimpleNamespace(master_host="10.0.0.10", master_port=5557, quits=0)
    runner.quit = lambda: setattr(runner, "quits", runner.quits + 1)
    worker = SimpleNamespace(sink_report=None if running else {"rows": {}})
    return SimpleNamespace(runner=runner, events=SimpleNamespace(heartbeat_received=Hook()),
                           worker=worker, process_exit_code=None)  # fmt: skip


def test_silence_counts_only_while_a_run_goes_on_and_a_heartbeat_resets_it() -> None:
    clock = Clock()
    env = environment()
    watch = MasterWatch(env, lambda: env.worker, timeout_s=10, clock=clock)
    env.events.heartbeat_received.add_listener(watch._on_heartbeat)
    clock.now += 9.5
    assert not watch.check(clock.now)
    clock.now += 1
    assert watch.check(clock.now)
    env.events.heartbeat_received.fire(client_id="master", timestamp=0)
    assert not watch.check(clock.now)
    clock.now += 30
    env.worker.sink_report = {"rows": {}}  # flushed: its events are safe, not its run
    assert not watch.check(clock.now)
    env.worker = None  # no run yet: Locust's own 60 s apply
    assert not watch.check(clock.now)


def test_a_lost_master_is_named_and_the_worker_quits_with_status_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = environment()
    watch = MasterWatch(env, lambda: env.worker, timeout_s=0.05, interval_s=0.01)
    watch.start()
    gevent.sleep(0.3)
    assert watch.lost and env.runner.quits == 1
    assert env.process_exit_code == EXIT_MASTER_LOST == 1
    err = capsys.readouterr().err
    assert err.startswith("llmload: error: lost the master 10.0.0.10:5557 (no heartbeat for 0 s)")
    assert "llmload upload-spool" in err and err.count("\n") == 1


def test_heartbeats_keep_the_worker_going() -> None:
    env = environment()
    watch = MasterWatch(env, lambda: env.worker, timeout_s=0.1, interval_s=0.01).start()
    for _ in range(30):
        env.events.heartbeat_received.fire(client_id="master", timestamp=0)
        gevent.sleep(0.01)
    assert not watch.lost and env.runner.quits == 0
    watch.lost = True  # ends its loop


def test_a_stall_of_this_process_is_not_taken_for_a_silent_master(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the watch itself slept far too long, queued heartbeats get one pass to arrive."""
    clock = Clock()
    env = environment()
    watch = MasterWatch(env, lambda: env.worker, timeout_s=10, interval_s=1, clock=clock)
    sleeps = iter([1, 30, 1])  # a normal pass, a 30 s stall, then the heartbeat was read

    def sleep(_: float) -> None:
        clock.now += next(sleeps)
        if clock.now > 131:
            watch.last_heartbeat = clock.now
            watch.lost = True  # ends the loop after this pass

    monkeypatch.setattr(gevent, "sleep", sleep)
    watch._watch()
    assert env.runner.quits == 0
