"""One grammar for a number that may vary, and the one distribution type it parses to.

    K            fixed                    2, 0.5, 128 (any finite number float() reads)
    A-B          uniform, A to B          16-128 (the simulator's spelling of U(A,B))
    U(a,b)       uniform, a to b          U(2,5)
    N(mean,sd)   normal                   N(2,0.5)
    exp(mean)    exponential              exp(2)

Form names are case-insensitive; spaces around numbers are allowed. Each user offers the
spellings it documents and sets its own bounds, so a spelling means the same everywhere:

    --turns                      K, U(a,b)             whole numbers >= 1
    --think-time, --tool-latency K, U, N, exp          seconds >= 0
    simulator --output-len,      K, A-B                whole numbers >= 1
      --tokens-per-event
    workload lengths             K, U, N (each side of D(in,out), U(..)/(..), N(..)/(..)):
                                 tokens >= 1, fractions allowed (rounded; U bounds truncated)

An integer distribution draws whole numbers: uniform bounds included, normal and exponential
draws rounded. A draw below the minimum is clamped up to it (only N and exp can fall below:
a K, A-B or U below the minimum is refused when parsed). Sampling takes the caller's seeded
`random.Random`, so the same seed gives the same sequence.

A spec that is refused raises BadDistribution (a UsageError) naming the form and the rule it
broke; each user turns that into its own one-line message (they are documented).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Final

from analysis.kernel.errors import UsageError

NUMBER: Final = r"-?(?:\d+(?:\.\d*)?|\.\d+)"  # a plain decimal, as written inside the forms
_ARG = rf"\s*({NUMBER})\s*"
_FORMS: Final = {  # spelling -> (kind, pattern); A-B's numbers have no sign (-1 is K)
    "A-B": ("uniform", re.compile(r"^\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*$")),
    "U": ("uniform", re.compile(rf"^U\({_ARG},{_ARG}\)$", re.I)),
    "N": ("normal", re.compile(rf"^N\({_ARG},{_ARG}\)$", re.I)),
    "exp": ("exp", re.compile(rf"^exp\({_ARG}\)$", re.I)),
}
_SHOWN: Final = {"K": "K", "A-B": "A-B", "U": "U(a,b)", "N": "N(mean,sd)", "exp": "exp(mean)"}
SPELLINGS: Final = tuple(_SHOWN)


class BadDistribution(UsageError):
    """A refused spec. `rule`: syntax (no offered spelling matches), whole (a number is not
    whole), min (a value, low bound or mean below the minimum), order (high < low) or sd
    (a negative sd); `kind` and `params` (the numbers as written) say where."""

    def __init__(
        self, spec: str, rule: str, kind: str | None, params: tuple[float, ...], problem: str
    ) -> None:
        self.spec, self.rule, self.kind, self.params = spec, rule, kind, params
        super().__init__(f"{spec!r}: {problem}")


@dataclass(frozen=True)
class Distribution:
    """A fixed value, uniform, normal or exponential distribution; `sample(rng)` draws one.

    `a`: the value, the low bound or the mean; `b`: the high bound or the sd. `low`/`high`:
    the least and greatest draw (whole numbers when `integer`; `high` is inf for N and exp).
    """

    kind: str  # fixed, uniform, normal, exp
    a: float
    b: float = 0.0
    integer: bool = False
    minimum: float = 0.0
    spec: str = field(default="", compare=False)  # as the user wrote it
    low: Any = field(init=False, repr=False, compare=False)  # int when integer, else float
    high: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        whole = self.integer
        object.__setattr__(
            self, "minimum", math.ceil(self.minimum) if whole else float(self.minimum)
        )
        if self.kind == "fixed":  # a fraction rounds
            low = high = round(self.a) if whole else self.a
        elif self.kind == "uniform":  # fractional bounds truncate
            low, high = (int(self.a), int(self.b)) if whole else (self.a, self.b)
        else:
            low, high = self.minimum, math.inf
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def __str__(self) -> str:
        return self.spec

    def __eq__(self, other: object) -> bool:  # whichever user's wrapper made it
        if not isinstance(other, Distribution):
            return NotImplemented
        mine = (self.kind, self.a, self.b, self.integer, self.minimum)
        return mine == (other.kind, other.a, other.b, other.integer, other.minimum)

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def sample(self, rng: random.Random, clamp: bool = True) -> float:
        """One draw: a whole number when `integer`; one below the minimum (N and exp only)
        is raised to it unless `clamp` is False (for a caller that reports clamping)."""
        kind = self.kind
        if kind == "fixed":  # the fixed and uniform cases first: the simulator's per event
            return self.low
        if kind == "uniform":
            if self.integer:
                return rng.randint(self.low, self.high)
            return rng.uniform(self.low, self.high)
        if kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:
            value = rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        if self.integer:
            value = round(value)
        return value if value >= self.minimum or not clamp else self.minimum


def parse_distribution(
    text: str,
    *,
    spellings: Collection[str] = SPELLINGS,
    integer: bool = False,
    whole: bool | None = None,
    minimum: float = 0.0,
) -> Distribution:
    """Parse `text` in one of `spellings` (of SPELLINGS). `whole` (default: `integer`)
    refuses fractions; `minimum` bounds a K, the low bounds and the means. Raises
    BadDistribution, which the caller words for its option."""
    raw = str(text).strip()
    whole = integer if whole is None else whole
    found = _match(raw, spellings)
    if found is None:
        raise BadDistribution(
            raw, "syntax", None, (), f"is not one of {', '.join(_SHOWN[s] for s in spellings)}"
        )
    kind, params = found

    def refuse(rule: str, problem: str) -> BadDistribution:
        return BadDistribution(raw, rule, kind, params, problem)

    if whole and any(p != int(p) for p in params):
        raise refuse("whole", "needs whole numbers")
    if params[0] < minimum:
        raise refuse("min", f"needs a value, low bound or mean >= {minimum:g}")
    if kind == "uniform" and params[1] < params[0]:
        raise refuse("order", "needs low <= high")
    if kind == "normal" and params[1] < 0:
        raise refuse("sd", "needs sd >= 0")
    a, b = (*params, 0.0)[:2]
    return Distribution(kind, a, b, integer=integer, minimum=minimum, spec=raw)


def _match(raw: str, spellings: Collection[str]) -> tuple[str, tuple[float, ...]] | None:
    """The kind and the numbers of the first offered spelling `raw` is written in."""
    if "K" in spellings:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return "fixed", (value,)
    for spelling, (kind, pattern) in _FORMS.items():
        m = pattern.match(raw) if spelling in spellings else None
        if m:
            return kind, tuple(float(g) for g in m.groups())
    return None
