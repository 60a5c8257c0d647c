"""Live statistics wired into Locust: worker reports in, the master's merge, /llmload/metrics.

With every Locust stats report (`report_to_master`, every ~3 s) a worker sends its Recorder's
delta under the key `llmload_live`; at test_stop it sends the last one as a message (Locust's
"stop" sends no final stats report; it arrives before the worker's llmload_finished). The
master (`worker_report`) merges each into its LiveStats. The local runner observes straight
into the master's LiveStats (no messages).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from locustfiles.live.board import Board
from locustfiles.live.groups import Observer, Recorder
from locustfiles.live.metrics import register_endpoint
from locustfiles.live.stats import LiveStats

log = logging.getLogger("llmload.live")

REPORT_KEY = "llmload_live"  # key of a worker's delta in Locust's stats report
MSG_LIVE = "llmload_live"  # worker -> master at test_stop: the last delta


@dataclass
class Live:
    """What `setup` made: the master's statistics (None on a worker) and where a worker
    observes each request (its Recorder, or the local runner's LiveStats)."""

    stats: LiveStats | None
    recorder: Observer | None


def setup(environment: Any, board: Board) -> Live:
    """Register the live statistics on an Environment (from chat.setup, at init).

    Master and local runner: a LiveStats (also `board.stats`), merged from worker reports,
    and `GET /llmload/metrics` on the web UI. Worker and local runner: the Observer that the
    WorkerContext observes each request into (a Recorder; the local runner's LiveStats).
    """
    from locust.runners import LocalRunner, MasterRunner, WorkerRunner

    runner = environment.runner
    live = Live(None, None)
    if isinstance(runner, MasterRunner | LocalRunner):
        stats = LiveStats(runner, lambda: board.run)
        live.stats = board.stats = stats
        environment.events.test_start.add_listener(lambda **_: stats.start_sampler())
        environment.events.quitting.add_listener(lambda **_: stats.stop_sampler())
        if isinstance(runner, LocalRunner):
            live.recorder = stats
        else:
            environment.events.worker_report.add_listener(
                lambda client_id, data, **_: _on_worker_report(stats, client_id, data)
            )
            runner.register_message(
                MSG_LIVE, lambda environment, msg, **_: stats.merge(msg.data, msg.node_id)
            )
        if getattr(environment, "web_ui", None) is not None:
            register_endpoint(environment.web_ui, stats)
    if isinstance(runner, WorkerRunner):
        recorder = Recorder()
        live.recorder = recorder
        environment.events.test_start.add_listener(lambda **_: recorder.take(None))
        environment.events.report_to_master.add_listener(
            lambda client_id, data, **_: _on_report_to_master(environment, recorder, data)
        )
        environment.events.test_stop.add_listener(lambda **_: _send_last(environment, recorder))
    return live


def _on_report_to_master(environment: Any, recorder: Recorder, data: dict[str, Any]) -> None:
    parsed = getattr(environment, "parsed_options", None)
    delta = recorder.take(getattr(parsed, "run_id", None))
    if delta is not None:
        data[REPORT_KEY] = delta


def _on_worker_report(live: LiveStats, client_id: str, data: dict[str, Any]) -> None:
    delta = data.get(REPORT_KEY) if isinstance(data, dict) else None
    if delta is not None:
        live.merge(delta, source=client_id)


def _send_last(environment: Any, recorder: Recorder) -> None:
    """Worker, at test_stop (its users stopped, in-flight ones recorded): the last delta."""
    from locust.exception import RPCError

    parsed = getattr(environment, "parsed_options", None)
    delta = recorder.take(getattr(parsed, "run_id", None))
    if delta is None:
        return
    try:
        environment.runner.send_message(MSG_LIVE, delta)
    except RPCError:
        log.warning("llmload: could not send the last live statistics to the master")
