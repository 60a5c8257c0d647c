"""SignalStop's three answers to repeated SIGTERM/SIGINT (locustfiles/master/signals.py), with
stand-ins for the Environment and the run; the real processes: tests/e2e/test_signals.py."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

import pytest

from locustfiles.master import signals
from locustfiles.master.signals import SignalStop, exit_status


class FakeRun:
    def __init__(self) -> None:
        self.finished_at: int | None = None
        self.stopped: list[str] = []

    def stop_for_signal(self, name: str) -> None:
        self.stopped.append(name)

    def waiting_for(self) -> str:
        return "1 worker(s) to flush their events and confirm: w1 on h1"


def test_first_stops_the_run_second_says_what_is_waited_for_third_exits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = FakeRun()
    master = SimpleNamespace(coordinator=run, distributed=lambda: True)
    env: Any = SimpleNamespace(parsed_options=SimpleNamespace(headless=True),
                               runner=SimpleNamespace(), process_exit_code=None)  # fmt: skip
    exits: list[int] = []
    monkeypatch.setattr(signals.os, "_exit", exits.append)
    stop = SignalStop(env, master)  # type: ignore[arg-type]
    stop.on_signal(signal.SIGTERM)
    assert run.stopped == ["SIGTERM"] and env.process_exit_code == 143 == exit_status(15)
    assert exits == []
    stop.on_signal(signal.SIGTERM)
    stop.on_signal(signal.SIGTERM)
    assert run.stopped == ["SIGTERM"]  # stopped once
    assert exits == [143]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("llmload: SIGTERM: stopping the run;")
    assert "waiting for 1 worker(s) to flush their events and confirm: w1 on h1" in lines[1]
    assert "exiting now" in lines[2] and "llmload upload-spool" in lines[2]


def test_sigint_exits_130() -> None:
    assert exit_status(signal.SIGINT) == 130
