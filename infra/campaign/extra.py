"""A campaign's `extra`: the Locust arguments it passes on, checked against Locust's own parser
(with llmload's options on it) before anything starts, not when the master parses them.

Locust's parser is built in a child process: importing Locust patches the importing process
with gevent, which the campaign runner must not be.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys

from analysis.kernel.errors import UsageError

_PARSE = """
import json, sys
from locust.argument_parser import get_parser
from analysis.kernel.errors import UsageError
from locustfiles.options.options import from_parsed
from locustfiles.options.table import add_arguments
parser = get_parser(default_config_files=[])
add_arguments(parser)
ns, unknown = parser.parse_known_args(json.loads(sys.argv[1]))
flags = sorted(f for a in parser._actions for f in a.option_strings)
problem = None
if not unknown and not ns.user_classes:
    try:
        from_parsed(ns)  # llmload's own checks of every value, as the master will make them
    except UsageError as exc:
        problem = str(exc)
print(json.dumps({"unknown": unknown, "positional": list(ns.user_classes or []), "flags": flags,
                  "problem": problem}))
"""
_TIMEOUT_S = 60


def _problem(source: str, text: str) -> UsageError:
    return UsageError(f"{source}: key 'extra' {text} (see `locust -f locustfiles/chat.py --help`)")


def check_extra(extra: tuple[str, ...], source: str, options: tuple[str, ...] = ()) -> None:
    """Every flag in `extra` is one Locust (or llmload) knows and its value parses; else
    UsageError naming the flag (and the nearest known one). With `options` (the chat options
    the campaign writes on the master's command line), llmload's own checks run on them and
    `extra` together, as the master will run them: a value it would refuse (a negative
    timeout, an --extra-body that sets `stream`) is refused now, not after the master and
    workers started."""
    if not extra:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    done = subprocess.run(
        [sys.executable, "-c", _PARSE, json.dumps([*options, *extra])],
        capture_output=True, text=True, env=env, timeout=_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:  # argparse refused a value: its last line says which
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        said = lines[-1].split("error: ", 1)[-1] if lines else f"exit {done.returncode}"
        raise _problem(source, f"is refused by Locust's parser: {said}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    unknown = [arg for arg in found["unknown"] if arg.startswith("-")]
    if unknown:
        named = []
        for arg in unknown:
            flag = arg.split("=", 1)[0]
            near = difflib.get_close_matches(flag, found["flags"], n=1)
            named.append(repr(flag) + (f" (did you mean {near[0]!r}?)" if near else ""))
        raise _problem(source, f"has unknown flag(s) {', '.join(named)}")
    if found["unknown"] or found["positional"]:
        stray = [*found["unknown"], *found["positional"]]
        raise _problem(
            source,
            f"has value(s) without a flag: {', '.join(repr(s) for s in stray)}; give each flag "
            "and its value as list items, e.g. ['--stop-timeout', '10']",
        )
    if found.get("problem"):
        raise UsageError(f"{source}: key 'extra': {found['problem']}")
