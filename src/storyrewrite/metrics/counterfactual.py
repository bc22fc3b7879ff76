"""Counterfactual forms of a metric M (the paper's sign conventions).

  predictive      M(Ŷ, Y_EE)
  delta           Δ_M = M(Ŷ, Y_EE) − M(Ŷ, X_OE)   (closer to the edit than to the original)
  counterfactual  M(Ŷ, Y_EE) + Δ_M = 2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)
"""
from __future__ import annotations


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
