"""The llmload locustfile: `locust -f locustfiles/chat.py --host URL [options]`.

Works in the web UI, headless, and distributed (`--master` / `--worker`, `--processes N`).
Options: see `locust -f locustfiles/chat.py --help` (group "llmload") and the README.

This file only wires the rooms together (docs/architecture.md): at Locust's init it makes
one `Llmload` per Environment (the live Board, the MasterSide, the WorkerSide), passes each
piece the others it needs, and registers their handlers with Locust.
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass
from typing import Any

import gevent
from locust import User, constant, events, task
from locust.runners import STATE_RUNNING, STATE_SPAWNING, LocalRunner, MasterRunner, WorkerRunner

from analysis.kernel.errors import LlmloadError, UsageError
from locustfiles.live import wiring as live_wiring
from locustfiles.live.board import Board
from locustfiles.master.preflight import form_namespace, preflight, run_id_taken
from locustfiles.master.shape import StepShape
from locustfiles.master.side import MasterSide
from locustfiles.master.signals import SignalStop
from locustfiles.options import options as chat_options
from locustfiles.request.adapters import BUILTIN_ADAPTERS, Delta, StreamAdapter
from locustfiles.request.client import new_pool
from locustfiles.request.stream import StreamFailure
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
)
from locustfiles.run.secrets import redact_logs, run_secrets
from locustfiles.run.service import Ask, Http, HttpRequest, Service
from locustfiles.worker.context import failure_for
from locustfiles.worker.masterwatch import MasterWatch
from locustfiles.worker.side import WorkerSide

log = logging.getLogger("llmload")

__all__ = [
    # the extension interface (docs/extending.md)
    "Ask",
    "Delta",
    "Http",
    "HttpRequest",
    "LlmUser",
    "StreamAdapter",
    "StreamFailure",
    # the built-in user and the wiring
    "ChatUser",
    "Llmload",
    "StepShape",
    "setup",
]


@dataclass
class Llmload:
    """llmload's pieces for one Environment (`environment.llmload`, the one attribute llmload
    sets on it: Locust makes the users, which get nothing but the Environment)."""

    board: Board
    master: MasterSide | None  # master and local runner
    worker: WorkerSide  # workers and the local runner; idle on a master with workers


class LlmUser(Service, User):
    """llmload's user: one closed-loop client that sends a request, reads it to the end and
    sends the next (with `--turns`/`--tool-rate`: one session at a time, turn after turn).

    Subclass it in your own locustfile to load-test any LLM service (docs/extending.md):
    override `build_request` (what to send), `stream_adapter` (how to read the answer) and
    `login` (a per-user start-up step), and set `endpoint` (the requests' name). Everything
    else (the rows, the live tab, the report, open loop, sessions, verdicts) works unchanged.
    Import this class alone into your locustfile (Locust runs every user class it finds
    there: `from locustfiles.chat import LlmUser`, not `import *`).

    Each user keeps one keep-alive connection pool (connections are reused); requests do not
    go through Locust's HttpSession, whose own request event would time only the headers:
    the user fires one event per request with the end-to-end time instead.
    """

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        self.pool = new_pool()

    def on_stop(self) -> None:
        self.pool.clear()

    # -- the hooks' defaults: the built-in --endpoint ------------------------------------
    def build_request(self, ask: Ask) -> HttpRequest:
        ctx = self.environment.llmload.worker.context
        target = ctx.target
        body = target.body(ask.prompt, ask.messages, ask.max_tokens, ask.stream,
                           model=ask.model, tools=ask.tools)  # fmt: skip
        return HttpRequest(ctx.options.path, body)

    def stream_adapter(self) -> StreamAdapter | None:
        ctx = self.environment.llmload.worker.context
        adapter = BUILTIN_ADAPTERS.get(ctx.options.endpoint)
        return None if adapter is None else adapter()

    def endpoint_name(self) -> str | None:
        if type(self).endpoint:
            return type(self).endpoint
        return None if not own_request(type(self)) else type(self).__name__.lower()

    @task
    def chat(self) -> None:
        ctx = self.environment.llmload.worker.context
        if ctx is None or ctx.sink_report is not None or ctx.holding():
            gevent.sleep(0.05)  # starting, finishing, or cold requests done: send nothing
            return
        if (ctx.step.rate is not None and not ctx.step.cold) or ctx.step.paused:
            gevent.sleep(0.1)  # a rate step: the worker's dispatcher sends (openloop.py)
            return
        ctx.ensure_ready(self.pool)  # the probes, once: not in flight, no pause waits for them
        if ctx.step.paused or ctx.halted is not None:  # the last step ended meanwhile
            return
        service = self if own_hooks(type(self)) else None  # None: the built-in fast path
        ctx.busy += 1  # in flight: a pause (the end of the last step) waits for it
        try:
            if ctx.options.sessions:  # one conversation (or agent session), turn after turn
                records = ctx.run_session(
                    self.pool, None, lambda r: fire_request(self.environment, r), service
                )
                record = records[-1] if records else None
            else:
                record = ctx.run_one(self.pool, service=service)
                if record is not None:
                    fire_request(self.environment, record)
        finally:
            ctx.busy -= 1
        if record is None:
            return
        if record.error_kind == "connect":
            gevent.sleep(0.5)  # a dead server must not make this loop spin


class ChatUser(LlmUser):
    """The built-in user: OpenAI chat, completions, Responses or Messages (--endpoint)."""


_HOOKS = ("login", "build_request", "stream_adapter")


@functools.cache  # a class's answer, once: the closed loop asks before every request
def own_hooks(cls: type) -> bool:
    """Whether a user class overrides any hook or names its endpoint: its requests go by
    its hooks (else the built-in endpoint's fast path)."""
    return bool(getattr(cls, "endpoint", None)) or any(
        getattr(cls, h) is not getattr(LlmUser, h) for h in _HOOKS
    )


@functools.cache
def own_request(cls: type) -> bool:
    """Whether a user class says itself what to send or how to read it: then it speaks to a
    service of its own, which the OpenAI probes and preflight checks do not ask."""
    return any(getattr(cls, h) is not getattr(LlmUser, h) for h in _HOOKS[1:])


def service_classes(environment: Any) -> list[type[LlmUser]]:
    """The locustfile's user classes with hooks of their own."""
    return [c for c in environment.user_classes or []
            if isinstance(c, type) and issubclass(c, LlmUser) and own_hooks(c)]  # fmt: skip


def _services(environment: Any) -> Any:
    """The open loop's users (one per keep-alive pool): the first class with hooks of its
    own, or None (the built-in endpoint)."""
    classes = service_classes(environment)
    if not classes:
        return None
    cls = classes[0]
    return lambda: cls(environment)


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


def setup(environment: Any) -> Llmload:
    """Wire llmload into an Environment (called from Locust's init event)."""
    runner = environment.runner
    board = Board()
    live = live_wiring.setup(environment, board)  # board.stats on the master, /llmload/metrics
    worker = WorkerSide(environment, live.recorder, lambda r: fire_request(environment, r),
                        services=_services(environment))  # fmt: skip
    master = MasterSide(environment, board, worker.in_flight) if _is_master(runner) else None
    if master is not None:
        worker.local_probes = master.local_ready  # one process: the worker's probes, directly
    environment.llmload = Llmload(board, master, worker)
    if environment.shape_class is None and environment.parsed_options is not None:
        # a user's own locustfile (docs/extending.md) imports LlmUser, not the shape: the
        # staircase is llmload's all the same (Locust gives a shape its runner when it makes
        # the runner, which is before this init event)
        shape = StepShape()
        shape.runner = runner
        environment.shape_class = shape
    if isinstance(environment.shape_class, StepShape):
        environment.shape_class.master = master
    if master is not None and environment.parsed_options is not None:
        master.start_otlp()  # the engine's spans, before the first run (--otlp-listen)
        _preflight_at_start(environment, master)  # after: a failed bind leaves no manifest
    if master is not None:
        runner.register_message(MSG_STEP_QUERY, master.on_step_query)
        if isinstance(runner, MasterRunner):
            runner.register_message(MSG_WORKER_FAILED, master.on_worker_failed)
            runner.register_message(MSG_HELLO, master.on_hello)
            runner.register_message(MSG_FINISHED, master.on_finished)
            runner.register_message(MSG_CLOCK_REPLY, master.on_clock_reply)
            runner.register_message(MSG_PROBES, master.on_probes)
            runner.register_message(MSG_IN_FLIGHT, master.on_in_flight)
        environment.events.spawning_complete.add_listener(
            lambda user_count, **_: master.with_coordinator(
                lambda c: c.on_spawning_complete(user_count)
            )
        )
    if _is_worker(runner):
        runner.register_message(MSG_STEP, worker.on_step)
        if isinstance(runner, WorkerRunner):
            runner.register_message(MSG_FINISH, worker.on_finish, concurrent=True)
            runner.register_message(MSG_CLOCK, worker.on_clock)  # inline: answers at once
            runner.register_message(MSG_CLOCK_OFFSET, worker.on_clock_offset)
            # a lost master: stop, flush, exit non-zero
            MasterWatch(environment, lambda: worker.context).start()
        environment.events.test_start.add_listener(lambda **_: worker.start())
        environment.events.quitting.add_listener(lambda **_: worker.on_quitting())
        if getattr(runner, "worker_state", None) in (STATE_SPAWNING, STATE_RUNNING):
            # A worker that joins a running test connects before this init event: the
            # master's first spawn can come first, and test_start has then fired without
            # this listener (its share of a rate step would never be sent). Start now.
            worker.start()
    environment.events.test_stop.add_listener(
        lambda **_: _on_test_stop(environment, master, worker)
    )
    if isinstance(runner, MasterRunner) and master is not None:
        # Locust can quit a distributed run without firing test_stop (its last worker went
        # missing while the shape ended): finish the run now, so that its manifest gets its
        # end and the exit status its verdict (quitting fires before Locust picks the status)
        environment.events.quitting.add_listener(lambda **_: master.finish(None))
    if master is not None and environment.parsed_options is not None:
        _add_live_views(environment, board)  # after _on_test_stop: the report needs the finish
        parsed = environment.parsed_options
        if getattr(parsed, "headless", False) or getattr(parsed, "autostart", False):
            # SIGTERM, SIGINT: stop, flush, exit 143/130 (the web UI keeps Locust's handling)
            SignalStop(environment, master).install()
    return environment.llmload


def _preflight_at_start(environment: Any, master: MasterSide) -> None:
    """Headless or autostart: everything the options refer to, before any user starts."""
    parsed = environment.parsed_options
    runner = environment.runner
    try:
        options = chat_options.from_parsed(parsed)
        redact_logs(run_secrets(options.api_key_env))  # before any request
        if getattr(parsed, "headless", False) or getattr(parsed, "autostart", False):
            run_id = master.choose_run_id(options.run_id, run_id_taken(options))
            probes = preflight(options, environment.host or "", run_id,
                               sends_requests=not isinstance(runner, MasterRunner),
                               service=_preflight_service(environment, options))  # fmt: skip
            master.prepared(run_id, probes)
        elif not environment.host:
            raise LlmloadError(
                "no target: give --host URL (the server's base URL, e.g. http://127.0.0.1:8000)"
            )
    except LlmloadError as exc:
        print(f"llmload: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if getattr(environment, "web_ui", None) is not None:
        _check_web_ui_starts(environment, master)


def _preflight_service(environment: Any, options: Any) -> Service | None:
    """The user whose hooks the preflight's first request goes by: one of the first class
    that says itself what to send (None: the built-in endpoint's checks). An open loop
    sends with one class: a locustfile with several is refused (UsageError)."""
    classes = service_classes(environment)
    if options.mode == "rate" and len({c for c in classes}) > 1:
        names = ", ".join(c.__name__ for c in classes)
        raise UsageError(f"--rates sends every arrival by one user class; this locustfile has "
                         f"{names}: keep one (or run each in its own run)")  # fmt: skip
    own = [c for c in classes if own_request(c)]
    return own[0](environment) if own else None


def _add_live_views(environment: Any, board: Board) -> None:
    """The LLM tab (web UI), the step lines (headless), the report at the end of a run."""
    from locustfiles.live import console, endreport, webtab

    reports = endreport.Reports()
    if getattr(environment, "web_ui", None) is not None:
        webtab.register(environment, board, reports)
    parsed = environment.parsed_options
    if getattr(parsed, "headless", False) or getattr(parsed, "autostart", False):
        console.register(environment, board)
    endreport.register(environment, board, reports)  # last: after the step lines' flush


def _check_web_ui_starts(environment: Any, master: MasterSide) -> None:
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
            redact_logs(run_secrets(options.api_key_env))
            run_id = master.choose_run_id(options.run_id, run_id_taken(options))
            probes = preflight(options, host, run_id,
                               sends_requests=not isinstance(environment.runner, MasterRunner),
                               service=_preflight_service(environment, options))  # fmt: skip
        except LlmloadError as exc:
            log.error("llmload: error: %s", exc)
            return jsonify({"success": False, "message": f"llmload: {exc}", "host": host})
        master.prepared(run_id, probes)
        return None


def _on_test_stop(environment: Any, master: MasterSide | None, worker: WorkerSide) -> None:
    runner = environment.runner
    local_report = worker.close() if _is_worker(runner) else None
    if master is not None:
        if isinstance(runner, LocalRunner):  # one process: the local worker's report, if any
            master.finish(local_report or {"worker_id": None, "sink": None})
        else:
            master.finish(None)


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_: Any) -> None:
    chat_options.add_arguments(parser)


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    setup(environment)
