"""Can this host keep a run's events? Its spool folder takes a file, its store is reachable.

The master's preflight and every worker at start run these before the first request, so an
unusable --spool-dir or --events-uri stops the run with one line, before anything is sent.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from analysis.kernel.errors import LlmloadError, UsageError
from analysis.kernel.layout import MANIFEST_NAME, run_key
from analysis.kernel.storage import open_store
from locustfiles.options.options import ChatOptions
from locustfiles.sink.eventsink import default_spool_dir


def check_takes_files(root: Path) -> None:
    """A folder that may not exist yet can be made and written: its nearest existing folder
    is a folder that takes a file (OSError if not). Writes nothing that stays (the writer
    makes the folder; a check of permission bits would be wrong for root)."""
    place = root.absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise NotADirectoryError(f"{place} is not a folder")
    with tempfile.NamedTemporaryFile(dir=place, prefix=".llmload-check-"):
        pass


def check_spool(options: ChatOptions) -> None:
    """The local spool folder (every part goes through it) takes a file, or UsageError."""
    root = Path(options.spool_dir) if options.spool_dir else default_spool_dir()
    try:
        check_takes_files(root)
    except OSError as exc:
        raise UsageError(
            f"cannot write to the spool folder {root} ({store_reason(exc)}); fix --spool-dir "
            "(a writable local folder; default: the system temp folder) or its permissions"
        ) from None


def check_store_reachable(options: ChatOptions, run_id: str) -> None:
    """A worker's view of its spool and the store: a directory it can write, or a bucket it
    can reach."""
    check_spool(options)
    try:
        store = open_store(options.events_uri)
        root = getattr(store, "root", None)
        if root is not None:  # a local directory (a worker's own disk): it must be writable
            root.mkdir(parents=True, exist_ok=True)
            if not os.access(root, os.W_OK):
                raise PermissionError(f"{root} is not writable")
        else:
            store.exists(run_key(run_id, MANIFEST_NAME))
    except UsageError:
        raise
    except (LlmloadError, OSError) as exc:
        raise UsageError(
            f"cannot write to the events store {options.events_uri} ({store_reason(exc)}); "
            "fix --events-uri, the store's endpoint or credentials, or permissions on this host"
        ) from None


def store_reason(exc: BaseException) -> str:
    text = str(exc)
    return (text if text else type(exc).__name__)[:200]
