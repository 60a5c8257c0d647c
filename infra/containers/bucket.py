"""`python -m infra.containers.bucket`: wait for the events store, creating its bucket.

A container deployment starts its roles in no fixed order: the store may still be starting
when the master's preflight writes the run's manifest (and fails). The compose file's
one-shot `createbucket` service and the master Job's init container run this first: it asks
the S3 store of LOCUST_EVENTS_URI (s3://bucket/prefix; endpoint and credentials as boto3
reads them) until the bucket answers, creates the bucket when the store says it is missing,
and gives up after --timeout seconds (exit 1, one line saying why). Exit 0 once it exists.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from urllib.parse import urlparse

from analysis.kernel.storage import S3Store, open_store

POLL_S = 1.0
MISSING = ("404", "NoSuchBucket")


def ensure_bucket(store: S3Store, timeout: float, poll: float = POLL_S) -> str | None:
    """Wait until the store's bucket exists (created when missing); None, or why not."""
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            store.client.head_bucket(Bucket=store.bucket)
            return None
        except ClientError as exc:
            last = str(exc.response.get("Error", {}).get("Code", exc))
            if last in MISSING:
                try:
                    store.client.create_bucket(Bucket=store.bucket)
                    print(f"created bucket {store.bucket}", flush=True)
                    continue  # the head_bucket above confirms it
                except ClientError as create_exc:
                    last = str(create_exc.response.get("Error", {}).get("Code", create_exc))
        except BotoCoreError as exc:
            last = type(exc).__name__
        if time.monotonic() + poll > deadline:
            return f"bucket {store.bucket} not reachable after {timeout:.0f} s ({last})"
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.containers.bucket", description=__doc__)
    parser.add_argument(
        "--events-uri",
        default=os.environ.get("LOCUST_EVENTS_URI", ""),
        help="s3://bucket/prefix (default: env LOCUST_EVENTS_URI)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    args = parser.parse_args(argv)
    if urlparse(args.events_uri).scheme != "s3":
        print(f"not an s3:// events URI: {args.events_uri!r}; nothing to wait for", flush=True)
        return 0
    store = open_store(args.events_uri)
    if not isinstance(store, S3Store):  # the scheme says s3: open_store gives an S3Store
        raise TypeError(f"{args.events_uri} did not open as an S3 store")
    why = ensure_bucket(store, args.timeout)
    if why:
        print(f"llmload: {why}", file=sys.stderr, flush=True)
        return 1
    print(f"bucket {store.bucket} is ready", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
