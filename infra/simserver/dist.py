"""Integer distributions given on the command line: `K` (fixed) or `A-B` (uniform, inclusive).

The grammar and the sampling are analysis.kernel.distribution's (one for all of llmload);
this is the simulator's wording of it: whole numbers >= a minimum, built from (low, high).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from analysis.kernel.distribution import BadDistribution, Distribution, parse_distribution
from analysis.kernel.errors import UsageError


class IntDist(Distribution):
    """A fixed integer or a uniform integer range [low, high]."""

    if TYPE_CHECKING:  # the draws are whole numbers
        low: int
        high: int

        def sample(self, rng: random.Random, clamp: bool = True) -> int: ...

    def __init__(self, low: int, high: int) -> None:
        if low == high:
            super().__init__("fixed", low, integer=True, spec=str(low))
        else:
            super().__init__("uniform", low, high, integer=True, spec=f"{low}-{high}")

    @classmethod
    def parse(cls, spec: str, *, minimum: int = 1, what: str = "value") -> IntDist:
        """Parse `K` or `A-B`; every value must be an integer >= `minimum`."""
        try:
            dist = parse_distribution(spec, spellings=("K", "A-B"), integer=True, minimum=minimum)
        except BadDistribution as bad:
            if bad.rule in ("syntax", "whole"):
                raise UsageError(f"{what}: {spec!r} is not `K` or `A-B` (integers)") from None
            raise UsageError(
                f"{what}: {spec!r} needs {minimum} <= A <= B; give an integer K >= {minimum} "
                f"or a range A-B, e.g. {what} {minimum}-{minimum + 2}"
            ) from None
        return cls(dist.low, dist.high)
