"""`llmload store`: a local S3-compatible store (SeaweedFS) on 127.0.0.1 until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from infra.store import DEFAULT_BUCKET, LocalStore


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "store",
        help="run a local S3-compatible store (SeaweedFS) for events",
        description=(
            "Start SeaweedFS bound to 127.0.0.1, create the bucket, print the environment "
            "variables a client needs, and run until Ctrl-C or SIGTERM. Credentials come "
            "from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or are generated and printed."
        ),
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("LLMLOAD_STORE_DIR", ".llmload-store")),
        help="data directory (kept between runs; env LLMLOAD_STORE_DIR; default .llmload-store)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=os.environ.get("LLMLOAD_STORE_PORT", "8333"),  # argparse applies type=int
        help="S3 port on 127.0.0.1, 0 for any free port (env LLMLOAD_STORE_PORT; default 8333)",
    )
    parser.add_argument(
        "--bucket",
        default=os.environ.get("LLMLOAD_STORE_BUCKET", DEFAULT_BUCKET),
        help=f"bucket to create (env LLMLOAD_STORE_BUCKET; default {DEFAULT_BUCKET})",
    )
    parser.set_defaults(handler=run)


class _Stop(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def run(args: argparse.Namespace) -> int:
    store = LocalStore(args.dir, bucket=args.bucket, s3_port=args.port)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        store.start()
        print(f"# SeaweedFS S3 on {store.endpoint_url}, data in {store.data_dir}")
        print(f"# bucket {store.bucket}; Ctrl-C stops the store. For a client, run:")
        for name, value in store.env().items():
            if name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") and not (
                store.credentials_generated
            ):
                continue  # the client has them already: never echo a user's secret
            print(f"export {name}={shlex.quote(value)}")
        if not store.credentials_generated:
            print("# credentials: your AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
        print(f"export LLMLOAD_EVENTS_URI={store.events_uri('runs')}", flush=True)
        while store.running:
            time.sleep(0.5)
        print(f"llmload store: SeaweedFS exited unexpectedly; see {store.log_path}")
        return 1
    except (KeyboardInterrupt, _Stop):
        print("# stopping SeaweedFS", flush=True)
        return 0
    finally:
        # a second Ctrl-C or SIGTERM must not interrupt the stop itself
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            store.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
