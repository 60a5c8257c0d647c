"""Multi-turn sessions: conversations that resend their history, and agents' tool rounds.

One session runs on one connection, turn after turn (`Session.run`): a closed-loop user
runs one session at a time, an open-loop arrival starts one. Each turn is one request:

- turn 0 is the first user message (`--workload`, or a recorded conversation's first turn);
- a user turn after a reply waits the think time (`--think-time`), then sends a new user
  message (`--followup-workload`, default `--workload`; exact lengths with a tokenizer),
  after the history: the whole conversation (`--history full`) or its last N turns;
- a turn may offer tools (`--tool-rate`); when the reply is a tool call, the session waits
  the tool latency (`--tool-latency`) and sends the tool's result (role `tool`) as the next
  turn (`turn_kind` tool_result), which counts as a turn; at most MAX_TOOL_ROUNDS per
  session, after which no more tools are offered;
- a turn that does not end `ok` ends the session; the run's end cuts it.

The assistant's replies go into the history as the server sent them (content, or the tool
calls with their arguments). Every request row carries the session's id, its turn index,
the turns planned, its kind, the wait before it, its tool calls and the history tokens it
resent (docs/events.md).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent

from locustfiles.request.record import RequestRecord
from locustfiles.traffic.workloads import Conversation, RequestSpec

MAX_TOOL_ROUNDS = 8
"""Tool rounds at most per session: a model that keeps calling tools gets none offered after."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact and return what was found.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look up"}},
                "required": ["query"],
            },
        },
    }
]
"""The tools a turn offers (`--tool-rate`): one generic lookup function."""

_perf_ns = time.perf_counter_ns


@dataclass
class Turn:
    """One request of a session, as WorkerContext.run_one sends it."""

    session_id: str
    index: int
    planned: int
    kind: str  # user | tool_result
    scenario: str
    messages: list[dict[str, Any]]
    new_tokens: int | None  # tokens of the new message llmload built (None: dataset text)
    max_tokens: int | None
    offer_tools: bool
    wait_ns: int
    history_tokens: int | None

    def apply(self, record: RequestRecord) -> None:
        record.session_id = self.session_id
        record.turn = self.index
        record.session_turns = self.planned
        record.turn_kind = self.kind
        record.wait_ns = self.wait_ns
        record.history_tokens = self.history_tokens
        record.tool_calls = 0
        record.reply_parts = []


@dataclass
class _Exchange:
    """One turn of the history: its messages and their tokens (None: not known)."""

    messages: list[dict[str, Any]]
    tokens: int | None = None


