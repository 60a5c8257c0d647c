"""A number that may vary: turns per session, think times, tool latencies.

    parse_spread("--think-time", "exp(2)").sample(rng)    # seconds, mean 2
    parse_spread("--turns", "U(2,5)", integer=True).sample(rng)

Forms: `S` (fixed), `U(a,b)` (uniform; integers with bounds included when `integer`),
`N(mean,sd)` (normal, clamped at the minimum) and `exp(mean)` (exponential). Values are
>= 0 (>= 1 for integers); a spec that cannot give such values is refused with one line.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from analysis.errors import UsageError

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_FORMS = {
    "U": re.compile(rf"^U\({_NUM},{_NUM}\)$", re.I),
    "N": re.compile(rf"^N\({_NUM},{_NUM}\)$", re.I),
    "exp": re.compile(rf"^exp\({_NUM}\)$", re.I),
}


@dataclass(frozen=True)
class Spread:
    """A fixed value or a distribution; `sample(rng)` draws one value."""

    spec: str
    kind: str  # fixed, U, N, exp
    a: float
    b: float = 0.0
    integer: bool = False

    @property
    def minimum(self) -> float:
        return 1.0 if self.integer else 0.0

    @property
    def mean(self) -> float:
        return {"fixed": self.a, "U": (self.a + self.b) / 2, "N": self.a, "exp": self.a}[self.kind]

    def sample(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "U":
            value = (
                rng.randint(int(self.a), int(self.b))
                if self.integer
                else rng.uniform(self.a, self.b)
            )
        elif self.kind == "N":
            value = rng.gauss(self.a, self.b)
        else:
            value = rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        value = max(self.minimum, value)
        return float(round(value)) if self.integer else value


def parse_spread(flag: str, text: str, integer: bool = False) -> Spread:
    """Parse `text` for option `flag`; UsageError names the problem and the forms."""
    raw = str(text).strip()
    what = "an integer >= 1" if integer else "seconds >= 0"
    forms = "N or U(a,b)" if integer else "S, U(a,b), N(mean,sd) or exp(mean)"
    example = "U(2,5)" if integer else "exp(2)"

    def bad(problem: str) -> UsageError:
        return UsageError(
            f"{flag} {text!r}: {problem}; give {forms} ({what}), e.g. {flag} {example}"
        )

    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value):
        if (integer and (value != int(value) or value < 1)) or value < 0:
            raise bad(f"must be {what}")
        return Spread(raw, "fixed", value, integer=integer)
    for kind, pattern in _FORMS.items():
        if integer and kind != "U":
            continue
        m = pattern.match(raw)
        if not m:
            continue
        nums = [float(g) for g in m.groups()]
        if kind == "U":
            a, b = nums
            low = 1 if integer else 0
            if a < low or b < a or (integer and (a != int(a) or b != int(b))):
                raise bad(f"U(a,b) needs {low} <= a <= b" + (", whole numbers" if integer else ""))
            return Spread(raw, "U", a, b, integer)
        if kind == "N":
            mean, sd = nums
            if mean < 0 or sd < 0:
                raise bad("N(mean,sd) needs mean >= 0 and sd >= 0")
            return Spread(raw, "N", mean, sd, integer)
        (mean,) = nums
        if mean < 0:
            raise bad("exp(mean) needs mean >= 0")
        return Spread(raw, "exp", mean, 0.0, integer)
    raise bad("not understood")
