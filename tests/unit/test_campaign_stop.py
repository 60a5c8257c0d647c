"""The campaign's stop signals (infra/campaign/stop.py): what each of three signals does."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from infra.campaign.procs import Children
from infra.campaign.report import aborted_line
from infra.campaign.stop import CampaignStopped, StopSignals

MASTER = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); " \
         "print('ready', flush=True); time.sleep(30)"  # fmt: skip


def test_a_signal_with_no_run_going_stops_at_once() -> None:
    said: list[str] = []
    stop = StopSignals(said.append)
    with pytest.raises(CampaignStopped) as stopped:
        stop._on_signal(signal.SIGINT, None)
    assert stopped.value.exit_status == 130 and stopped.value.signal_name == "SIGINT"
    assert said == []


def test_signals_pass_the_stop_to_the_master_then_say_what_is_waited_for_then_kill(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    stop = StopSignals(said.append)
    with Children(tmp_path) as children:
        master = children.start("master", [sys.executable, "-c", MASTER], {})
        sleeper = children.start(
            "worker-1", [sys.executable, "-c", "import time; time.sleep(30)"], {}
        )
        deadline = time.monotonic() + 10
        while "ready" not in children.log_path("master").read_text():
            assert master.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        with stop.watching("r1", "runs/r1", master, children, grace_s=5):
            stop._on_signal(signal.SIGTERM, None)
            assert master.wait(10) == 143  # the master got the same signal
            assert stop.stopped_at is not None and stop.deadline(1e12) <= stop.stopped_at + 5
            stop._on_signal(signal.SIGTERM, None)
            with pytest.raises(CampaignStopped) as stopped:
                stop._on_signal(signal.SIGTERM, None)
            assert sleeper.wait(10) == -signal.SIGKILL
    assert stopped.value.exit_status == 143 and stopped.value.run_id == "r1"
    assert [line.split(":")[1] for line in said] == [
        " SIGTERM",
        " SIGTERM again",
        " SIGTERM a third time",
    ]
    assert said[0].startswith("llmload: SIGTERM: stopping run r1; ")
    assert said[1] == "llmload: SIGTERM again: waiting for worker-1 of run r1 to exit; " \
        "a third signal exits at once"  # fmt: skip
    with pytest.raises(CampaignStopped):
        stop.raise_if_stopped()


def test_the_report_of_an_aborted_run_says_so() -> None:
    def report(**manifest: Any) -> Any:
        return cast(Any, SimpleNamespace(manifest=manifest))

    assert aborted_line(report(status="finished")) is None
    assert aborted_line(report(status="aborted", stopped_by="SIGTERM")) == (
        "ABORTED: the run was stopped by SIGTERM before its last step ended; "
        "its last step is cut short"
    )
