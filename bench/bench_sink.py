"""Benchmark: sustained rows/s through the EventSink, and the event-loop lag it adds.

    .venv/bin/python bench/bench_sink.py [--seconds 10] [--rate 40000] [--part-rows N]

Under gevent (monkey-patched, like a Locust worker), one greenlet produces rows like a real
worker (1 request row + 100 chunk rows per request, yielding to the loop after each
request) while another measures event-loop lag: the overshoot of `gevent.sleep(0.001)`
(p50/p99/max). Each scenario runs twice, without the sink (rows built and dropped) and with
it (rows appended to an EventSink writing to a local SeaweedFS started here), so the
difference is the sink's cost. Scenarios: as fast as possible, and paced at --rate chunk
rows/s. "Sustained" counts rows in the store when close() returns, over the time from the
first append until then.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.store import LocalStore  # noqa: E402
from locustfiles.sink.eventsink import EventSink, SinkConfig  # noqa: E402

CHUNKS_PER_REQUEST = 100


@dataclass
class Result:
    name: str
    requests: int
    seconds: float
    lag_ms: tuple[float, float, float]  # p50, p99, max
    stored_rows: int | None = None
    total_seconds: float | None = None
    parts: int | None = None
    pending: int | None = None

    def line(self) -> str:
        rows = self.requests * (CHUNKS_PER_REQUEST + 1)
        p50, p99, mx = self.lag_ms
        text = (
            f"{self.name:<32} appended {rows / self.seconds:>9,.0f} rows/s  "
            f"lag p50 {p50:.3f} ms  p99 {p99:.3f} ms  max {mx:.2f} ms"
        )
        if self.stored_rows is not None and self.total_seconds:
            text += (
                f"  | stored {self.stored_rows:,} rows, sustained "
                f"{self.stored_rows / self.total_seconds:,.0f} rows/s, {self.parts} parts, "
                f"{self.pending} pending"
            )
        return text


def request_row(i: int) -> dict[str, object]:
    return {
        "request_id": f"{i:032x}",
        "step": 0,
        "concurrency": 64,
        "scenario": "D(128,100)",
        "endpoint": "chat",
        "model": "bench",
        "stream": True,
        "prompt_tokens_requested": 128,
        "max_tokens": 100,
        "prompt_sha256": "0" * 64,
        "sent_at_ns": time.time_ns(),
        "headers_ns": 1_000_000,
        "first_event_ns": 2_000_000,
        "first_token_ns": 2_000_000,
        "first_content_ns": 2_000_000,
        "last_token_ns": 101_000_000,
        "end_ns": 101_500_000,
        "http_status": 200,
        "status": "ok",
        "prompt_tokens": 128,
        "completion_tokens": 100,
        "output_tokens": 100,
        "output_tokens_source": "usage",
        "events": 102,
        "cold": False,
    }


def run(name: str, seconds: float, rate: float, sink: EventSink | None) -> Result:
    lags: list[float] = []
    stop = False

    def measure() -> None:
        while not stop:
            t = time.perf_counter()
            gevent.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    count = 0

    def produce() -> None:
        nonlocal count
        start = time.perf_counter()
        per_request = CHUNKS_PER_REQUEST / rate if rate else 0.0
        while not stop:
            i = count
            base = time.perf_counter_ns()
            offsets = [base + k * 1000 for k in range(CHUNKS_PER_REQUEST)]
            tokens = [1] * CHUNKS_PER_REQUEST
            chars = [4] * CHUNKS_PER_REQUEST
            row = request_row(i)
            if sink is not None:
                sink.append_request(row)
                sink.append_chunks(row["request_id"], offsets, tokens, chars, "content")  # type: ignore[arg-type]
            count += 1
            if per_request:
                delay = start + count * per_request - time.perf_counter()
                gevent.sleep(max(0.0, delay))
            else:
                gevent.sleep(0)

    meter = gevent.spawn(measure)
    gevent.sleep(0.2)
    t0 = time.perf_counter()
    producer = gevent.spawn(produce)
    gevent.sleep(seconds)
    stop = True
    producer.join()
    elapsed = time.perf_counter() - t0
    meter.join()
    arr = np.array(lags) * 1e3
    result = Result(
        name,
        count,
        elapsed,
        (float(np.percentile(arr, 50)), float(np.percentile(arr, 99)), float(arr.max())),
    )
    if sink is not None:
        report = sink.close(120)
        result.total_seconds = time.perf_counter() - t0
        result.stored_rows = sum(report.rows.values())
        result.parts = report.parts
        result.pending = report.pending_rows
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40_000.0, help="chunk rows/s when paced")
    parser.add_argument("--part-rows", type=int, default=None)
    args = parser.parse_args()
    print(
        f"# bench_sink  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  python "
        f"{platform.python_version()}  {os.cpu_count()} CPUs  {platform.machine()}"
    )
    with tempfile.TemporaryDirectory() as tmp, LocalStore(Path(tmp) / "store") as store:
        os.environ.update(store.env())
        results = []
        for scenario, rate in (("max", 0.0), (f"paced {args.rate:,.0f}/s", args.rate)):
            results.append(run(f"{scenario}, no sink", args.seconds, rate, None))
            extra = {"part_rows": args.part_rows} if args.part_rows else {}
            config = SinkConfig(
                store.events_uri("bench"),
                f"run-{scenario.split()[0]}",
                "bench-w",
                spool_dir=Path(tmp) / "spool",
                **extra,  # type: ignore[arg-type]
            )
            sink = EventSink(config).start()
            sink.flush(60)  # one-time start (boto3 client, spool scan) kept out of the figures
            results.append(run(f"{scenario}, sink", args.seconds, rate, sink))
            for result in results[-2:]:
                print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
