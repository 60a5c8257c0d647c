"""The continuous-batching engine model (like vLLM's scheduler, much simplified).

One scheduler loop per process. Each *step*:

1. admits waiting sequences in FIFO order while the batch has room (`max_num_seqs`), the
   KV budget can reserve `prompt + max_tokens`, and the step's token budget
   (`max_num_batched_tokens`: decode sequences + uncached prefill tokens) is not used up;
   a sequence's prompt tokens found in the prefix cache (prefix_cache.py) need no prefill;
2. lasts `decode_base + decode_per_seq * B + decode_per_kv_token * context
   + prefill_per_token * new_prompt_tokens` (times the time scale), where B counts the
   sequences already decoding and new_prompt_tokens the uncached prompt tokens admitted;
3. at its end gives every sequence of the step one token (a new sequence's first token
   comes out of its prefill step).

Several models (`llmload sim --served-models`): a sequence of a model with cost C (`--model-cost
b:1.5`) needs C steps' work per token: it gains 1/C of a token per step and emits one whenever
a whole token has built up (its prefill and decode take C times as long; C < 1 is not faster
than one token per step). A step whose batch holds a LoRA adapter's sequence (`--adapters`)
lasts `--adapter-overhead-ms` longer (the adapter kernels; every sequence of it waits).

A sequence that finishes, or is cancelled after admission, inserts its prompt + generated
tokens into the prefix cache.

Admission stamps `seq.scheduled_ns` (time.perf_counter_ns, one reading per step): the end of
the sequence's time in the queue, for its span and the truth log (tracing.py).

The clock is honest: the loop sleeps until each step's end (with sub-millisecond precision,
see clock.py) and keeps a virtual schedule, so small wake-up delays do not accumulate. When
the CPU cannot keep up and the loop falls behind by more than half a step or `LAG_RESET`,
the schedule restarts from now and the lag is counted
(`llmload_sim_engine_lag_seconds_total`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from infra.simserver.clock import PreciseTimer
from infra.simserver.metrics import SimStats
from infra.simserver.prefix_cache import ROOT, PrefixCache, block_keys
from infra.simserver.profiles import EngineProfile

LAG_RESET = 0.002  # seconds behind schedule before the schedule restarts from now


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


class SequenceSink(Protocol):
    """Receives a sequence's tokens (the response writer)."""

    def on_token(self, seq: Sequence, done: bool, more: bool = False) -> None:
        """`seq.generated` just grew by one; `done` means the sequence has finished; `more`:
        more tokens of this engine step follow (speculative decoding's accepted drafts)."""


class Sequence:
    """One request inside the engine."""

    __slots__ = (
        "key",
        "prompt_tokens",
        "max_tokens",
        "target_tokens",
        "reserved",
        "generated",
        "state",
        "sink",
        "stall_at",
        "stall_seconds",
        "resume_at",
        "finish_reason",
        "prompt",
        "output_tokens",
        "cached_tokens",
        "block_keys",
        "drafts",
        "accepted",
        "scheduled_ns",
        "cost",
        "credit",
        "overhead",
    )

    def __init__(
        self,
        sink: SequenceSink,
        prompt_tokens: int,
        max_tokens: int,
        target_tokens: int,
        stall_at: int = 0,
        stall_seconds: float = 0.0,
        prompt: tuple[Hashable, ...] = (),
        output_tokens: Callable[[int], list[str]] | None = None,
        cost: float = 1.0,
        overhead: float = 0.0,
    ) -> None:
        self.key = 0
        self.cost = cost  # steps of work per token (its model's cost)
        self.credit = 0.0  # work towards its next token (cost != 1)
        self.overhead = overhead  # seconds its presence adds to a step (a LoRA adapter)
        self.sink = sink
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.target_tokens = min(target_tokens, max_tokens)
        self.reserved = prompt_tokens + max_tokens
        self.generated = 0
        self.state = SeqState.WAITING
        self.stall_at = stall_at
        self.stall_seconds = stall_seconds
        self.resume_at = 0.0
        self.finish_reason: str | None = None
        # Prefix caching: the prompt's tokens (empty: the sequence takes no part), a function
        # giving the first n generated tokens, the prompt tokens found cached at admission
        # and the prompt's block keys (computed on the first admission attempt).
        self.prompt = prompt
        self.output_tokens = output_tokens
        self.cached_tokens: int | None = None  # None until admitted
        self.block_keys: list[int] | None = None
        # time.perf_counter_ns() when first admitted to the running batch (0: never).
        self.scheduled_ns = 0
        # speculative decoding (Speculation): its steps that drafted, the drafts accepted
        self.drafts = 0
        self.accepted = 0


