"""One module per `llmload` subcommand.

Each module defines `register(subparsers)` which adds its parser and sets `handler` to a
function `(argparse.Namespace) -> int`. Keep imports inside handlers light: every module
here is imported each time the CLI starts. Heavy work (servers, pandas) is imported lazily.
"""
