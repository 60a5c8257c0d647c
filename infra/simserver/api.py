"""Routes: the OpenAI endpoints, /v1/models, /health, /version, /metrics and the prefix
cache's flush (/reset_prefix_cache, /flush_cache)."""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

from infra.simserver.config import SimConfig
from infra.simserver.engine import Engine
from infra.simserver.faults import draw_faults
from infra.simserver.generation import Generation
from infra.simserver.http import HttpConnection, Request
from infra.simserver.metrics import SimStats, render
from infra.simserver.schema import GenerationParams, Kind, RequestRejected, parse_generation
from infra.simserver.sse import ToolCall
from infra.simserver.structured import (
    CUT_BY_MAX_TOKENS,
    INVALID_ON_PURPOSE,
    Structured,
    answer_pieces,
    fit,
)
from infra.simserver.tokens import TokenText
from infra.simserver.tracing import RequestRecord, SpanExporter
from infra.simserver.truth import TruthLog
from infra.version import llmload_version

_GENERATION_ROUTES: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_GET_ROUTES = ("/health", "/version", "/v1/models", "/metrics")
_FLUSH_ROUTES = ("/reset_prefix_cache", "/flush_cache")  # vLLM's (dev mode) and SGLang's
_MAX_REQUEST_ID = 200


class SimApp:
    """Answers requests; holds the state shared by every connection of one server."""

    def __init__(
        self,
        config: SimConfig,
        engine: Engine,
        stats: SimStats,
        truth: TruthLog | None,
        tracer: SpanExporter | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.stats = stats
        self.truth = truth
        self.tracer = tracer  # None: no spans (no --otlp-traces-endpoint)
        self.served_model = config.served_model
        self.text = TokenText(config.seed)
        self.rng = random.Random(config.seed)
        self.draining = False
        self._created = 0

    # --- dispatch ---------------------------------------------------------------------------
    def handle(self, request: Request, conn: HttpConnection) -> None:
        kind = _GENERATION_ROUTES.get(request.path)
        if kind is not None:
            if request.method != "POST":
                self._method_not_allowed(conn, "POST")
                return
            self._generate(kind, request, conn)
            return
        if request.path in _FLUSH_ROUTES:
            if request.method != "POST":
                self._method_not_allowed(conn, "POST")
                return
            if self.engine.cache is not None:
                self.engine.cache.reset()
            conn.respond(200, b"", content_type="text/plain")  # as vLLM: 200, empty body
            return
        if request.path in _GET_ROUTES:
            if request.method != "GET":
                self._method_not_allowed(conn, "GET")
                return
            self._get(request, conn)
            return
        self._error(conn, RequestRejected(404, f"no route {request.path}", type_="NotFoundError"))

    def _get(self, request: Request, conn: HttpConnection) -> None:
        path = request.path
        if path == "/health":
            conn.respond(200, b"", content_type="text/plain")
        elif path == "/version":
            body = {
                "version": llmload_version(),
                "simulated": True,
                "engine": "llmload-sim",
                "profile": self.config.profile.name,
                "model": self.served_model,
            }
            conn.respond(200, json.dumps(body).encode())
        elif path == "/v1/models":
            models = []
            for name in self.config.models:
                model: dict[str, Any] = {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "llmload-sim",
                    "root": name,
                    "max_model_len": self.config.profile.max_model_len,
                }
                if name in self.config.adapters:  # as vLLM lists a LoRA adapter
                    model["parent"] = self.served_model
                models.append(model)
            conn.respond(200, json.dumps({"object": "list", "data": models}).encode())
        else:
            text = render(self.stats, self.engine, self.served_model)
            conn.respond(200, text.encode(), content_type="text/plain; version=0.0.4")

    def _method_not_allowed(self, conn: HttpConnection, allowed: str) -> None:
        error = RequestRejected(405, f"method not allowed (use {allowed})")
        conn.respond(405, error.body(), headers=[("Allow", allowed)])

    def _error(
        self, conn: HttpConnection, error: RequestRejected, request_id: str | None = None
    ) -> None:
        headers = [("X-Request-Id", request_id)] if request_id else []
        if error.status in (429, 503):
            headers.append(("Retry-After", "1"))
        conn.respond(error.status, error.body(), headers=headers, close=self.draining)

    # --- generation -------------------------------------------------------------------------
    def _request_id(self, request: Request) -> str:
        given = request.headers.get("x-request-id", "").strip()
        if given:
            return given[:_MAX_REQUEST_ID]
        return uuid.uuid4().hex

    def _reject(
        self, conn: HttpConnection, request: Request, request_id: str, error: RequestRejected
    ) -> None:
        self.stats.rejected[error.reason] += 1
        if self.truth is not None:
            self.truth.write(
                {
                    "request_id": request_id,
                    "path": request.path,
                    "status": error.status,
                    "outcome": "rejected",
                    "reason": error.reason,
                    "arrival_unix_ns": request.received_unix_ns,
                    "events": [],
                }
            )
        if self.tracer is not None:
            prefix = "chatcmpl-" if _GENERATION_ROUTES[request.path] == "chat" else "cmpl-"
            self.tracer.add(
                RequestRecord(
                    traceparent=request.headers.get("traceparent"),
                    request_id=prefix + request_id,
                    model=self.served_model,
                    arrival_unix_ns=request.received_unix_ns,
                    arrival_ns=request.received_ns,
                    scheduled_ns=0,
                    first_token_ns=0,
                    end_ns=time.perf_counter_ns(),
                    prompt_tokens=None,
                    completion_tokens=0,
                    max_tokens=None,
                    error=error.reason,
                )
            )
        self._error(conn, error, request_id)

    def reject_queue_full(self, conn: HttpConnection, request: Request, request_id: str) -> None:
        status = self.config.queue_full_status
        error = RequestRejected(
            status,
            f"the waiting queue is full ({self.config.profile.max_waiting} requests)",
            reason="queue_full",
            type_="rate_limit_error" if status == 429 else "service_unavailable",
            code="queue_full",
        )
        self._reject(conn, request, request_id, error)

    def _generate(self, kind: Kind, request: Request, conn: HttpConnection) -> None:
        request_id = self._request_id(request)
        if self.draining:
            error = RequestRejected(
                503, "the server is shutting down", reason="draining", type_="service_unavailable"
            )
            self._reject(conn, request, request_id, error)
            return
        profile = self.config.profile
        try:
            params = parse_generation(kind, request.body, self.config.models, profile.max_model_len)
        except RequestRejected as rejected:
            self._reject(conn, request, request_id, rejected)
            return
        if not self.engine.queue_has_room():
            self.reject_queue_full(conn, request, request_id)
            return
        if params.ignore_eos:
            target = params.max_tokens
        else:
            target = max(params.min_tokens, profile.output_len.sample(self.rng))
            target = min(target, params.max_tokens)
        tool_call = self._draw_tool_call(params)
        answer = self._structured(params, tool_call)
        if answer is not None:  # its JSON's length, unless ignore_eos forces the cap
            target = len(answer.pieces)
        plan = draw_faults(self.config.faults, self.rng, target)
        for name in plan.names:
            self.stats.faults[name] += 1
        if plan.error_500:
            error = RequestRejected(
                500, "injected fault: internal error", reason="fault_500", type_="server_error"
            )
            self._reject(conn, request, request_id, error)
            return
        Generation(self, conn, request, params, request_id, plan, target, tool_call,
                   answer).start()  # fmt: skip

    def _structured(self, params: GenerationParams, call: ToolCall | None) -> Structured | None:
        """The JSON answer of a structured-output request or a tool call (structured.py):
        broken on purpose at --invalid-rate; padded to max_tokens under ignore_eos, or cut by
        it (then not valid either)."""
        schema = params.tool_schema if call is not None else params.answer_schema
        if schema is None:
            return None
        parts = answer_pieces(schema, self.rng)
        rate = self.config.invalid_rate
        broken = rate > 0 and self.rng.random() < rate
        if broken:
            parts = parts[:-1]
        target = params.max_tokens if params.ignore_eos else min(len(parts), params.max_tokens)
        parts, fits = fit(parts, target)
        if broken:
            self.stats.invalid_answers += 1
        how = INVALID_ON_PURPOSE if broken else None if fits else CUT_BY_MAX_TOKENS
        return Structured(parts, how is None, how)

    def _draw_tool_call(self, params: GenerationParams) -> ToolCall | None:
        """A chat request with `tools` is answered by a tool call at `--tool-call-rate`
        (always when `tool_choice` forces one); requests without tools draw nothing."""
        if params.tool_name is None:
            return None
        if not params.tool_forced and self.rng.random() >= self.config.tool_call_rate:
            return None
        self.stats.tool_calls += 1
        return ToolCall(f"call_{self.rng.getrandbits(96):024x}", params.tool_name)
