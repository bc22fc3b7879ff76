import numpy as np
import pytest

from storyrewrite.io import InputError
from storyrewrite.metrics.columns import available, value
from storyrewrite.significance.bootstrap import paired_bootstrap_many
from storyrewrite.significance.compare import Pair, compare, compare_tests, compare_units


def _rows(values, original=None):
    rows = []
    for i, v in enumerate(values):
        row = {"id": f"s{i // 3}:{i % 3}", "story_id": f"s{i // 3}", "bartscore": v, "rougeL": 10 * v, "sacrebleu": 5 * v}
        if original is not None:
            row |= {"bartscore_original": original[i], "rougeL_original": 10 * original[i], "sacrebleu_original": 5 * original[i]}
        rows.append(row)
    return rows


def test_every_metric_and_form_against_the_baseline():
    base = _rows([-2.0] * 30, original=[-1.0] * 30)
    better = _rows([-1.0] * 30, original=[-1.0] * 30)  # closer to the edit, same distance to the original
    copy = _rows([-2.0] * 30, original=[0.0] * 30)  # the original copied: counterfactual form much worse
    result = compare({"nll": base, "dto": better, "copy_original": copy}, "nll", n_resamples=500, seed=0, by_story=True)
    assert set(result) == {"dto", "copy_original"}
    assert set(result["dto"]) == {f"{m}/{f}" for m in ("bartscore", "rougeL", "sacrebleu") for f in ("predictive", "counterfactual")}
    assert all(p == 0.0 for p in result["dto"].values())
    assert result["copy_original"]["bartscore/predictive"] == 1.0  # ties are not improvements
    assert result["copy_original"]["bartscore/counterfactual"] == 1.0


def test_without_original_endings_only_predictive_forms():
    result = compare({"nll": _rows([0.0] * 6), "x": _rows([1.0] * 6)}, "nll", 100, 0, by_story=False)
    assert set(result["x"]) == {"bartscore/predictive", "rougeL/predictive", "sacrebleu/predictive"}


def test_mismatched_instances_and_missing_baseline_are_errors():
    with pytest.raises(InputError, match="scores of `x` and `nll` cover different instances: 3 and 6 instance ids, 3 in both$"):
        compare({"nll": _rows([0.0] * 6), "x": _rows([1.0] * 3)}, "nll", 100, 0, by_story=False)
    # Every instance, one of them twice: which of its two rows to test is no one's guess.
    repeated = _rows([1.0] * 6)
    with pytest.raises(InputError, match=r"cover different instances: 6 and 6 instance ids, 6 in both; `x` repeats 1 id\(s\)$"):
        compare({"nll": _rows([0.0] * 6), "x": repeated + [{**repeated[2], "bartscore": 9.0}]}, "nll", 100, 0, by_story=False)
    with pytest.raises(InputError, match=r"`significance.baseline` = 'nll' has no scores; systems: x"):
        compare({"x": _rows([1.0] * 3)}, "nll", 100, 0, by_story=False)


@pytest.mark.parametrize("by_story", [False, True])
def test_systems_tested_together_get_the_p_values_of_their_own_tests(by_story):
    """compare draws the resamples once for every system: each system's p-values are those of a
    bootstrap of its own against the baseline (paired_bootstrap_many on the same seed), also for
    a system whose scores have fewer columns (no original-ending forms)."""
    rng = np.random.default_rng(3)
    n = 60
    base = _rows(list(rng.normal(-2.0, 0.3, n)), original=list(rng.normal(-1.5, 0.3, n)))
    systems = {"nll": base,
               "near": _rows([r["bartscore"] + d for r, d in zip(base, rng.normal(0.02, 0.2, n), strict=True)],
                             original=list(rng.normal(-1.5, 0.3, n))),
               "worse": _rows([r["bartscore"] + d for r, d in zip(base, rng.normal(-0.05, 0.2, n), strict=True)],
                              original=list(rng.normal(-1.4, 0.3, n))),
               "predictive_only": _rows([r["bartscore"] + d for r, d in zip(base, rng.normal(0.0, 0.2, n), strict=True)])}
    together = compare(systems, "nll", n_resamples=2000, seed=7, by_story=by_story)
    clusters = [row["story_id"] for row in base] if by_story else None
    for system in ("near", "worse", "predictive_only"):
        alone = compare({"nll": base, system: systems[system]}, "nll", n_resamples=2000, seed=7, by_story=by_story)[system]
        assert together[system] == alone
        columns = list(alone)
        a = np.array([[value(row, c) for c in columns] for row in systems[system]])
        b = np.array([[value(row, c) for c in columns] for row in base])
        expected = paired_bootstrap_many(a, b, n_resamples=2000, seed=7, clusters=clusters)
        assert list(alone.values()) == [round(float(p), 4) for p in expected]
    assert len(together["predictive_only"]) == 3 and len(together["near"]) == 6
    assert 0.0 < min(together["near"].values()) < max(together["worse"].values()) < 1.0  # p-values that could move


