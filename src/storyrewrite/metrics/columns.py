"""The columns of the results tables, and each instance's value in them (torch-free: significance
testing and the report read scores through this module alone).

Two tables, two families of columns, every one higher-is-better:
- overlap with the references (`<metric>/<form>`): BARTScore, ROUGE-L and SacreBLEU (and
  BERTScore where `models.bertscore` names its encoder), each predictive and counterfactual
  (storyrewrite.metrics.counterfactual);
- following the counterfactual (storyrewrite.metrics.coherence): `cf_pmi`, `cf_follow` (the
  share of instances with cf_pmi > 0), `drift`, `ents`. `hmean` is a corpus figure (it combines
  corpus BLEU with mean EntScore), shown but not resampled.

A per-instance scores row holds `<metric>` and `<metric>_original` for the overlap metrics and
`cf_pmi`, `drift`, `ents` where they were computed (and, from the score stage, `scored_by`: the
model behind each of those computed with one).
"""
from __future__ import annotations

from storyrewrite.metrics.counterfactual import FORMS, METRICS, instance_value

COHERENCE = ("cf_pmi", "cf_follow", "drift", "ents")  # tested per instance
COHERENCE_TABLE = (*COHERENCE, "hmean")  # the "Following the counterfactual" table
OVERLAP = tuple(f"{metric}/{form}" for form in FORMS for metric in METRICS)


def coherence_value(row: dict, column: str) -> float:
    if column == "cf_follow":
        return float(row["cf_pmi"] > 0)
    return row[column]


def value(row: dict, column: str) -> float:
    """One instance's value in `column` (`<metric>/<form>` or a coherence column)."""
    if "/" in column:
        metric, form = column.split("/")
        return instance_value(row, metric, form)
    return coherence_value(row, column)


def source(column: str) -> str:
    """The row field `column`'s values come from (a counterfactual form's `<metric>_original` too,
    which the same model scores)."""
    return column.split("/")[0] if "/" in column else "cf_pmi" if column == "cf_follow" else column


def available(row: dict) -> list[str]:
    """The tested columns a per-instance scores row supports, in table order."""
    overlap = [c for c in OVERLAP if (metric := source(c)) in row and (c.endswith("/predictive") or f"{metric}_original" in row)]
    return overlap + [c for c in COHERENCE if source(c) in row]


def keeps_original(rows: list[dict]) -> float | None:
    """The share (%) of the rows whose prediction keeps the original ending X_OE word for word:
    ROUGE-L of 100 against it, the same words in the same order once ROUGE's tokeniser has
    dropped case and punctuation and stemmed them. None where the rows hold no ROUGE-L against
    X_OE (a task without an original ending)."""
    if not rows or any("rougeL_original" not in row for row in rows):
        return None
    return 100 * sum(row["rougeL_original"] >= 100 - 1e-9 for row in rows) / len(rows)