@dataclass
class Speculation:
    """Speculative decoding: each step of a decoding sequence drafts `draft_tokens` tokens and
    accepts them one after another with probability `acceptance` each, up to the first
    rejection; the step emits one token plus those accepted (never past the sequence's
    target), in one event. Counted as vLLM counts them: drafts (steps that drafted), draft
    tokens, accepted tokens; so the acceptance rate is accepted / draft tokens, on average
    (p + p^2 + ... + p^K) / K for acceptance p and K draft tokens."""

    draft_tokens: int
    acceptance: float
    rng: random.Random

    def accepted(self) -> int:
        n = 0
        while n < self.draft_tokens and self.rng.random() < self.acceptance:
            n += 1
        return n


class Engine:
    """The scheduler. All methods run on the event loop's thread."""

    def __init__(
        self,
        profile: EngineProfile,
        stats: SimStats,
        time_scale: float = 1.0,
        cache: PrefixCache | None = None,
        speculation: Speculation | None = None,
    ) -> None:
        self.speculation = speculation  # None: one token per sequence per step
        self.profile = profile
        self.stats = stats
        self.time_scale = time_scale
        self.cache = cache  # None: prefix caching off
        self._waiting: dict[int, Sequence] = {}
        self._running: dict[int, Sequence] = {}
        self._next_key = 0
        self._kv_reserved = 0
        self._kv_used = 0
        self._wakeup = asyncio.Event()
        self._stopped = False

    # --- gauges -----------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_reserved_tokens(self) -> int:
        return self._kv_reserved

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_used

    @property
    def kv_capacity_tokens(self) -> int:
        return self.profile.kv_cache_tokens

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    # --- requests -----------------------------------------------------------------------
    def queue_has_room(self) -> bool:
        return len(self._waiting) < self.profile.max_waiting

    def submit(self, seq: Sequence) -> bool:
        """Queue a sequence; False (and nothing queued) when the waiting queue is full."""
        if not self.queue_has_room():
            return False
        self._next_key += 1
        seq.key = self._next_key
        seq.state = SeqState.WAITING
        self._waiting[seq.key] = seq
        self._wakeup.set()
        return True

    def cancel(self, seq: Sequence) -> bool:
        """Remove a sequence at once, freeing its slot and KV. False if it had already left."""
        if seq.state is SeqState.WAITING:
            del self._waiting[seq.key]
        elif seq.state is SeqState.RUNNING:
            del self._running[seq.key]
            self._release(seq)
            self._cache_insert(seq)
        else:
            return False
        seq.state = SeqState.CANCELLED
        self.stats.cancelled += 1
        self._wakeup.set()
        return True

    def stop(self) -> None:
        self._stopped = True
        self._wakeup.set()

    # --- the loop -------------------------------------------------------------------------
    def _release(self, seq: Sequence) -> None:
        self._kv_reserved -= seq.reserved
        self._kv_used -= seq.prompt_tokens + seq.generated

    def _cache_insert(self, seq: Sequence) -> None:
        """Insert the full blocks of a sequence's prompt + generated tokens."""
        cache = self.cache
        if cache is None or not seq.prompt:
            return
        size = cache.block_size
        keys = seq.block_keys
        if keys is None:
            keys = block_keys(seq.prompt, size)
        keys = list(keys)
        if seq.generated and seq.output_tokens is not None:
            tail = [*seq.prompt[len(keys) * size :], *seq.output_tokens(seq.generated)]
            keys += block_keys(tail, size, keys[-1] if keys else ROOT)
        cache.insert(keys)

    def _admit(self) -> int:
        """Move waiting sequences into the batch; returns their uncached prompt tokens
        (the prefill work of the step)."""
        profile = self.profile
        cache = self.cache
        budget = profile.max_num_batched_tokens - len(self._running)
        prefill = 0
        admitted_ns = 0  # one clock reading for every sequence admitted by this step
        waiting = self._waiting
        while waiting and len(self._running) < profile.max_num_seqs:
            seq = waiting[next(iter(waiting))]
            if self._kv_reserved + seq.reserved > profile.kv_cache_tokens:
                break
            cached = 0
            if cache is not None and seq.prompt:
                if seq.block_keys is None:
                    seq.block_keys = block_keys(seq.prompt, cache.block_size)
                cached = cache.match(seq.block_keys, seq.prompt_tokens)
            new = seq.prompt_tokens - cached
            if prefill and new > budget - prefill:
                break
            del waiting[seq.key]
            seq.state = SeqState.RUNNING
            if cache is not None and seq.block_keys is not None:
                cache.admit(seq.block_keys, seq.prompt_tokens, cached)
            seq.cached_tokens = cached
            if not admitted_ns:
                admitted_ns = time.perf_counter_ns()
            seq.scheduled_ns = admitted_ns
            self._running[seq.key] = seq
            self._kv_reserved += seq.reserved
            self._kv_used += seq.prompt_tokens
            self.stats.prompt_tokens += seq.prompt_tokens
            prefill += new
        return prefill

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        timer = PreciseTimer(loop)
        try:
            await self._run(loop, timer)
        finally:
            timer.close()

    async def _run(self, loop: asyncio.AbstractEventLoop, timer: PreciseTimer) -> None:
        now = loop.time  # time.monotonic, the clock PreciseTimer sleeps on
        profile = self.profile
        scale = self.time_scale
        start = now()
        while not self._stopped:
            self._wakeup.clear()
            if not self._running and not self._waiting:
                await self._wakeup.wait()
                start = now()
                continue
            prefill = self._admit()
            t = now()
            batch: list[Sequence] = []
            decoding = 0
            context = 0
            next_resume = 0.0
            overhead = 0.0
            for seq in self._running.values():
                if seq.resume_at:
                    if seq.resume_at > t:
                        next_resume = min(next_resume or seq.resume_at, seq.resume_at)
                        continue
                    seq.resume_at = 0.0
                batch.append(seq)
                if seq.overhead > overhead:
                    overhead = seq.overhead
                if seq.generated:
                    decoding += 1
                    context += seq.prompt_tokens + seq.generated
            if not batch:  # every running sequence is stalled and nothing can be admitted
                timeout = max(next_resume - t, 0.0) if next_resume else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                start = now()
                continue
            duration = (profile.step_time(decoding, context, prefill) + overhead) * scale
            end = start + duration
            if end > now():
                await timer.sleep_until(end)
            else:
                await asyncio.sleep(0)  # running late: still let the loop serve I/O
            t = now()
            self._emit(batch, t)
            self.stats.steps += 1
            if self.stats.gpus is not None:  # the simulated GPUs ran this step
                self.stats.gpus.busy(duration)
            behind = t - end
            # Keep the virtual schedule (no drift) unless that would squeeze the next step:
            # running late by half a step or by LAG_RESET restarts the schedule from now.
            if behind > LAG_RESET or behind > 0.5 * duration:
                self.stats.lag_seconds += behind
                start = t
            else:
                start = end

    def _emit(self, batch: list[Sequence], t: float) -> None:
        running = self._running
        stats = self.stats
        for seq in batch:
            if seq.state is not SeqState.RUNNING:  # cancelled during the step
                continue
            if seq.cost != 1.0:  # a costlier (or cheaper) model: whole tokens only
                seq.credit += 1.0 / seq.cost
                if seq.credit < 1.0 - 1e-9:
                    continue
                seq.credit = min(seq.credit - 1.0, 1.0)
            tokens = 1
            spec = self.speculation
            if spec is not None:  # drafts accepted this step, never past the target
                accepted = min(spec.accepted(), max(seq.target_tokens - seq.generated - 1, 0))
                seq.drafts += 1
                seq.accepted += accepted
                stats.spec_drafts += 1
                stats.spec_draft_tokens += spec.draft_tokens
                stats.spec_accepted_tokens += accepted
                tokens += accepted
            for i in range(tokens):
                if i and seq.state is not SeqState.RUNNING:  # cancelled by its last token
                    break
                seq.generated += 1
                self._kv_used += 1
                stats.generation_tokens += 1
                if seq.generated >= seq.target_tokens:
                    seq.finish_reason = "length" if seq.generated >= seq.max_tokens else "stop"
                    seq.state = SeqState.FINISHED
                    del running[seq.key]
                    self._release(seq)
                    self._cache_insert(seq)
                    stats.finished[seq.finish_reason] += 1
                    seq.sink.on_token(seq, True)
                    break
                if seq.generated == seq.stall_at:
                    seq.resume_at = t + seq.stall_seconds
                if i < tokens - 1:  # more of this step's tokens follow: one event for all
                    seq.sink.on_token(seq, False, True)
                else:
                    seq.sink.on_token(seq, False)
