"""The bootstrap's resample by groups (analysis/compare/bootstrap.py) against the matrix it
replaced: every request spelled out in every resample (resamples x samples), its counts
taken from its group's, the cumulative weight summed along the sorted values. The two must
agree bit for bit, ties, empty groups, zero-weight resamples and all."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.compare.bootstrap import Figure, StepSample, _groups, seed_for

_TOLERANCE = 1e-9


def _matrix_rank(fig: Figure, counts: np.ndarray) -> np.ndarray:
    """The former algorithm: (resamples x units) counts, a cumsum per resample."""
    assert fig.values is not None and fig.owner is not None and fig.weight is not None
    cum = np.cumsum(counts[:, fig.owner] * fig.weight, axis=1)
    total = cum[:, -1]
    idx = (cum < (fig.q * total - _TOLERANCE * total)[:, None]).sum(axis=1)
    value = fig.values[np.clip(idx, 0, len(fig.values) - 1)]
    return np.where(total > 0, value, np.nan)


def _matrix_mean(fig: Figure, counts: np.ndarray) -> np.ndarray:
    assert fig.values is not None and fig.owner is not None and fig.weight is not None
    units = counts.shape[1]
    sums = np.bincount(fig.owner, fig.weight * fig.values, minlength=units)
    weights = counts @ np.bincount(fig.owner, fig.weight, minlength=units)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(weights > 0, (counts @ sums) / weights, np.nan)


def _case(seed: int, requests: int, samples: int, ties: bool) -> tuple[Figure, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 50, samples) / 1000 if ties else rng.gamma(2.0, 0.01, samples)
    owner = rng.integers(0, requests, samples)
    weight = rng.integers(1, 6, samples).astype(np.float64)  # k tokens of one chunk
    order = np.argsort(values, kind="stable")
    done = rng.integers(0, 10**9, requests)
    return Figure("itl_p99_s", 0.0, 0.99, values[order], owner[order], weight[order],
                  requests=requests), _groups(done)  # fmt: skip


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize(("requests", "samples", "ties"),
                         [(400, 3000, False), (400, 3000, True), (7, 40, True), (1, 5, False)])  # fmt: skip
def test_a_percentile_by_groups_is_the_matrix_one_bit_for_bit(
    q: float, requests: int, samples: int, ties: bool
) -> None:
    fig, group = _case(requests + samples, requests, samples, ties)
    fig = Figure(fig.name, 0.0, q, fig.values, fig.owner, fig.weight, requests=requests)
    k = int(group.max()) + 1
    rng = np.random.default_rng(7)
    counts = rng.multinomial(k, np.full(k, 1.0 / k), size=300)
    counts[0] = 0  # a resample that drew nothing: NaN in both
    counts[1] = 0
    counts[1, 0] = k  # one group only
    got = fig.resample(counts, group)
    want = _matrix_rank(fig, counts[:, group])
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(got[0]) and np.isfinite(got[2:]).all()


def test_a_mean_by_groups_is_the_matrix_one() -> None:
    fig, group = _case(3, 300, 2000, False)
    mean = Figure("itl_mean_s", 0.0, None, fig.values, fig.owner, fig.weight, requests=300,
                  mean=True)  # fmt: skip
    k = int(group.max()) + 1
    counts = np.random.default_rng(1).multinomial(k, np.full(k, 1.0 / k), size=200)
    got = mean.resample(counts, group)
    assert np.allclose(got, _matrix_mean(mean, counts[:, group]), rtol=1e-12, atol=0)


def test_a_step_sample_draws_the_same_plan_as_before() -> None:
    """StepSample.resampled draws the group counts as it did (one generator, one plan for
    all figures), so seeds give the intervals they gave."""
    fig, group = _case(11, 500, 4000, False)
    sample = StepSample(500, {"itl_p99_s": fig}, group)
    got = sample.resampled(250, seed_for(0, 1, 2))["itl_p99_s"]
    rng = np.random.default_rng(seed_for(0, 1, 2))
    k = int(group.max()) + 1
    counts = rng.multinomial(k, np.full(k, 1.0 / k), size=250)[:, group]
    assert np.array_equal(got, _matrix_rank(fig, counts), equal_nan=True)
