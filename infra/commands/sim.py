"""`llmload sim`: run the simulated inference engine (docs/simserver.md)."""

from __future__ import annotations

import argparse
from typing import Any

from infra.simserver.options import add_arguments, build_config, profiles_table


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "sim",
        help="run the simulated OpenAI-compatible inference engine (no GPU)",
        description="Simulated continuous-batching engine with an OpenAI-compatible "
        "streaming API. Everything it returns is labelled simulated.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.list_profiles:
        print(profiles_table())
        return 0
    from infra.simserver.server import serve

    return serve(build_config(args))
