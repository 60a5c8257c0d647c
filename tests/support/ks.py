"""Kolmogorov–Smirnov tests: samples against the exponential distribution, and two samples
against each other (no scipy)."""

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


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(D statistic, asymptotic p-value) of the two-sample test: are `a` and `b` drawn from
    the same distribution?"""
    xs, ys = sorted(a), sorted(b)
    n, m = len(xs), len(ys)
    i = j = 0
    d = 0.0
    while i < n and j < m:
        x = min(xs[i], ys[j])
        while i < n and xs[i] <= x:
            i += 1
        while j < m and ys[j] <= x:
            j += 1
        d = max(d, abs(i / n - j / m))
    return d, kolmogorov_p(d, round(n * m / (n + m)))


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
