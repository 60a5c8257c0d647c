"""The llmload locustfile: `locust -f locustfiles/chat.py --host URL [options]`.

Works in the web UI, headless, and distributed (`--master` / `--worker`, `--processes N`).
Options: see `locust -f locustfiles/chat.py --help` (group "llmload") and the README.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import gevent
from locust import User, constant, events, task
from locust.exception import RPCError
from locust.runners import STATE_RUNNING, STATE_SPAWNING, LocalRunner, MasterRunner, WorkerRunner

from analysis.errors import LlmloadError
from locustfiles.live import stats as live
from locustfiles.master.coordinator import choose_run_id, worker_identity
from locustfiles.master.preflight import check_store_reachable, form_namespace, preflight
from locustfiles.master.shape import StepShape
from locustfiles.request.client import new_pool
from locustfiles.run import options as chat_options
from locustfiles.run.protocol import (
    MSG_CLOCK,
    MSG_CLOCK_OFFSET,
    MSG_CLOCK_REPLY,
    MSG_FINISH,
    MSG_FINISHED,
    MSG_HELLO,
    MSG_IN_FLIGHT,
    MSG_PROBES,
    MSG_STEP,
    MSG_STEP_QUERY,
    MSG_WORKER_FAILED,
    StepState,
)
from locustfiles.worker.context import WorkerContext, failure_for
from locustfiles.worker.masterwatch import MasterWatch

log = logging.getLogger("llmload")

__all__ = ["ChatUser", "StepShape", "setup"]


class ChatUser(User):
    """One closed-loop client: sends a request, reads it to the end, sends the next (with
    `--turns`/`--tool-rate`: runs one session at a time, turn after turn, sessions.py).

    Each user keeps one keep-alive connection pool (connections are reused); requests do not
    go through Locust's HttpSession, whose own request event would time only the headers:
    the user fires one event per request with the end-to-end time instead.
    """

    wait_time = constant(0)

    def on_start(self) -> None:
        self.pool = new_pool()

    def on_stop(self) -> None:
        self.pool.clear()

    @task
    def chat(self) -> None:
        ctx: WorkerContext | None = getattr(self.environment, "llmload_worker", None)
        if ctx is None or ctx.sink_report is not None or ctx.holding():
            gevent.sleep(0.05)  # starting, finishing, or cold requests done: send nothing
            return
        if (ctx.step.rate is not None and not ctx.step.cold) or ctx.step.paused:
            gevent.sleep(0.1)  # a rate step: the worker's dispatcher sends (openloop.py)
            return
        if ctx.options.sessions:  # one conversation (or agent session), turn after turn
            records = ctx.run_session(self.pool, None, lambda r: fire_request(self.environment, r))
            record = records[-1] if records else None
        else:
            record = ctx.run_one(self.pool)
            if record is not None:
                fire_request(self.environment, record)
        if record is None:
            return
        if record.error_kind == "connect":
            gevent.sleep(0.5)  # a dead server must not make this loop spin


def fire_request(environment: Any, record: Any) -> None:
    """Locust's request event for one finished request (its statistics, its web UI)."""
    environment.events.request.fire(
        request_type=record.endpoint,
        name=record.scenario,
        response_time=(record.end_ns or 0) / 1e6,
        response_length=sum(record.chunk_chars),
        exception=failure_for(record),
        context={"request_id": record.request_id, "step": record.step},
    )


def _is_master(runner: Any) -> bool:
    return isinstance(runner, MasterRunner | LocalRunner)


def _is_worker(runner: Any) -> bool:
    return isinstance(runner, WorkerRunner | LocalRunner)


