"""The `llmload` command. Subcommands register here; errors become one line and exit 2."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence

import infra.commands
from analysis.kernel.errors import LlmloadError, UsageError
from infra.version import llmload_version

EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line naming the problem (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="llmload",
        description="Distributed load testing for LLM inference services.",
    )
    parser.add_argument("--version", action="version", version=f"llmload {llmload_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(infra.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"infra.commands.{info.name}")
        if hasattr(module, "register"):  # a command; the others are helpers of commands
            module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return handler(args)
    except UsageError as exc:
        print(f"llmload: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LlmloadError as exc:
        print(f"llmload: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("llmload: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
