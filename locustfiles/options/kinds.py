"""Kinds of option value: how Locust's parser reads one, and the checks it must pass.

    Seconds(positive=True).value(0.0, CliVoice("--step-duration", 30.0))   # UsageError
    Count(minimum=0).value(3, FileVoice("c.yaml", "cold_requests", 3))    # 3

`arguments()` are the kind's keywords for `parser.add_argument`. `value(raw, say)` checks a
value as Locust's parser gives it (text, or a number of the option's type) or as a campaign
file gives it (YAML/TOML types), and returns it as the run uses it; `setting(raw, say)`
returns it as a campaign records it and a command line carries it (the text of a spec, not
the parsed spec). A check that fails is worded by the voice `say` (voice.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.kernel.errors import UsageError
from locustfiles.options.voice import Voice


class Kind:
    """A text taken as given (the base of the other kinds)."""

    def arguments(self) -> dict[str, Any]:
        return {}

    def value(self, raw: Any, say: Voice) -> Any:
        if not isinstance(raw, str):
            say.wrong_type(raw, "a string", "; quote it")
        return raw

    def setting(self, raw: Any, say: Voice) -> Any:
        return self.value(raw, say)


@dataclass(frozen=True)
class Checked(Kind):
    """A text that `check` returns as given or normalised, or refuses with UsageError;
    `in_file` words a refusal in a campaign file ({problem}, {error}, {value})."""

    check: Callable[[str], str]
    in_file: str = "{problem}"

    def value(self, raw: Any, say: Voice) -> Any:
        text = super().value(raw, say)
        try:
            return self.check(text)
        except UsageError as exc:
            say.refused(exc, text, self.in_file)


@dataclass(frozen=True)
class Spec(Kind):
    """A spec parsed into what the run uses (a workload, a spread); its text is the setting.
    `numbers`: a file may give a plain number (`think_time: 2`)."""

    parse: Callable[[str, str], Any]  # (flag, text)
    example: str
    numbers: bool = True
    in_file: str = "is not valid ({problem}); e.g. {example}"

    def value(self, raw: Any, say: Voice) -> Any:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float if self.numbers else str):
            if self.numbers:
                say.wrong_type(raw, f"a number or a string such as {self.example}")
            say.wrong_type(raw, "a string", "; quote it")
        text = str(raw).strip()
        try:
            return self.parse(say.flag, text)
        except UsageError as exc:
            say.refused(exc, text, self.in_file.replace("{example}", self.example))

    def setting(self, raw: Any, say: Voice) -> Any:
        self.value(raw, say)
        return str(raw).strip()


@dataclass(frozen=True)
class Choice(Kind):
    choices: tuple[str, ...]

    def arguments(self) -> dict[str, Any]:
        return {"choices": list(self.choices)}

    def value(self, raw: Any, say: Voice) -> Any:
        if raw is False and "off" in self.choices:
            return "off"  # YAML 1.1 reads a bare `off` as false
        if raw not in self.choices:
            say.fail(f"must be {' or '.join(self.choices)}, not {raw!r}")
        return str(raw)


class Switch(Kind):
    """On when given (a flag without a value)."""

    def arguments(self) -> dict[str, Any]:
        return {"action": "store_true"}

    def value(self, raw: Any, say: Voice) -> Any:
        if not isinstance(raw, bool):
            say.fail(f"must be true or false, not {raw!r}")
        return raw


def _number(raw: Any) -> bool:
    return isinstance(raw, int | float) and not isinstance(raw, bool)


@dataclass(frozen=True)
class Seconds(Kind):
    """Seconds, finite, > 0 (or >= 0 where 0 means off)."""

    positive: bool = True

    def arguments(self) -> dict[str, Any]:
        return {"type": float}

    def value(self, raw: Any, say: Voice) -> Any:
        if not _number(raw):
            say.wrong_type(raw, "a number of seconds")
        if not math.isfinite(raw) or raw < 0 or (raw == 0 and self.positive):
            say.out_of_range(raw, "> 0" if self.positive else ">= 0", "seconds")
        return float(raw)


@dataclass(frozen=True)
class Amount(Kind):
    """A finite number >= 0 of some `unit` (a price: 0 means none)."""

    unit: str

    def arguments(self) -> dict[str, Any]:
        return {"type": float}

    def value(self, raw: Any, say: Voice) -> Any:
        if not _number(raw):
            say.wrong_type(raw, f"a number ({self.unit})")
        if not math.isfinite(raw) or raw < 0:
            say.fail(f"must be a number >= 0 ({self.unit}), not {raw}; e.g. {say.example(2.5)}")
        return float(raw)


@dataclass(frozen=True)
class Count(Kind):
    """An integer, within bounds where given."""

    minimum: int | None = None
    maximum: int | None = None

    def arguments(self) -> dict[str, Any]:
        return {"type": int}

    def value(self, raw: Any, say: Voice) -> Any:
        if not _number(raw) or not isinstance(raw, int):
            say.wrong_type(raw, "an integer")
        if self.minimum is not None and raw < self.minimum:
            say.out_of_range(raw, f">= {self.minimum}", "integer")
        if self.maximum is not None and raw > self.maximum:
            say.out_of_range(raw, f"<= {self.maximum}", "integer")
        return int(raw)


@dataclass(frozen=True)
class Fraction(Kind):
    """A number between 0 and 1: inclusive (`closed`) or exclusive; `example` a good value
    and `meaning` what it means ("one in ten")."""

    example: float
    meaning: str = ""
    closed: bool = True

    def arguments(self) -> dict[str, Any]:
        return {"type": float}

    def value(self, raw: Any, say: Voice) -> Any:
        if not _number(raw):
            say.wrong_type(raw, f"a number between 0 and 1 such as {self.example:g}")
        inside = 0 <= raw <= 1 if self.closed else 0 < raw < 1
        if not (math.isfinite(raw) and inside):
            ends = "inclusive" if self.closed else "exclusive"
            bound = f"between 0 and 1 ({ends})"
            say.out_of_range(raw, bound, "fraction", f"{self.example:g}", self.meaning)
        return float(raw)


@dataclass(frozen=True)
class Factor(Kind):
    """A finite number greater than 1: how many times a figure grew; `example` a good value."""

    example: float

    def arguments(self) -> dict[str, Any]:
        return {"type": float}

    def value(self, raw: Any, say: Voice) -> Any:
        if not _number(raw):
            say.wrong_type(raw, f"a number greater than 1 such as {self.example:g}")
        if not (math.isfinite(raw) and raw > 1):
            say.fail(f"must be a number greater than 1 (a factor), not {raw}; e.g. "
                     f"{say.example(self.example)}")  # fmt: skip
        return float(raw)


@dataclass(frozen=True)
class Levels(Kind):
    """A list of step levels: a comma-separated text, or in a file also a list.
    `noun`: what the list holds; `items`: what each item must be."""

    parse: Callable[[str], tuple[float, ...]]
    noun: str
    items: str
    example: str

    def value(self, raw: Any, say: Voice) -> Any:
        items: Sequence[Any] = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items:
            say.fail(f"must be a list of {self.noun} such as {self.example}, not {raw!r}")
        try:
            return self.parse(",".join(str(item) for item in items))
        except UsageError as exc:
            words = f"must be a list of {self.items} such as {self.example}, not {{value!r}}"
            say.refused(exc, raw, words)


def _not_json(name: str) -> Any:
    """json.loads' hook for NaN, Infinity and -Infinity, which JSON does not have (they were
    sent as null while the manifest kept NaN)."""
    raise ValueError(f"{name} is not a JSON value")


@dataclass(frozen=True)
class Json(Kind):
    """A JSON object given as text (empty: none); `check` returns the object or refuses it
    with UsageError."""

    example: str
    check: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def value(self, raw: Any, say: Voice) -> Any:
        text = super().value(raw, say)
        if not text:
            return {}
        try:
            value = json.loads(text, parse_constant=_not_json)
        except json.JSONDecodeError as exc:
            say.fail(f"is not valid JSON ({exc.msg}); give a JSON object")
        except ValueError as exc:  # NaN, Infinity: Python's extension, no JSON server reads it
            say.fail(f"is not valid JSON ({exc}); give a number such as 0.7")
        if not isinstance(value, dict):
            say.fail(f"must be a JSON object, e.g. '{self.example}'")
        if self.check is not None:
            try:
                return self.check(value)
            except UsageError as exc:
                say.refused(exc, text, "{problem}")
        return value

    def setting(self, raw: Any, say: Voice) -> Any:
        self.value(raw, say)
        return raw
