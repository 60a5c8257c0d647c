"""The scheduler on its own: admission limits, KV accounting, cancellation, HTTP helpers."""

from __future__ import annotations

import asyncio

import pytest

from infra.simserver.engine import Engine, SeqState, Sequence
from infra.simserver.http import HttpError, _parse_chunked, frame_chunk
from infra.simserver.metrics import SimStats
from infra.simserver.profiles import get_profile


class Sink:
    def __init__(self) -> None:
        self.tokens = 0
        self.done = False

    def on_token(self, seq: Sequence, done: bool) -> None:
        self.tokens += 1
        self.done = done


def test_admission_respects_slots_and_kv_and_cancel_frees() -> None:
    async def scenario() -> None:
        profile = get_profile("tiny").with_overrides(
            max_num_seqs=2, kv_cache_tokens=10_000, max_model_len=4000, max_waiting=2
        )
        stats = SimStats()
        engine = Engine(profile, stats)
        task = asyncio.create_task(engine.run())
        sinks = [Sink() for _ in range(5)]
        seqs = [Sequence(s, 10, 3000, 3000) for s in sinks]
        assert engine.submit(seqs[0]) and engine.submit(seqs[1])
        await asyncio.sleep(0.01)
        assert engine.num_running == 2  # two slots
        assert engine.submit(seqs[2]) and engine.submit(seqs[3])
        assert not engine.submit(seqs[4])  # the queue of two is full
        await asyncio.sleep(0.01)
        assert engine.num_waiting == 2  # slots are full
        assert engine.kv_reserved_tokens == 2 * 3010
        assert engine.cancel(seqs[0]) and not engine.cancel(seqs[0])
        assert seqs[0].state is SeqState.CANCELLED
        await asyncio.sleep(0.01)
        assert engine.num_running == 2 and engine.num_waiting == 1
        for seq in seqs[1:4]:
            engine.cancel(seq)
        assert engine.kv_reserved_tokens == 0 and engine.kv_used_tokens == 0
        assert stats.cancelled == 4
        short = Sink()
        engine.submit(Sequence(short, 1, 5, 2))
        for _ in range(100):
            if short.done:
                break
            await asyncio.sleep(0.005)
        assert short.done and short.tokens == 2
        assert stats.finished["stop"] == 1
        engine.stop()
        await task

    asyncio.run(scenario())


def test_kv_budget_blocks_admission() -> None:
    async def scenario() -> None:
        profile = get_profile("tiny").with_overrides(kv_cache_tokens=8192, max_model_len=8192)
        engine = Engine(profile, SimStats())
        task = asyncio.create_task(engine.run())
        engine.submit(Sequence(Sink(), 100, 5000, 5000))
        engine.submit(Sequence(Sink(), 100, 5000, 5000))
        await asyncio.sleep(0.01)
        assert (engine.num_running, engine.num_waiting) == (1, 1)
        engine.stop()
        await task

    asyncio.run(scenario())


def test_chunked_request_bodies() -> None:
    body = frame_chunk(b"hello ") + frame_chunk(b"world") + b"0\r\n\r\n"
    assert _parse_chunked(bytearray(b"xx" + body), 2) == (b"hello world", len(body) + 2)
    assert _parse_chunked(bytearray(body[:-3]), 0) is None
    with pytest.raises(HttpError):
        _parse_chunked(bytearray(b"zz\r\nabc\r\n"), 0)
