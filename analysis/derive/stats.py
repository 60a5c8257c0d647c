"""One distribution summary, reused for every metric (TTFT, TPOT, ITL, ICL, E2E...).

Percentiles are nearest-rank (inverted CDF) over weighted samples: the p-th percentile is
the smallest sample value v such that the samples <= v carry at least p of the total weight.
No interpolation, so every reported value is a value that was measured, and k samples of
one value weigh exactly as much as one sample of weight k (per-token ITL relies on this).
No data gives NaN, never 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from analysis.derive.metrics import Samples
from analysis.kernel.percentiles import PERCENTILES, STATS

# Relative tolerance when comparing a cumulative weight with q * total: float weights must
# not turn "exactly 99 of 100" into "just under 99".
_RANK_TOLERANCE = 1e-9


def _clean(values: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(values, dtype=np.float64)
    w = np.ones(len(v)) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = ~np.isnan(v) & (w > 0)
    if keep.all():
        return v, w
    return v[keep], w[keep]


@dataclass(frozen=True)
class SortedSamples:
    """Samples sorted by value once, so any number of quantiles costs a binary search each."""

    values: np.ndarray  # sorted ascending, no NaN
    cum_weight: np.ndarray | None  # cumulative weights in that order; None: every weight is 1
    mean: float

    @classmethod
    def of(cls, values: np.ndarray, weights: np.ndarray | None = None) -> SortedSamples:
        v, w = _clean(values, weights)
        if len(v) == 0:
            return cls(v, None, float("nan"))
        if weights is None or bool((w == 1).all()):
            return cls(np.sort(v), None, float(v.mean()))
        mean = float(np.dot(v, w) / w.sum())
        order = np.argsort(v)
        return cls(v[order], np.cumsum(w[order]), mean)

    @property
    def total(self) -> float:
        if self.cum_weight is None:
            return float(len(self.values))
        return float(self.cum_weight[-1]) if len(self.cum_weight) else 0.0

    def quantiles(self, qs: np.ndarray | list[float]) -> np.ndarray:
        """Nearest-rank quantiles `qs` (0..1); NaN for each when there are no samples."""
        q = np.asarray(qs, dtype=np.float64)
        n = len(self.values)
        if n == 0:
            return np.full(q.shape, np.nan)
        total = self.total
        target = q * total - _RANK_TOLERANCE * total
        if self.cum_weight is None:
            idx = np.ceil(target).astype(np.int64) - 1
        else:
            idx = np.searchsorted(self.cum_weight, target, side="left")
        return np.asarray(self.values[np.clip(idx, 0, n - 1)], dtype=np.float64)


def weighted_quantiles(
    values: np.ndarray, weights: np.ndarray | None, qs: np.ndarray | list[float]
) -> np.ndarray:
    """Nearest-rank quantiles `qs` (0..1) of weighted samples; NaN for each when no data."""
    return SortedSamples.of(values, weights).quantiles(qs)


@dataclass(frozen=True)
class DistributionSummary:
    """count (total weight), mean, named percentiles and max of one metric's samples."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float

    @classmethod
    def empty(cls) -> DistributionSummary:
        nan = float("nan")
        return cls(0, nan, nan, nan, nan, nan, nan, nan)

    @classmethod
    def of(cls, values: np.ndarray, weights: np.ndarray | None = None) -> DistributionSummary:
        """Summary of `values`, each standing for `weights[i]` samples (1 when omitted)."""
        return cls.of_sorted(SortedSamples.of(values, weights))

    @classmethod
    def of_sorted(cls, samples: SortedSamples) -> DistributionSummary:
        if len(samples.values) == 0:
            return cls.empty()
        p50, p90, p95, p99, p999 = (float(p) for p in samples.quantiles(list(PERCENTILES.values())))
        return cls(
            count=int(round(samples.total)),
            mean=samples.mean,
            p50=p50,
            p90=p90,
            p95=p95,
            p99=p99,
            p999=p999,
            max=float(samples.values[-1]),
        )

    @classmethod
    def of_samples(cls, samples: Samples) -> DistributionSummary:
        """Summary of weighted per-token (ITL) or per-chunk (ICL) samples."""
        return cls.of(samples.value_s, samples.weight)

    def get(self, stat: str) -> float:
        """The value of one statistic by name (`mean`, `p99`, `max`...)."""
        if stat not in STATS:
            raise KeyError(f"unknown statistic {stat!r}; expected one of {', '.join(STATS)}")
        return float(getattr(self, stat))

    def columns(self, metric: str, unit: str = "s") -> dict[str, float]:
        """`{f"{metric}_{stat}_{unit}": value}` for every statistic in STATS."""
        values = asdict(self)
        return {f"{metric}_{stat}_{unit}": float(values[stat]) for stat in STATS}
