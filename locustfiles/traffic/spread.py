"""A number that may vary: turns per session, think times, tool latencies.

    parse_spread("--think-time", "exp(2)").sample(rng)    # seconds, mean 2
    parse_spread("--turns", "U(2,5)", integer=True).sample(rng)

Forms: `S` (fixed), `U(a,b)` (uniform; integers with bounds included when `integer`),
`N(mean,sd)` (normal, clamped at the minimum) and `exp(mean)` (exponential). Values are
>= 0 (>= 1 for integers); a spec that cannot give such values is refused with one line.
The grammar and the sampling are distribution.py's; this module words them for its options.
"""

from __future__ import annotations

from analysis.kernel.distribution import BadDistribution, Distribution, parse_distribution
from analysis.kernel.errors import UsageError

Spread = Distribution  # a spread is a distribution; `spec` is the text as given


def parse_spread(flag: str, text: str, integer: bool = False) -> Spread:
    """Parse `text` for option `flag`; UsageError names the problem and the forms."""
    what = "an integer >= 1" if integer else "seconds >= 0"
    forms = "N or U(a,b)" if integer else "S, U(a,b), N(mean,sd) or exp(mean)"
    example = "U(2,5)" if integer else "exp(2)"
    spellings = ("K", "U") if integer else ("K", "U", "N", "exp")
    low = 1 if integer else 0
    try:
        return parse_distribution(text, spellings=spellings, integer=integer, minimum=low)
    except BadDistribution as bad:
        problem = {
            None: "not understood",
            "fixed": f"must be {what}",
            "uniform": f"U(a,b) needs {low} <= a <= b" + (", whole numbers" if integer else ""),
            "normal": "N(mean,sd) needs mean >= 0 and sd >= 0",
            "exp": "exp(mean) needs mean >= 0",
        }[bad.kind]
        raise UsageError(
            f"{flag} {text!r}: {problem}; give {forms} ({what}), e.g. {flag} {example}"
        ) from None