@dataclass
class Session:
    """One conversation; `run` sends its turns (see the module docstring)."""

    ctx: Any  # the worker's RequestBuilder (worker/building.py): options, samplers, prompts, rng
    rng: random.Random
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    history: list[_Exchange] = field(default_factory=list)
    system: list[dict[str, Any]] = field(default_factory=list)
    _pending: _Exchange = field(default_factory=lambda: _Exchange([]))  # the turn being sent

    def run(self, send: Callable[[Turn], RequestRecord | None]) -> list[RequestRecord]:
        """Send every turn through `send` (WorkerContext.run_one); returns the records."""
        options = self.ctx.options
        first = self.ctx.sampler.sample()
        chat: Conversation | None = first.conversation
        planned = len(chat.turns) if chat is not None else int(options.turns.sample(self.rng))
        if chat is not None and chat.system:
            self.system = [{"role": "system", "content": chat.system}]
        records: list[RequestRecord] = []
        user_turns = 0
        tool_rounds = 0
        pending_tools: RequestRecord | None = None
        index = 0
        while True:
            if pending_tools is not None:
                wait = options.tool_latency.sample(self.rng)
                turn = self._tool_result(index, planned, pending_tools)
            elif user_turns < planned:
                wait = 0.0 if index == 0 else options.think_time.sample(self.rng)
                turn = self._user_turn(index, planned, first if index == 0 else None, chat,
                                       user_turns)  # fmt: skip
                user_turns += 1
            else:
                return records
            turn.offer_tools = (
                tool_rounds < MAX_TOOL_ROUNDS
                and options.tool_rate > 0
                and self.rng.random() < options.tool_rate
            )
            turn.wait_ns = self._wait(wait)
            record = send(turn)
            if record is None:
                return records
            records.append(record)
            if record.status != "ok":
                return records  # a failed, cancelled or aborted turn ends the session
            self._remember(turn, record)
            pending_tools = record if record.tool_calls and turn.offer_tools else None
            tool_rounds += 1 if pending_tools is not None else 0
            index += 1

    # -- turns ---------------------------------------------------------------------------
    def _user_turn(self, index: int, planned: int, first: RequestSpec | None,
                   chat: Conversation | None, user_index: int) -> Turn:  # fmt: skip
        ctx = self.ctx
        max_tokens: int | None
        if chat is not None:
            text, max_tokens = chat.turns[user_index]
            new_tokens, scenario = None, ctx.sampler.workload.spec
            tokens = ctx.counter.count(text) if ctx.counter is not None else None
        else:
            spec = first if first is not None else ctx.followup_sampler.sample()
            scenario, max_tokens = spec.scenario, spec.max_tokens
            if spec.prompt_text is not None:
                text, new_tokens = spec.prompt_text, None
                tokens = spec.prompt_tokens
            elif spec.messages is not None:  # a dataset's chat: its last message is the turn's
                *before, last = spec.messages
                self.system = self.system or [m for m in before if m.get("role") == "system"]
                text, new_tokens, tokens = str(last.get("content") or ""), None, spec.prompt_tokens
            else:
                n = spec.prompt_tokens or 1
                # the first message is a whole prompt (its template counted in); later ones add n
                text = ctx.prompts.build(n, ctx.rng) if index == 0 else ctx.prompts.text(n, ctx.rng)
                new_tokens, tokens = n, n
        message = {"role": "user", "content": text}
        return self._turn(
            index, planned, "user", scenario, [message], new_tokens, max_tokens, tokens
        )

    def _tool_result(self, index: int, planned: int, called: RequestRecord) -> Turn:
        ctx = self.ctx
        spec = ctx.followup_sampler.sample()
        n = spec.prompt_tokens or 16
        results = [
            {"role": "tool", "tool_call_id": call.get("id") or f"call_{i}",
             "content": ctx.prompts.text(n, ctx.rng)}
            for i, call in sorted((called.tool_call_parts or {}).items())
        ]  # fmt: skip
        return self._turn(index, planned, "tool_result", spec.scenario, results, None,
                          spec.max_tokens, n * len(results))  # fmt: skip

    def _turn(self, index: int, planned: int, kind: str, scenario: str,
              new: list[dict[str, Any]], new_tokens: int | None, max_tokens: int | None,
              tokens: int | None) -> Turn:  # fmt: skip
        window = self.ctx.options.history  # >= 1 when set: a tool call is always resent
        shown = self.history[-window:] if window else self.history
        history_tokens: int | None = 0
        for exchange in shown:
            history_tokens = None if exchange.tokens is None or history_tokens is None else (
                history_tokens + exchange.tokens)  # fmt: skip
        messages = [*self.system, *(m for e in shown for m in e.messages), *new]
        turn = Turn(self.session_id, index, planned, kind, scenario, messages, new_tokens,
                    max_tokens, False, 0, history_tokens if index else None)  # fmt: skip
        self._pending = _Exchange(new, tokens)
        return turn

    def _remember(self, turn: Turn, record: RequestRecord) -> None:
        """The turn's new messages and the reply join the history."""
        exchange = self._pending
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(record.reply_parts or [])}
        if record.tool_calls and turn.offer_tools:
            reply["content"] = reply["content"] or None
            reply["tool_calls"] = [
                {"id": call.get("id") or f"call_{i}", "type": "function",
                 "function": {"name": call.get("name") or "lookup",
                              "arguments": call.get("arguments") or ""}}
                for i, call in sorted((record.tool_call_parts or {}).items())
            ]  # fmt: skip
        exchange.messages = [*exchange.messages, reply]
        if exchange.tokens is not None and record.output_tokens is not None:
            exchange.tokens += record.output_tokens
        else:
            exchange.tokens = None
        self.history.append(exchange)

    @staticmethod
    def _wait(seconds: float) -> int:
        """Sleep the think time or tool latency; the time actually waited, in ns."""
        if seconds <= 0:
            return 0
        start = _perf_ns()
        gevent.sleep(seconds)
        return _perf_ns() - start
