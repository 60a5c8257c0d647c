"""`llmload demo`: the embedded end-to-end campaign (store + simulated engine + Locust + report)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the embedded demo campaign end to end")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print("llmload demo: not built yet (it arrives with the campaigns issue).")
    return 0
