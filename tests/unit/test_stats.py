"""DistributionSummary: nearest-rank weighted percentiles, missing (NaN) rather than 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.derive.metrics import Samples
from analysis.derive.stats import DistributionSummary, SortedSamples, weighted_quantiles
from analysis.kernel.percentiles import STATS


def test_nearest_rank_on_ten_values() -> None:
    s = DistributionSummary.of(np.arange(1.0, 11.0))
    assert (s.count, s.mean, s.p50, s.p90, s.p95, s.p99, s.p999, s.max) == (
        10, 5.5, 5.0, 9.0, 10.0, 10.0, 10.0, 10.0
    )  # fmt: skip


def test_hundred_values_hit_exact_ranks_despite_float_rounding() -> None:
    s = DistributionSummary.of(np.arange(1.0, 101.0) / 1000)
    assert (s.p50, s.p90, s.p95, s.p99, s.p999) == pytest.approx(
        (0.050, 0.090, 0.095, 0.099, 0.100)
    )


def test_weights_equal_expanded_samples() -> None:
    rng = np.random.default_rng(1)
    values = rng.exponential(0.02, 500)
    weights = rng.integers(1, 5, 500).astype(float)
    weighted = DistributionSummary.of(values, weights)
    expanded = DistributionSummary.of(np.repeat(values, weights.astype(int)))
    for stat in STATS:
        assert weighted.get(stat) == pytest.approx(expanded.get(stat)), stat
    assert weighted.count == int(weights.sum())


def test_per_token_itl_samples_weight_every_token() -> None:
    # one chunk of 9 tokens after 0.9 s (9 x 0.1) and one token after 1.0 s
    samples = Samples(np.array([0, 0]), np.array([0.1, 1.0]), np.array([9.0, 1.0]))
    s = DistributionSummary.of_samples(samples)
    assert (s.count, s.p50, s.p90, s.p95, s.max) == (10, 0.1, 0.1, 1.0, 1.0)
    assert s.mean == pytest.approx(0.19)


def test_no_data_is_nan_never_zero() -> None:
    for s in (
        DistributionSummary.of(np.array([])),
        DistributionSummary.of(np.array([np.nan, np.nan])),
        DistributionSummary.of(np.array([1.0]), np.array([0.0])),
    ):
        assert s.count == 0
        assert all(math.isnan(s.get(stat)) for stat in STATS)


def test_nan_values_and_zero_weights_are_ignored() -> None:
    s = DistributionSummary.of(np.array([np.nan, 2.0, 100.0, 4.0]), np.array([1, 1, 0, 1.0]))
    assert (s.count, s.mean, s.p50, s.max) == (2, 3.0, 2.0, 4.0)


def test_columns_are_named_metric_stat_unit() -> None:
    cols = DistributionSummary.of(np.array([1.0, 2.0])).columns("ttft")
    assert list(cols) == [f"ttft_{s}_s" for s in STATS]
    with pytest.raises(KeyError):
        DistributionSummary.empty().get("p42")


def test_quantile_curve_is_monotonic_and_bounded() -> None:
    values = np.array([3.0, 1.0, 2.0])
    curve = SortedSamples.of(values).quantiles(np.linspace(0, 1, 11))
    assert curve[0] == 1.0 and curve[-1] == 3.0 and (np.diff(curve) >= 0).all()
    assert np.isnan(weighted_quantiles(np.array([]), None, [0.5])).all()