def setup(environment: Any) -> None:
    """Wire llmload into an Environment (called from Locust's init event)."""
    runner = environment.runner
    environment.llmload_step = StepState()
    environment.llmload_worker = None
    environment.llmload_coordinator = None
    live.setup(environment)  # llmload_live (master), llmload_recorder (worker), /llmload/metrics
    if _is_master(runner) and environment.parsed_options is not None:
        parsed = environment.parsed_options
        try:
            options = chat_options.from_parsed(parsed)
            if getattr(parsed, "headless", False) or getattr(parsed, "autostart", False):
                # everything the options refer to, before any user starts (preflight.py)
                run_id = choose_run_id(environment, options.run_id)
                environment.llmload_pending_probes = preflight(
                    options, environment.host or "", run_id,
                    sends_requests=not isinstance(runner, MasterRunner),
                )  # fmt: skip
                environment.llmload_next_run_id = run_id
            elif not environment.host:
                raise LlmloadError(
                    "no target: give --host URL (the server's base URL, e.g. http://127.0.0.1:8000)"
                )
        except LlmloadError as exc:
            print(f"llmload: error: {exc}", file=sys.stderr)
            sys.exit(2)
        if getattr(environment, "web_ui", None) is not None:
            _check_web_ui_starts(environment)

    if _is_master(runner):
        runner.register_message(MSG_STEP_QUERY, _on_step_query)
        if isinstance(runner, MasterRunner):
            runner.register_message(MSG_WORKER_FAILED, _on_worker_failed)
            runner.register_message(MSG_HELLO, _on_hello)
            runner.register_message(MSG_FINISHED, _on_finished)
            runner.register_message(MSG_CLOCK_REPLY, _on_clock_reply)
            runner.register_message(MSG_PROBES, _on_probes)
            runner.register_message(MSG_IN_FLIGHT, _on_in_flight)
        environment.events.spawning_complete.add_listener(
            lambda user_count, **_: _with_coordinator(
                environment, lambda c: c.on_spawning_complete(user_count)
            )
        )
    if _is_worker(runner):
        runner.register_message(MSG_STEP, _on_step)
        if isinstance(runner, WorkerRunner):
            runner.register_message(MSG_FINISH, _on_finish, concurrent=True)
            runner.register_message(MSG_CLOCK, _on_clock)  # inline: answers at once
            runner.register_message(MSG_CLOCK_OFFSET, _on_clock_offset)
            MasterWatch(environment).start()  # a lost master: stop, flush, exit non-zero
        environment.events.test_start.add_listener(lambda **_: _start_worker(environment))
        environment.events.quitting.add_listener(lambda **_: _close_worker(environment))
        if getattr(runner, "worker_state", None) in (STATE_SPAWNING, STATE_RUNNING):
            # A worker that joins a running test connects before this init event: the
            # master's first spawn can come first, and test_start has then fired without
            # this listener (its share of a rate step would never be sent). Start now.
            _start_worker(environment)
    environment.events.test_stop.add_listener(lambda **_: _on_test_stop(environment))
    if isinstance(runner, MasterRunner):
        environment.events.quitting.add_listener(lambda **_: _finish_on_quit(environment))
    if _is_master(runner) and environment.parsed_options is not None:
        _add_live_views(environment)  # after _on_test_stop: the report needs the finish


def _add_live_views(environment: Any) -> None:
    """The LLM tab (web UI), the step lines (headless), the report at the end of a run."""
    from locustfiles.live import console, endreport, webtab

    if getattr(environment, "web_ui", None) is not None:
        webtab.register(environment)
    parsed = environment.parsed_options
    if getattr(parsed, "headless", False) or getattr(parsed, "autostart", False):
        console.register(environment)
    endreport.register(environment)


def _with_coordinator(environment: Any, fn: Any) -> None:
    coordinator = getattr(environment, "llmload_coordinator", None)
    if coordinator is not None:
        fn(coordinator)


def _on_step(environment: Any, msg: Any, **_: Any) -> None:
    runner = environment.runner  # a worker's share of a rate step is keyed by its client id
    client_id = runner.client_id if isinstance(runner, WorkerRunner) else None
    environment.llmload_step.update(msg.data, client_id)


def _on_in_flight(environment: Any, msg: Any, **_: Any) -> None:
    data = msg.data if isinstance(msg.data, dict) else {}
    _with_coordinator(environment, lambda c: c.on_in_flight(msg.node_id, data))


