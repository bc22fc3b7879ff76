import pytest

from storyrewrite.metrics.counterfactual import forms


def test_a_prediction_closer_to_the_edit_gains():
    # M(Ŷ, Y_EE) = -1.0, M(Ŷ, X_OE) = -3.0: closer to the edit than to the original.
    result = forms(-1.0, -3.0)
    assert result == {"predictive": -1.0, "delta": pytest.approx(2.0), "counterfactual": pytest.approx(1.0)}


def test_copying_the_original_ending_is_penalised():
    # A copy of X_OE: perfect against the original (0), worse against the edit (-2).
    result = forms(-2.0, 0.0)
    assert result["delta"] == pytest.approx(-2.0) and result["counterfactual"] == pytest.approx(-4.0)
    # ROUGE-style (higher is better): 60 vs edit, 90 vs original -> 2*60 - 90 = 30.
    assert forms(60.0, 90.0)["counterfactual"] == pytest.approx(30.0)


def test_without_an_original_ending_only_the_predictive_form():
    assert forms(-1.5, None) == {"predictive": -1.5}


def test_every_overlap_metric_has_a_label_a_metrics_field_and_a_validity_label():
    """What docs/extending.md lists for a new metric, beyond its computation (tests/metrics/
    test_evaluate.py) and its validity check (tests/significance/test_validity.py)."""
    from storyrewrite.artifacts import SystemMetrics
    from storyrewrite.metrics.counterfactual import METRICS
    from storyrewrite.report.tables import METRIC_LABELS
    from storyrewrite.significance.validity import LABELS

    places = {"storyrewrite.report.tables.METRIC_LABELS": METRIC_LABELS, "storyrewrite.significance.validity.LABELS": LABELS,
              "storyrewrite.artifacts.SystemMetrics": SystemMetrics.model_fields}
    missing = [f"{metric} is missing from {place}" for metric in METRICS for place, names in places.items() if metric not in names]
    assert missing == []
