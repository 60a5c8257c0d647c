"""How a path names an option and words a refused value: the command line, or a campaign file.

    CliVoice("--step-duration", 30.0).out_of_range(0.0, "> 0", "seconds")
        UsageError: --step-duration must be > 0 seconds, not 0.0; e.g. --step-duration 30 (the default)
    FileVoice("c.yaml", "step_duration", 30.0).out_of_range(0, "> 0", "seconds")
        UsageError: c.yaml: key 'step_duration' must be > 0, not 0; give seconds, e.g. step_duration: 30

The checks are written once, in the kinds (kinds.py) and the rules (rules.py); a voice only
says what they found in its path's terms. On the command line a message names the flag and
echoes the value as typed; in a file it names the key (the reader has the file open).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, NoReturn

from analysis.kernel.errors import UsageError


def as_arg(value: Any) -> str:
    """A plain value as a command line carries it: 2.0 -> '2', 0.1 -> '0.1', (1, 2) -> '1,2'."""
    if isinstance(value, tuple):
        return ",".join(as_arg(v) for v in value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def shown(value: Any) -> str:
    """A value of the wrong type, as a message shows it."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class Voice(ABC):
    """One option as one path names it: `name` opens a message, `ref` mentions it in one."""

    name: str
    ref: str
    flag: str  # the option's flag, which the command line's parsers name in their messages
    default: Any

    def fail(self, problem: str) -> NoReturn:
        raise UsageError(f"{self.name} {problem}")

    @abstractmethod
    def example(self, value: Any) -> str: ...

    @abstractmethod
    def pick(self, cli: str, file: str) -> str:
        """This path's words, where the two paths word a check differently."""

    def wrong_type(self, value: Any, what: str, hint: str = "") -> NoReturn:
        self.fail(f"must be {what}, not {shown(value)}{hint}")

    @abstractmethod
    def out_of_range(
        self, value: Any, bound: str, unit: str, example: str = "", meaning: str = ""
    ) -> NoReturn:
        """A number outside its bounds; `unit` is "seconds", "integer" or "fraction" (a
        fraction gives an `example` value and what it means, e.g. "one in ten")."""

    @abstractmethod
    def refused(self, exc: UsageError, value: Any, in_file: str) -> NoReturn:
        """A parser refused the text; its message is the command line's (`in_file`: a file's)."""

    @abstractmethod
    def conflict(self, other: Voice, fix: str) -> NoReturn: ...

    @abstractmethod
    def showing(self, value: Any, problem: str) -> NoReturn:
        """A problem of this option against another, with the value given where that helps."""

    @abstractmethod
    def being(self, value: Any, problem: str) -> NoReturn:
        """A problem of one of the option's values, e.g. `--search rate needs --rates`."""


class CliVoice(Voice):
    def __init__(self, flag: str, default: Any = None) -> None:
        self.name = self.ref = self.flag = flag
        self.default = default

    def example(self, value: Any) -> str:
        return f"{self.ref} {as_arg(value)}"

    def pick(self, cli: str, file: str) -> str:
        return cli

    def _default_example(self) -> str:
        note = " (off)" if self.default == 0 else " (the default)"
        return f"e.g. {self.example(self.default)}{note}"

    def out_of_range(
        self, value: Any, bound: str, unit: str, example: str = "", meaning: str = ""
    ) -> NoReturn:
        if unit == "fraction":
            example += f": {meaning}" if meaning else ""
            self.fail(f"must be {bound.removesuffix(' (inclusive)')}, not {value} (e.g. {example})")
        what = f"an integer {bound}" if unit == "integer" else f"{bound} {unit}"
        self.fail(f"must be {what}, not {value}; {self._default_example()}")

    def refused(self, exc: UsageError, value: Any, in_file: str) -> NoReturn:
        raise exc

    def conflict(self, other: Voice, fix: str) -> NoReturn:
        raise UsageError(fix)

    def showing(self, value: Any, problem: str) -> NoReturn:
        self.fail(f"({value}) {problem}")

    def being(self, value: Any, problem: str) -> NoReturn:
        self.fail(f"{value} {problem}")


class FileVoice(Voice):
    def __init__(self, source: str, key: str, default: Any = None, flag: str = "") -> None:
        self.source, self.key, self.default, self.flag = source, key, default, flag
        self.name, self.ref = f"key {key!r}", key

    def fail(self, problem: str) -> NoReturn:
        raise UsageError(f"{self.source}: {self.name} {problem}")

    def example(self, value: Any) -> str:
        if isinstance(value, tuple):
            return f"{self.ref}: [{', '.join(as_arg(v) for v in value)}]"
        return f"{self.ref}: {as_arg(value)}"

    def pick(self, cli: str, file: str) -> str:
        return file

    def out_of_range(
        self, value: Any, bound: str, unit: str, example: str = "", meaning: str = ""
    ) -> NoReturn:
        if unit == "fraction":
            self.fail(f"must be {bound} such as {example}, not {value}")
        if unit == "seconds":
            self.fail(f"must be {bound}, not {value}; give seconds, {self._default_example()}")
        self.fail(f"must be {bound}, not {value}")

    def _default_example(self) -> str:
        return f"e.g. {self.example(self.default)}"

    def refused(self, exc: UsageError, value: Any, in_file: str) -> NoReturn:
        error = str(exc)
        problem = error
        for prefix in (f"{self.flag} {value!r}: ", f"{self.flag} {value!r} ", f"{self.flag} "):
            if self.flag and error.startswith(prefix):
                problem = error.removeprefix(prefix)
                break
        self.fail(in_file.format(problem=problem, error=error, value=value))

    def conflict(self, other: Voice, fix: str) -> NoReturn:
        self.fail(f"and {other.name} are both set: {fix}")

    def showing(self, value: Any, problem: str) -> NoReturn:
        self.fail(problem)

    def being(self, value: Any, problem: str) -> NoReturn:
        self.fail(f"is {value}: it {problem}")
