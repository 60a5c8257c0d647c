"""One generation request from admission to its last byte: the engine's sink for that
sequence and the writer of its response (streamed SSE or a whole JSON body)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import TYPE_CHECKING, Any, Protocol

from infra.simserver.apis import MessagesEncoder, ResponsesEncoder
from infra.simserver.engine import Engine, SeqState, Sequence
from infra.simserver.faults import FaultPlan
from infra.simserver.http import CHUNKED_END, HttpConnection, Request, frame_chunk
from infra.simserver.schema import GenerationParams
from infra.simserver.sse import MALFORMED, ChunkEncoder, ToolCall
from infra.simserver.structured import Structured
from infra.simserver.tracing import RequestRecord

if TYPE_CHECKING:
    from infra.simserver.config import SimConfig
    from infra.simserver.metrics import SimStats
    from infra.simserver.tokens import TokenText
    from infra.simserver.tracing import SpanExporter
    from infra.simserver.truth import TruthLog


class Server(Protocol):
    """What a generation uses of the server that admitted it (api.SimApp)."""

    config: SimConfig
    engine: Engine
    stats: SimStats
    truth: TruthLog | None
    tracer: SpanExporter | None
    served_model: str
    text: TokenText
    rng: random.Random

    def reject_queue_full(
        self, conn: HttpConnection, request: Request, request_id: str
    ) -> None: ...


Encoder = ChunkEncoder | ResponsesEncoder | MessagesEncoder
"""A stream's encoder: opening(), deltas(text, tokens), closing(...), set_cached(n)."""

_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-", "responses": "resp_",
              "messages": "msg_"}  # fmt: skip


class _Ended:
    """The sink of a sequence whose request has ended: tokens after that are ignored."""

    def on_token(self, seq: Sequence, done: bool, more: bool = False) -> None:
        pass


_ENDED = _Ended()


