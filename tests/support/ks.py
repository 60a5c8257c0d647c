"""Kolmogorov–Smirnov test of samples against the exponential distribution (no scipy)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def ks_exponential(samples: Sequence[float], rate: float) -> tuple[float, float]:
    """(D statistic, asymptotic p-value) of `samples` against Exp(rate)."""
    xs = sorted(samples)
    n = len(xs)
    d = 0.0
    for i, x in enumerate(xs):
        cdf = 1.0 - math.exp(-rate * x)
        d = max(d, (i + 1) / n - cdf, cdf - i / n)
    return d, kolmogorov_p(d, n)


def kolmogorov_p(d: float, n: int) -> float:
    """P(D_n >= d), Stephens' approximation of the Kolmogorov distribution."""
    root = math.sqrt(n)
    lam = (root + 0.12 + 0.11 / root) * d
    if lam < 0.2:
        return 1.0
    total = sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return max(0.0, min(1.0, 2 * total))


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation: standard deviation over mean."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean
