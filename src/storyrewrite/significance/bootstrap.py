"""One-tailed paired bootstrap test of H1: system a scores higher than system b on average.

Each resample draws n units with replacement (instances, or whole stories when `clusters` is
given, since a story's three edited endings are not independent) and recomputes the mean of the
paired difference d = a − b. The p-value is the share of resamples whose mean difference is
≤ 0: near 0 when a is clearly better, near 0.5 when they are exchangeable, 1 when a is never
better.

Resample means are computed as counts @ sums: a (resamples × units) matrix of how often each
unit was drawn times a (units × metrics) matrix, in chunks, so that all metrics share the same
resamples and the whole test is a few matrix products.
"""
from __future__ import annotations

import numpy as np


def paired_bootstrap(a, b, n_resamples: int = 10_000, seed: int = 0, clusters=None) -> float:
    """p-value of H1: mean(a) > mean(b), for paired per-instance scores `a` and `b`."""
    return float(paired_bootstrap_many(np.asarray(a, dtype=np.float64)[:, None],
                                       np.asarray(b, dtype=np.float64)[:, None], n_resamples, seed, clusters)[0])


def paired_bootstrap_many(a, b, n_resamples: int = 10_000, seed: int = 0, clusters=None, chunk: int = 250,
                          tie: float = 0.0) -> np.ndarray:
    """p-values for several metrics at once: a, b are n×m (instances × metrics); returns m.
    Paired differences smaller than `tie` in size count as 0 (ties)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] == 0:
        raise ValueError(f"paired_bootstrap: a and b must be the same non-empty n×m shape, got {a.shape} and {b.shape}")
    differences = a - b
    differences[np.abs(differences) < tie] = 0.0
    means = resample_means(differences, n_resamples, seed, clusters, chunk)
    return (means <= 0).sum(axis=0) / n_resamples


def resample_means(values, n_resamples: int = 10_000, seed: int = 0, clusters=None, chunk: int = 250) -> np.ndarray:
    """The mean of each column of `values` (n×m) in each of `n_resamples` bootstrap resamples of
    its rows (of whole clusters, with `clusters`): n_resamples×m. The draws depend on the seed
    and the number of units only, so every column and every caller with the same units sees
    the same resamples."""
    values = np.asarray(values, dtype=np.float64)
    if clusters is None:
        sums, sizes = values, np.ones(len(values))
    else:
        _, unit = np.unique(np.asarray(clusters), return_inverse=True)
        sums = np.zeros((unit.max() + 1, values.shape[1]))
        np.add.at(sums, unit, values)
        sizes = np.bincount(unit).astype(np.float64)
    units = len(sizes)
    columns = np.hstack([sums, sizes[:, None]])  # units × (m + 1)
    rng = np.random.default_rng(seed)
    means = np.empty((n_resamples, values.shape[1]))
    for start in range(0, n_resamples, chunk):
        rows = min(chunk, n_resamples - start)
        draws = rng.integers(0, units, size=(rows, units), dtype=np.int32)
        offsets = (np.arange(rows, dtype=np.int64) * units)[:, None]
        counts = np.bincount((draws + offsets).ravel(), minlength=rows * units).reshape(rows, units)
        totals = counts.astype(np.float64) @ columns  # rows × (m + 1): Σ values and Σ sizes drawn
        means[start : start + rows] = totals[:, :-1] / totals[:, -1:]
    return means


def percentile_interval(values, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0, clusters=None) -> np.ndarray:
    """The bootstrap percentile interval of each column's mean: values n×m -> m×2 (low, high)."""
    means = resample_means(values, n_resamples, seed, clusters)
    tail = (1 - level) / 2
    return np.quantile(means, [tail, 1 - tail], axis=0).T