class Generation:
    def __init__(
        self,
        app: Server,
        conn: HttpConnection,
        request: Request,
        params: GenerationParams,
        request_id: str,
        plan: FaultPlan,
        target_tokens: int,
        tool_call: ToolCall | None = None,
        answer: Structured | None = None,
    ) -> None:
        self.app = app
        self.conn = conn
        self.request = request
        self.params = params
        self.request_id = request_id
        self.plan = plan
        self.tool_call = tool_call  # the answer is this tool call (arguments: the output)
        self.answer = answer  # a JSON answer or tool call's arguments (structured.py)
        plan_reasoning = app.config.reasoning_tokens
        # the answer's first tokens that are reasoning (a tool call has none here)
        self.reasoning = (
            plan_reasoning.sample(app.rng)
            if plan_reasoning is not None and not tool_call and answer is None
            else 0
        )
        self.response_id = _ID_PREFIX[params.kind] + request_id
        self.created = int(time.time())
        self.text_pos = app.rng.randrange(app.text.period)
        self.text_start = self.text_pos
        self.model = params.model or app.served_model
        cost, overhead = app.config.model_cost(self.model)
        self.seq = Sequence(
            self,
            params.prompt_tokens,
            params.max_tokens,
            target_tokens,
            stall_at=plan.stall_at,
            stall_seconds=plan.stall_seconds,
            prompt=params.prompt,
            output_tokens=self._output_tokens,
            cost=cost,
            overhead=overhead,
        )
        self.pending = 0
        self.per_event = app.config.tokens_per_event
        self.k = self.per_event.sample(app.rng)
        self.encoder: Encoder | None = None
        self.events: list[list[int]] | None = [] if app.truth is not None else None
        self.headers_offset_ns: int | None = None
        self.status = 200
        # time.perf_counter_ns() of the first token and of the end (last token, or when the
        # request failed or was cancelled); 0 until then. The truth log's event written
        # at that moment carries the same reading.
        self.first_token_ns = 0
        self.end_ns = 0
        self._timer: asyncio.TimerHandle | None = None
        self._usage_cached = False  # the encoder knows cached_tokens

    def _output_tokens(self, count: int) -> list[str]:
        """The first `count` generated tokens (words), for the prefix cache."""
        return self.app.text.text(self.text_start, count).decode().split()

    def _text(self, start: int, count: int) -> bytes:
        """`count` tokens of the answer from its token `start` (0: its first): the JSON
        answer's own (structured.py), else the text source's."""
        if self.answer is not None:
            return "".join(self.answer.pieces[start : start + count]).encode()
        return self.app.text.text(self.text_start + start, count)

    def _finish_reason(self, seq: Sequence) -> str:
        return "tool_calls" if self.tool_call is not None else seq.finish_reason or "length"

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.conn.on_lost = self._on_lost
        if self.plan.slow_header:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.plan.slow_header, self._enter)
        else:
            self._enter()

    def _enter(self) -> None:
        self._timer = None
        app = self.app
        if self.conn.closed:
            return
        if not app.engine.submit(self.seq):
            self.conn.on_lost = None
            app.reject_queue_full(self.conn, self.request, self.request_id)
            self.seq.sink = _ENDED  # never admitted: no cycle left for the collector
            self.seq.output_tokens = None
            return
        if not self.params.stream:
            return
        self.encoder = self._encoder()
        head = self.conn.start_stream(200, "text/event-stream", self._headers())
        events = self.encoder.opening()
        self._write(head, events, [0] * len(events), headers=True)

    def _encoder(self) -> Encoder:
        params = self.params
        if params.kind == "responses":
            return ResponsesEncoder(self.response_id, self.model, params.prompt_tokens,
                                    self.tool_call, self.reasoning)  # fmt: skip
        if params.kind == "messages":
            return MessagesEncoder(self.response_id, self.model, params.prompt_tokens,
                                   self.tool_call, self.reasoning)  # fmt: skip
        return ChunkEncoder(params.kind, self.response_id, self.created, self.model,
                            params.prompt_tokens, params.continuous_usage, self.tool_call,
                            self.reasoning)  # fmt: skip

    def _headers(self) -> list[tuple[str, str]]:
        return [("X-Request-Id", self.request_id), ("Cache-Control", "no-cache")]

    def _on_lost(self) -> None:
        """The client went away: the sequence leaves the engine at once."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self.app.stats.cancelled += 1
        else:
            self.app.engine.cancel(self.seq)
        self._log("cancelled")

    # --- engine sink ------------------------------------------------------------------------
    def on_token(self, seq: Sequence, done: bool, more: bool = False) -> None:
        self.pending += 1
        generated = seq.generated
        plan = self.plan
        now_ns = 0  # a reading to share with the event written now (0: take one then)
        if generated == 1:
            now_ns = self.first_token_ns = time.perf_counter_ns()
        if done:
            now_ns = self.end_ns = now_ns or time.perf_counter_ns()
        if not self.params.stream:
            if done:
                self._finish_whole(seq)
            elif generated == plan.drop_at:
                self._drop()
            return
        if (
            not done
            and (self.pending < self.k or more)  # a step's tokens go in one event
            and generated != plan.malformed_at
            and generated != plan.drop_at
            and generated != self.reasoning  # no event holds reasoning and answer both
        ):
            return
        encoder = self.encoder
        assert encoder is not None
        if not self._usage_cached:
            encoder.set_cached(seq.cached_tokens or 0)
            self._usage_cached = True
        text = self._text(self.text_pos - self.text_start, self.pending)
        if self.answer is not None:  # JSON's quotes, escaped for the event's own JSON string
            text = json.dumps(text.decode())[1:-1].encode()
        self.text_pos += self.pending
        events = encoder.deltas(text, generated, generated <= self.reasoning)
        tokens = [0] * (len(events) - 1)
        tokens.append(self.pending)
        self.pending = 0
        if self.per_event.low != self.per_event.high:
            self.k = self.per_event.sample(self.app.rng)
        if generated == plan.malformed_at and not done:
            events.append(MALFORMED)
            tokens.append(0)
        if done:
            thought = min(self.reasoning, generated)
            whole = (
                self._text(thought, generated - thought).decode()
                if self.params.kind == "responses"
                else ""
            )  # the Responses API repeats the whole answer at its end
            end = encoder.closing(self._finish_reason(seq), generated, self.params.include_usage,
                                  whole)  # fmt: skip
            events += end
            tokens += [0] * len(end)
            self._write(b"", events, tokens, end=True, now_ns=now_ns)
            self.conn.finish()
            self._log("finished")
            return
        self._write(b"", events, tokens, now_ns=now_ns)
        if generated == plan.drop_at:
            self._drop()

    def _write(
        self,
        head: bytes,
        events: list[bytes],
        tokens: list[int],
        *,
        headers: bool = False,
        end: bool = False,
        now_ns: int = 0,
    ) -> None:
        data = head
        if events:
            data += frame_chunk(b"".join(events))
        if end:
            data += CHUNKED_END
        offset = (now_ns or time.perf_counter_ns()) - self.request.received_ns
        self.conn.write(data)
        self.app.stats.events += len(events)
        if headers:
            self.headers_offset_ns = offset
        if self.events is not None:
            for n in tokens:
                self.events.append([offset, n])

    def _drop(self) -> None:
        self.conn.on_lost = None
        self.app.engine.cancel(self.seq)
        self.conn.close()
        self._log("dropped")

    def _finish_whole(self, seq: Sequence) -> None:
        params = self.params
        thought = min(self.reasoning, seq.generated)
        start = self.text_pos - self.text_start
        reasoning = self._text(start, thought).decode()
        text = self._text(start + thought, seq.generated - thought).decode()
        reason = self._finish_reason(seq)
        if params.kind in ("responses", "messages"):
            encoder = self._encoder()
            assert not isinstance(encoder, ChunkEncoder)
            encoder.set_cached(seq.cached_tokens or 0)
            self._respond_whole(encoder.whole(reason, seq.generated, text, reasoning), seq)
            return
        choice: dict[str, Any] = {"index": 0}
        call = self.tool_call
        if call is not None:
            function = {"name": call.name, "arguments": text}
            choice["message"] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call.id, "type": "function", "function": function}],
            }
            obj = "chat.completion"
        elif params.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            if reasoning:
                choice["message"]["reasoning_content"] = reasoning
            obj = "chat.completion"
        else:
            choice["text"] = reasoning + text  # completions have no reasoning field
            obj = "text_completion"
        choice["logprobs"] = None
        choice["finish_reason"] = reason
        body = {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": params.prompt_tokens,
                "total_tokens": params.prompt_tokens + seq.generated,
                "completion_tokens": seq.generated,
                "prompt_tokens_details": {"cached_tokens": seq.cached_tokens or 0},
                "completion_tokens_details": {"reasoning_tokens": thought},
            },
        }
        self._respond_whole(body, seq)

    def _respond_whole(self, body: dict[str, Any], seq: Sequence) -> None:
        raw = json.dumps(body).encode()
        if self.plan.malformed_at:
            raw = raw[: len(raw) // 2]
        offset = (self.end_ns or time.perf_counter_ns()) - self.request.received_ns
        self.headers_offset_ns = offset
        if self.events is not None:
            self.events.append([offset, seq.generated])
        self.conn.respond(200, raw, headers=self._headers())
        self._log("finished")

    # --- truth log --------------------------------------------------------------------------
    def _log(self, outcome: str) -> None:
        """The request has ended (every end calls this once): its truth line, if kept."""
        if not self.end_ns:
            self.end_ns = time.perf_counter_ns()
        truth = self.app.truth
        if truth is not None:
            self._write_truth(truth, outcome)
        tracer = self.app.tracer
        if tracer is not None:
            self._trace(tracer, outcome)
        # Break the Generation <-> Sequence cycle so that reference counting frees the
        # request at once: left to the cyclic garbage collector, ~40k objects piled up
        # between full collections, which then held the server's loop 15-50 ms.
        seq = self.seq
        seq.sink = _ENDED
        seq.output_tokens = None

    def _trace(self, tracer: SpanExporter, outcome: str) -> None:
        seq, request = self.seq, self.request
        tracer.add(
            RequestRecord(
                traceparent=request.headers.get("traceparent"),
                request_id=self.response_id,
                model=self.model,
                arrival_unix_ns=request.received_unix_ns,
                arrival_ns=request.received_ns,
                scheduled_ns=seq.scheduled_ns,
                first_token_ns=self.first_token_ns,
                end_ns=self.end_ns,
                prompt_tokens=self.params.prompt_tokens,
                completion_tokens=seq.generated,
                max_tokens=self.params.max_tokens,
                error=None if outcome == "finished" else outcome,
            )
        )

    def _write_truth(self, truth: TruthLog, outcome: str) -> None:
        seq = self.seq
        finished = seq.state is SeqState.FINISHED
        scheduled = seq.scheduled_ns
        truth.write(
            {
                "request_id": self.request_id,
                "path": self.request.path,
                "model": self.model,
                "status": self.status,
                "outcome": outcome,
                "arrival_unix_ns": self.request.received_unix_ns,
                "kernel_arrival_unix_ns": self.request.kernel_arrival_unix_ns or None,
                "stream": self.params.stream,
                "prompt_tokens": self.params.prompt_tokens,
                "completion_tokens": seq.generated,
                "cached_tokens": seq.cached_tokens,
                "tool_call": self.tool_call is not None,
                "reasoning_tokens": min(self.reasoning, seq.generated),
                # speculative decoding (--spec-draft-tokens): steps that drafted, accepted
                "spec_drafts": seq.drafts,
                "spec_accepted_tokens": seq.accepted,
                # a JSON answer (structured.py): whether it parses and fits, and why not
                "output_valid": None if self.answer is None else self.answer.valid,
                "invalid": None if self.answer is None else self.answer.how,
                "finish_reason": self._finish_reason(seq) if finished else None,
                "faults": self.plan.names,
                "headers_offset_ns": self.headers_offset_ns,
                "scheduled_offset_ns": scheduled - self.request.received_ns if scheduled else None,
                "events": self.events or [],
            }
        )
