"""Metric names and the counterfactual forms of a metric M (the paper's sign conventions).

  predictive      M(Ŷ, Y_EE)
  delta           Δ_M = M(Ŷ, Y_EE) − M(Ŷ, X_OE)   (closer to the edit than to the original)
  counterfactual  M(Ŷ, Y_EE) + Δ_M = 2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)

Torch-free: significance testing and the report read scores through this module alone.
"""
from __future__ import annotations

from storyrewrite.metrics.registry import OVERLAP_METRICS

METRICS = tuple(OVERLAP_METRICS)  # every one higher-is-better, in table order
FORMS = ("predictive", "counterfactual")  # the forms reported and tested (delta is their difference)


def delta(vs_edited: float, vs_original: float) -> float:
    return vs_edited - vs_original


def counterfactual(vs_edited: float, vs_original: float) -> float:
    return vs_edited + delta(vs_edited, vs_original)


def forms(vs_edited: float, vs_original: float | None) -> dict[str, float]:
    """The three forms; only `predictive` where the task has no original ending."""
    if vs_original is None:
        return {"predictive": vs_edited}
    return {"predictive": vs_edited, "delta": delta(vs_edited, vs_original),
            "counterfactual": counterfactual(vs_edited, vs_original)}


def instance_value(row: dict, metric: str, form: str) -> float:
    """One instance's value of `metric` in `form`, from a per-instance scores row (`<metric>`
    against the edited ending, `<metric>_original` against the original ending)."""
    edited = row[metric]
    if form == "predictive":
        return edited
    if form == "counterfactual":
        return counterfactual(edited, row[f"{metric}_original"])
    if form == "delta":
        return delta(edited, row[f"{metric}_original"])
    raise ValueError(f"unknown form {form!r}; valid forms: predictive, delta, counterfactual")