def _on_step_query(environment: Any, msg: Any, **_: Any) -> None:
    _with_coordinator(environment, lambda c: c.answer_step_query(msg.node_id))


def _on_hello(environment: Any, msg: Any, **_: Any) -> None:
    _with_coordinator(environment, lambda c: c.on_hello(msg.node_id, msg.data))


def _on_finished(environment: Any, msg: Any, **_: Any) -> None:
    _with_coordinator(environment, lambda c: c.on_finished(msg.node_id, msg.data))


def _on_clock(environment: Any, msg: Any, **_: Any) -> None:
    """Worker: answer the master's clock exchange with this worker's wall time at receipt."""
    t2 = time.time_ns()
    data = msg.data if isinstance(msg.data, dict) else {}
    try:
        environment.runner.send_message(MSG_CLOCK_REPLY, {"t1": data.get("t1"), "t2": t2})
    except RPCError:
        log.warning("llmload: could not answer the master's clock exchange")


def _on_clock_offset(environment: Any, msg: Any, **_: Any) -> None:
    """Worker: the master's best estimate of this worker's clock offset (open-loop starts)."""
    data = msg.data if isinstance(msg.data, dict) else {}
    if isinstance(data.get("offset_ns"), int):
        environment.llmload_step.offset_ns = data["offset_ns"]


def _on_clock_reply(environment: Any, msg: Any, **_: Any) -> None:
    t4 = time.time_ns()
    data = msg.data if isinstance(msg.data, dict) else {}
    _with_coordinator(environment, lambda c: c.on_clock_reply(msg.node_id, data, t4))


def _on_probes(environment: Any, msg: Any, **_: Any) -> None:
    data = msg.data if isinstance(msg.data, dict) else {}
    _with_coordinator(environment, lambda c: c.add_probes(data.get("probes") or []))


def _probe_reporter(environment: Any) -> Any:
    """Where a worker's probes go: to the master by message, or straight to the local run."""
    runner = environment.runner
    if isinstance(runner, WorkerRunner):

        def send(probes: list[dict[str, Any]]) -> None:
            try:
                runner.send_message(MSG_PROBES, {"probes": probes})
            except RPCError:  # they travel again with the finish report
                log.warning("llmload: could not send the probes to the master")

        return send
    return lambda probes: _with_coordinator(environment, lambda c: c.add_probes(probes))


def _in_flight_reporter(runner: Any) -> Any:
    """A worker's report of its open-loop requests in flight while a search drains (the
    local runner's master reads its dispatcher directly)."""
    if not isinstance(runner, WorkerRunner):
        return None
    return lambda pause_id, n: runner.send_message(
        MSG_IN_FLIGHT, {"pause_id": pause_id, "in_flight": n}
    )


def _check_web_ui_starts(environment: Any) -> None:
    """Web UI: run the preflight on the start form's values; refuse to start on a problem.

    Locust's form shows the `message` of a `/swarm` answer whose `success` is false.
    """
    from flask import jsonify, request

    @environment.web_ui.app.before_request
    def _swarm_preflight() -> Any:
        if request.method != "POST" or not (request.endpoint or "").endswith("swarm"):
            return None
        if environment.runner.state in ("spawning", "running"):
            return None  # editing a run that is going: it passed its preflight
        host = str(request.form.get("host") or environment.host or "")
        try:
            parsed = form_namespace(environment.parsed_options, request.form)
            options = chat_options.from_parsed(parsed)
            run_id = choose_run_id(environment, options.run_id)
            probes = preflight(options, host, run_id,
                               sends_requests=not isinstance(environment.runner, MasterRunner))  # fmt: skip
        except LlmloadError as exc:
            log.error("llmload: error: %s", exc)
            return jsonify({"success": False, "message": f"llmload: {exc}", "host": host})
        environment.llmload_next_run_id = run_id
        environment.llmload_pending_probes = probes
        return None


