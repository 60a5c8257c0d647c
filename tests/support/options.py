"""Parsed chat options as Locust's parser would give them: every default, some changed."""

from __future__ import annotations

import argparse

from locustfiles.options.options import OPTIONS


def parsed_options(**changes: object) -> argparse.Namespace:
    """A namespace holding every option's default (as Locust's parser sets them), then `changes`."""
    ns = argparse.Namespace()
    for flag, kwargs in OPTIONS:
        setattr(ns, flag.lstrip("-").replace("-", "_"), kwargs.get("default"))
    for key, value in changes.items():
        setattr(ns, key, value)
    return ns
