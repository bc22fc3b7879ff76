import pytest

from storyrewrite.io import InputError
from storyrewrite.significance.compare import compare


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
    with pytest.raises(InputError, match="cover different instances"):
        compare({"nll": _rows([0.0] * 6), "x": _rows([1.0] * 3)}, "nll", 100, 0, by_story=False)
    with pytest.raises(InputError, match=r"`significance.baseline` = 'nll' has no scores; systems: x"):
        compare({"x": _rows([1.0] * 3)}, "nll", 100, 0, by_story=False)
