import math

import numpy as np
import pytest

from storyrewrite.significance import paired_bootstrap, paired_bootstrap_many


def test_clear_difference_gives_p_near_zero():
    rng = np.random.default_rng(1)
    b = rng.normal(0, 1, 500)
    assert paired_bootstrap(b + 1.0, b, n_resamples=2000) == 0.0


def test_symmetric_null_gives_p_near_one_half():
    rng = np.random.default_rng(2)
    d = rng.normal(0, 1, 400)
    a = np.concatenate([d, -d])  # the mean difference is exactly 0 and symmetric
    assert paired_bootstrap(a, np.zeros_like(a), n_resamples=10_000) == pytest.approx(0.5, abs=0.03)


def test_never_better_gives_one():
    b = np.linspace(0, 1, 100)
    assert paired_bootstrap(b - 0.1, b) == 1.0
    assert paired_bootstrap(b, b) == 1.0  # ties are not "better"
    a = b.copy()
    a[::2] -= 0.5  # worse on half, equal on the rest
    assert paired_bootstrap(a, b) == 1.0


def test_agrees_with_the_normal_approximation():
    rng = np.random.default_rng(3)
    n = 5000
    d = rng.normal(0.01, 1.0, n)
    expected = 1 - 0.5 * (1 + math.erf((d.mean() / (d.std(ddof=1) / math.sqrt(n))) / math.sqrt(2)))
    assert 0.05 < expected < 0.95  # a case where the p-value is not trivially 0 or 1
    assert paired_bootstrap(d, np.zeros(n), n_resamples=10_000, seed=0) == pytest.approx(expected, abs=0.01)


def test_story_clusters_resample_whole_stories():
    rng = np.random.default_rng(4)
    story_effect = np.repeat(rng.normal(0.05, 1.0, 300), 3)  # 3 endings share a story
    d = story_effect + rng.normal(0, 0.1, 900)
    stories = np.repeat(np.arange(300), 3)
    p_instances = paired_bootstrap(d, np.zeros(900), seed=0)
    p_stories = paired_bootstrap(d, np.zeros(900), seed=0, clusters=stories)
    se = story_effect[::3].std(ddof=1) / math.sqrt(300)
    expected = 1 - 0.5 * (1 + math.erf(d.mean() / se / math.sqrt(2)))
    assert p_stories == pytest.approx(expected, abs=0.015)
    # Treating correlated endings as independent understates the uncertainty.
    assert abs(p_instances - 0.5) > abs(p_stories - 0.5)


def test_many_metrics_match_one_at_a_time_and_shapes_are_checked():
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.05, 1, (300, 3)), rng.normal(0, 1, (300, 3))
    many = paired_bootstrap_many(a, b, n_resamples=3000, seed=7)
    single = [paired_bootstrap(a[:, j], b[:, j], n_resamples=3000, seed=7) for j in range(3)]
    assert many.tolist() == pytest.approx(single)
    with pytest.raises(ValueError, match="same non-empty"):
        paired_bootstrap_many(a, b[:10])


def test_the_percentile_interval_agrees_with_the_normal_approximation():
    """The 95 % interval of a mean of n draws: mean ± 1.96·sd/√n for a large n (to 5 %, bootstrap
    noise aside); each column its own, and a 90 % interval narrower by 1.645/1.96."""
    from storyrewrite.significance.bootstrap import percentile_interval

    values = np.random.default_rng(0).normal(size=(400, 2)) * [1.0, 3.0]
    means, half = values.mean(axis=0), 1.96 * values.std(axis=0, ddof=1) / math.sqrt(400)
    bounds = percentile_interval(values, 0.95, n_resamples=20_000, seed=1)
    assert bounds[:, 0] == pytest.approx(means - half, abs=0.05 * half.max())
    assert bounds[:, 1] == pytest.approx(means + half, abs=0.05 * half.max())
    narrower = percentile_interval(values, 0.90, n_resamples=20_000, seed=1)
    assert (narrower[:, 1] - narrower[:, 0]) / (bounds[:, 1] - bounds[:, 0]) == pytest.approx([1.645 / 1.96] * 2, rel=0.05)