def _start_worker(environment: Any) -> None:
    runner = environment.runner
    identity = worker_identity()
    try:
        options = chat_options.from_parsed(environment.parsed_options)
        run_id = environment.parsed_options.run_id
        check_store_reachable(options, run_id)
        ctx = WorkerContext(
            options,
            run_id,
            identity,
            environment.host or "",
            getattr(runner, "worker_index", 0) or 0,
            environment.llmload_step,
            report_probes=_probe_reporter(environment),
            live=environment.llmload_recorder,
            on_record=lambda record: fire_request(environment, record),
            report_in_flight=_in_flight_reporter(runner),
        )
    except LlmloadError as exc:  # this worker cannot send: the run must not go on without it
        _worker_cannot_start(environment, identity, str(exc))
        return
    except Exception as exc:  # e.g. its spool directory: the same, with the exception named
        # one line names the cause (_worker_cannot_start); the traceback only at debug level
        log.debug("llmload: worker start-up failed", exc_info=True)
        _worker_cannot_start(environment, identity, f"{type(exc).__name__}: {exc}")
        return
    environment.llmload_worker = ctx
    if isinstance(runner, WorkerRunner):
        runner.send_message(MSG_HELLO, ctx.identity)
        runner.send_message(MSG_STEP_QUERY, {})


def _worker_cannot_start(environment: Any, identity: dict[str, Any], cause: str) -> None:
    """Tell the master (or, in one process, stop the run) and exit non-zero."""
    runner = environment.runner
    line = f"worker {identity['worker_id']} on {identity['host']} cannot start: {cause}"
    print(f"llmload: error: {line}", file=sys.stderr, flush=True)
    environment.process_exit_code = 2
    if isinstance(runner, WorkerRunner):
        try:
            runner.send_message(MSG_WORKER_FAILED, {**identity, "error": cause})
        except RPCError:
            log.error("llmload: could not tell the master that this worker cannot start")
    gevent.spawn_later(0.2, runner.quit)


def _on_worker_failed(environment: Any, msg: Any, **_: Any) -> None:
    """Master: a worker cannot start (its tokenizer, dataset or store): stop the run."""
    data = msg.data if isinstance(msg.data, dict) else {}
    print(
        f"llmload: error: worker {data.get('worker_id', msg.node_id)} on {data.get('host', '?')} "
        f"cannot start: {data.get('error', 'unknown cause')}; the run is stopped",
        file=sys.stderr,
        flush=True,
    )
    environment.process_exit_code = 2
    gevent.spawn(environment.runner.quit)


def _close_worker(environment: Any) -> dict[str, Any] | None:
    ctx: WorkerContext | None = environment.llmload_worker
    if ctx is None:
        return None
    return ctx.close(ctx.options.finish_timeout)


def _on_finish(environment: Any, msg: Any, **_: Any) -> None:
    """Worker: the master is ending the run: stop users, flush events, acknowledge."""
    runner = environment.runner
    if runner.state not in ("stopped", "ready", "cleanup"):
        runner.stop()
    report = _close_worker(environment) or {"worker_id": None, "sink": None}
    runner.send_message(MSG_FINISHED, report)


def _on_test_stop(environment: Any) -> None:
    runner = environment.runner
    local_report = _close_worker(environment) if _is_worker(runner) else None
    if _is_master(runner):
        if isinstance(runner, LocalRunner):  # one process: the local worker's report, if any
            local_report = local_report or {"worker_id": None, "sink": None}
        _with_coordinator(
            environment,
            lambda c: c.finish(local_report if isinstance(runner, LocalRunner) else None),
        )


def _finish_on_quit(environment: Any) -> None:
    """Locust can quit a distributed run without firing test_stop (its last worker went
    missing while the shape ended): finish the run now, so that its manifest gets its end
    and the exit status its verdict (quitting fires before Locust picks the status)."""
    _with_coordinator(environment, lambda c: c.finish(None))


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_: Any) -> None:
    chat_options.add_arguments(parser)


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    setup(environment)