def test_differences_within_float_rounding_are_ties():
    """Identical predictions scored in other batches differ by a few 1e-7. Where most predictions
    are the same (a model continued for a few steps), a resample can draw only those: its mean is
    then that noise, of either sign. The p-values are those of exact ties, whatever the noise,
    while a difference of 1e-4 still counts."""
    rng = np.random.default_rng(11)
    n = 24
    base = _rows(list(rng.normal(-2.0, 0.3, n)))
    real = np.where(np.arange(n) % 6 == 0, rng.uniform(0.01, 0.05, n), 0.0)  # 4 of 24 instances changed, for the better
    system = lambda noise: _rows([r["bartscore"] + d + e for r, d, e in zip(base, real, noise, strict=True)])  # noqa: E731

    def p(noise):
        return compare({"nll": base, "x": system(noise)}, "nll", n_resamples=2000, seed=1, by_story=False)["x"]["bartscore/predictive"]

    exact = p(np.zeros(n))
    assert 0.0 < exact < 0.1  # the resamples that drew none of the 4 (about (20/24)^24 of them)
    for seed in range(3):
        noise = np.random.default_rng(seed).uniform(-8e-7, 8e-7, n) * (real == 0)
        assert p(noise) == exact
    assert p(np.full(n, 1e-4) * (real == 0)) < exact  # a real (if small) gain on the other 20: no resample ties


def test_the_same_prediction_is_a_tie_whatever_its_scores_rounding():
    """With a bfloat16 scorer the same prediction scores up to a few 1e-2 apart in other batches,
    above TIE. Rows that name the same prediction (`prediction_digest`) are ties in every column:
    the p-values are those of exact ties, row order aside; rows naming other predictions, or none,
    keep their differences."""
    rng = np.random.default_rng(12)
    n = 24
    base = _rows(list(rng.normal(-2.0, 0.3, n)), list(rng.normal(-1.5, 0.3, n)))
    changed = np.arange(n) % 6 == 0  # 4 of 24 predictions changed, for the better
    gain = np.where(changed, rng.uniform(0.01, 0.05, n), 0.0)
    for i, row in enumerate(base):
        row["prediction_digest"] = f"{i:012x}"

    def system(noise, digests=True):
        rows = _rows([r["bartscore"] + g + e for r, g, e in zip(base, gain, noise, strict=True)],
                     [r["bartscore_original"] + e for r, e in zip(base, noise, strict=True)])
        if digests:
            for i, row in enumerate(rows):
                row["prediction_digest"] = f"{i + 1000 * changed[i]:012x}"
        return rows[::-1]  # in another order: matched by id

    def p(rows):
        return compare({"nll": base, "x": rows}, "nll", n_resamples=2000, seed=1, by_story=False)["x"]

    exact = p(system(np.zeros(n)))
    bf16 = rng.uniform(-3e-2, 3e-2, n) * ~changed
    assert p(system(bf16)) == exact
    assert 0.0 < exact["bartscore/predictive"] < 0.1 and list(exact) == available(base[0]) and len(exact) == 6
    assert p(system(bf16, digests=False))["bartscore/predictive"] != exact["bartscore/predictive"]  # without them, the noise counts


def test_tests_of_different_baselines_in_one_call_get_the_p_values_of_their_own_tests():
    """compare_tests runs one bootstrap per unit for every test whose baseline lists the same
    instances in the same order, whatever the baseline's scores (another run's NLL model, or a
    head-to-head both ways), and one per order otherwise: each test's p-values are those of
    compare_units on its own two score files, and a system's rows are matched by id."""
    rng = np.random.default_rng(8)
    n = 60

    def noisy(shift, rows=None):
        return _rows([(r["bartscore"] if rows else -2.0) + d for r, d in zip(rows or [{}] * n, rng.normal(shift, 0.3, n), strict=True)],
                     original=list(rng.normal(-1.5, 0.3, n)))

    first, second = noisy(0.0), noisy(0.0)
    a, b = noisy(0.03, first), noisy(0.02, second)
    reordered = second[::-1]  # the same instances, another order: a bootstrap of its own
    tests = {"a": Pair("a", a, "first", first), "b": Pair("b", b, "second", second),
             ("a", "better"): Pair("a", a, "b", b), ("a", "worse"): Pair("b", b, "a", a),
             "b-reordered": Pair("b", b[::-1], "second", reordered)}
    found = compare_tests(tests, n_resamples=1500, seed=4)
    for key, test in tests.items():
        alone = compare_units({test.system: test.rows, test.baseline: test.base_rows}, test.system, test.baseline, 1500, 4)
        for unit in ("instance", "story"):
            assert found[unit][key] == alone[unit], (key, unit)
    assert found["instance"]["b-reordered"] != found["instance"]["b"]  # other resamples of the same pairs
    values = [p for unit in found.values() for columns in unit.values() for p in columns.values()]
    assert len(set(values)) > 10 and 0.0 < min(values) and max(values) < 1.0  # p-values that could move
    with pytest.raises(ValueError, match="unknown units"):
        compare_tests(tests, 100, 0, units=("stories",))
