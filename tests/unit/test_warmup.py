"""Start-up work done before the first request, and the sink's yielding between slices."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import gevent

from locustfiles.sink.encode import EncodeContext
from locustfiles.sink.runtime import GeventRuntime
from locustfiles.sink.warmup import freeze_gc, warm_up


def test_warm_up_runs_the_whole_seal_path_in_memory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    seconds = warm_up(EncodeContext("run", "worker", secrets=("sk-secret",)))
    assert seconds > 0
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere


def test_freeze_gc_moves_start_up_objects_out_of_collections() -> None:
    try:
        freeze_gc()
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()


def test_pause_lets_the_loop_poll_timers_between_slices_of_work() -> None:
    """sleep(0) only runs greenlets already waiting; timers and sockets wait for the next
    poll. The sink's pause must let them in, or a long encode holds every stream."""
    fired: list[float] = []

    def ticker() -> None:
        while True:
            gevent.sleep(0.001)
            fired.append(time.perf_counter())

    runtime = GeventRuntime()
    tick = gevent.spawn(ticker)
    gevent.sleep(0.01)
    try:
        fired.clear()
        start = time.perf_counter()
        while time.perf_counter() - start < 0.05:  # 50 ms of "encoding" in 1 ms slices
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            runtime.pause()
        during = [t for t in fired if t < start + 0.05]
    finally:
        tick.kill()
    assert len(during) >= 10, during  # the 1 ms timer kept firing during the work
