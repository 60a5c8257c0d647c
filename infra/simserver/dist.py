"""Integer distributions given on the command line: `K` (fixed) or `A-B` (uniform, inclusive)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from analysis.errors import UsageError


@dataclass(frozen=True)
class IntDist:
    """A fixed integer or a uniform integer range [low, high]."""

    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        if self.low == self.high:
            return self.low
        return rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"

    @classmethod
    def parse(cls, spec: str, *, minimum: int = 1, what: str = "value") -> IntDist:
        """Parse `K` or `A-B`; every value must be an integer >= `minimum`."""
        text = spec.strip()
        parts = text.split("-")
        try:
            if len(parts) == 1:
                low = high = int(parts[0])
            elif len(parts) == 2:
                low, high = int(parts[0]), int(parts[1])
            else:
                raise ValueError(text)
        except ValueError:
            raise UsageError(f"{what}: {spec!r} is not `K` or `A-B` (integers)") from None
        if low < minimum or high < low:
            raise UsageError(
                f"{what}: {spec!r} needs {minimum} <= A <= B; give an integer K >= {minimum} "
                f"or a range A-B, e.g. {what} {minimum}-{minimum + 2}"
            )
        return cls(low, high)
