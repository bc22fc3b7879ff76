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


def test_the_metrics_files_have_a_field_for_each_registered_overlap_metric_in_its_order():
    """The one place beside its registry entry that docs/extending.md names for a new metric."""
    from storyrewrite.metrics.artifacts import Overlap, SystemMetrics
    from storyrewrite.metrics.registry import OVERLAP_METRICS

    fields = [name for name, field in SystemMetrics.model_fields.items() if field.annotation in (Overlap, Overlap | None)]
    assert fields == list(OVERLAP_METRICS), ("storyrewrite.metrics.artifacts.SystemMetrics: one `<name>: Overlap` field per metric of "
                                             "OVERLAP_METRICS (`Overlap | None = None` for one computed only where its model is named)")
    optional = [name for name, metric in OVERLAP_METRICS.items() if metric.needs not in (None, "scorer")]
    assert all(SystemMetrics.model_fields[name].default is None for name in optional), "an optional metric's field defaults to None"
