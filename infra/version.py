"""The installed llmload version, read from package metadata (no work at import time)."""

from __future__ import annotations

from importlib import metadata


def llmload_version() -> str:
    try:
        return metadata.version("llmload")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"
