"""A worker that only appends rows to an EventSink, as fast as a busy Locust worker would.

    python -m tests.integration.sink_worker EVENTS_URI SPOOL_DIR WORKER_ID

Runs under gevent (monkey-patched, like Locust). Every 200 requests it waits until what it
appended is sealed in the spool and prints `spooled <n>`: after that line, those n requests
must survive a SIGKILL. Used by tests/integration/test_sink_crash.py; it never exits by itself.
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402

from locustfiles.sink.eventsink import EventSink, SinkConfig  # noqa: E402
from tests.support.events import RUN_ID, chunk_columns, request_id, request_row  # noqa: E402


def main() -> None:
    events_uri, spool_dir, worker_id = sys.argv[1:4]
    config = SinkConfig(
        events_uri=events_uri,
        run_id=RUN_ID,
        worker_id=worker_id,
        spool_dir=Path(spool_dir),
        part_rows=1500,
        part_seconds=0.2,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    sink = EventSink(config).start()
    i = 0
    while True:
        for _ in range(20):
            sink.append_request(request_row(i))
            sink.append_chunks(request_id(i), *chunk_columns(10))
            i += 1
        if i % 200 == 0 and sink.flush(timeout=10, upload=False):
            print(f"spooled {i}", flush=True)
        gevent.sleep(0.001)


if __name__ == "__main__":
    main()
