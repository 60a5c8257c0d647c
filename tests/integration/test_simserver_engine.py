"""The engine model seen from clients: TTFT rises with queue depth, ITL with batch size."""

from __future__ import annotations

import statistics
import threading

from tests.support.sim import SimFactory, Stream, chat_body, stream_request


def _concurrent(port: int, bodies: list[dict]) -> list[Stream]:
    results: list[Stream | None] = [None] * len(bodies)

    def run(i: int) -> None:
        results[i] = stream_request(port, bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(r is not None and r.complete for r in results)
    return [r for r in results if r is not None]


def _ttft_ms(stream: Stream) -> float:
    first = next(i for i, e in enumerate(stream.events) if b'"content":" ' in e)
    return stream.arrivals_ns[first] / 1e6


def _itls_ms(stream: Stream) -> list[float]:
    times = [
        t for t, e in zip(stream.arrivals_ns, stream.events, strict=True) if b'"content":" ' in e
    ]
    return [(b - a) / 1e6 for a, b in zip(times, times[1:], strict=False)]


def test_ttft_grows_with_queue_depth(sim_factory: SimFactory) -> None:
    # One sequence at a time, 20 tokens of ~2 ms: the 9th request waits ~8 x 40 ms.
    sim = sim_factory("--max-num-seqs", "1", "--decode-base-ms", "2")
    body = chat_body(max_tokens=20, ignore_eos=True)
    alone = min(_ttft_ms(stream_request(sim.port, body)) for _ in range(3))
    queued = _concurrent(sim.port, [body] * 9)
    deepest = max(_ttft_ms(s) for s in queued)
    assert deepest > 5 * alone, (alone, deepest)
    assert deepest > 8 * 20 * 2 * 0.8  # about 8 queued requests x 20 steps x 2 ms


def test_itl_grows_with_batch_size(sim_factory: SimFactory) -> None:
    # decode step = 1 ms + 0.5 ms per sequence: ~1.5 ms alone, ~9 ms with 16 in the batch.
    sim = sim_factory("--decode-base-ms", "1", "--decode-per-seq-us", "500")
    body = chat_body(max_tokens=30, ignore_eos=True)
    alone = statistics.median(_itls_ms(stream_request(sim.port, body)))
    batch = _concurrent(sim.port, [body] * 16)
    batched = statistics.median(statistics.median(_itls_ms(s)) for s in batch)
    assert batched > 2.5 * alone, (alone, batched)
