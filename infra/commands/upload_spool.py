"""`llmload upload-spool DIR --events-uri URI`: upload what a dead worker left in its spool."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from analysis.kernel.errors import UsageError
from analysis.kernel.storage import expand_home, open_store


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "upload-spool",
        help="upload Parquet parts a crashed worker left in its spool directory",
        description=(
            "Upload every part under a sink spool directory without overwriting (parts the "
            "store already holds byte for byte count as done), merge each worker's index, "
            "and delete what was uploaded. Spools of sinks still running on this host are "
            "skipped unless --force. Exit status 1 when anything is left in the spool."
        ),
    )
    parser.add_argument("dir", type=Path, metavar="DIR", help="the sink's spool directory")
    parser.add_argument(
        "--events-uri",
        default=os.environ.get("LLMLOAD_EVENTS_URI"),
        help="s3://bucket/prefix, file:///path or a path (env LLMLOAD_EVENTS_URI)",
    )
    parser.add_argument("--run-id", help="only this run's parts")
    parser.add_argument(
        "--force", action="store_true", help="also upload spools whose sink looks alive"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from locustfiles.sink.spool import upload_spool

    args.dir = Path(expand_home(str(args.dir), "spool directory"))  # as --spool-dir
    if not args.events_uri:
        raise UsageError("no events URI: give --events-uri or set LLMLOAD_EVENTS_URI")
    if not args.dir.is_dir():
        raise UsageError(
            f"spool directory {args.dir} does not exist; give the worker's --spool-dir "
            "(default: <system temp>/llmload-spool)"
        )
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="llmload: %(message)s")
    report = upload_spool(
        args.dir, open_store(args.events_uri), run_id=args.run_id, force=args.force
    )
    print(f"upload-spool: {report}")
    for key in [*report.collisions, *report.failed]:
        print(f"  left in the spool: {key}")
    return 0 if report.complete else 1
