"""The results tables: rows = systems; columns = the overlap metrics (BARTScore, ROUGE-L,
SacreBLEU, each predictive M(Ŷ, Y_EE) and counterfactual M(Ŷ, Y_EE) + Δ_M) in one table, the
coherence metrics (CF-PMI, follows X_CE, drift, EntScore, HMean) in the other; significance
marks against the baseline; the best value of each column (among the real systems, not the copy
baselines) in bold. Columns are keys of storyrewrite.metrics.columns."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from storyrewrite.markdown import table
from storyrewrite.metrics.columns import COHERENCE_TABLE, OVERLAP
from storyrewrite.metrics.registry import OVERLAP_METRICS

METRIC_LABELS = {name: metric.label for name, metric in OVERLAP_METRICS.items()}
FORM_LABELS = {"predictive": "M", "counterfactual": "M + Δ_M"}
FORM_HEADERS = {"predictive": "Predictive $M(\\hat{Y}, Y_{EE})$", "counterfactual": "Counterfactual $M + \\Delta_M$"}
COHERENCE_LABELS = {"cf_pmi": "CF-PMI", "cf_follow": "follows X_CE (%)", "drift": "drift", "ents": "EntScore",
                    "hmean": "HMean"}
COLUMNS = list(OVERLAP)  # every registered overlap column; a table shows those its systems have (overlap_columns)


def column_label(column: str) -> str:
    if "/" in column:
        metric, form = column.split("/")
        return f"{METRIC_LABELS[metric]} ({FORM_LABELS[form]})"
    return COHERENCE_LABELS[column]


def metric_value(metrics: dict, column: str) -> float | None:
    """A system's corpus value in `column`, from its metrics JSON (None where not computed)."""
    if "/" in column:
        metric, form = column.split("/")
        return (metrics.get(metric) or {}).get(form)
    return metrics.get(column)


def number(column: str, v: float) -> str:
    if column == "cf_follow":
        return f"{100 * v:.1f}"
    if "/" in column:
        return f"{v:.{OVERLAP_METRICS[column.split('/')[0]].decimals}f}"
    return f"{v:.3f}" if column in ("cf_pmi", "drift", "ents", "hmean") else f"{v:.1f}"


def significant(p_values: dict, column: str, alpha: float) -> bool:
    p = p_values.get(column)
    return p is not None and p < alpha


def plain_cells(metrics: dict, p_values: dict, alpha: float, columns: list[str] = COLUMNS) -> list[str]:
    """Markdown cells of one system's metrics JSON in table order, significance marked."""
    return [_cell(Row("", "", metrics, p_values), c, {}, alpha, latex=False) for c in columns]


@dataclass
class Row:
    system: str
    label: str
    metrics: dict  # the metrics JSON of the system
    p_values: dict  # column -> p, empty for the baseline
    sanity: bool = False
    story_p_values: dict = field(default_factory=dict)  # the same, resampling whole stories (marked †)


def overlap_columns(rows: list[Row]) -> list[str]:
    """The overlap columns of the metrics any system of the table has (a metric computed only
    where its model is named, BERTScore, has none while it is not), in the forms any system has
    (a task without an original ending, ART, has no counterfactual form)."""
    present = [c for c in COLUMNS if any(metric_value(r.metrics, c) is not None for r in rows)]
    computed = {c.split("/")[0] for c in present if c.endswith("/predictive")}
    forms = {c.split("/")[1] for c in present}
    return [c for c in COLUMNS if c.split("/")[0] in computed and c.split("/")[1] in forms]


def coherence_columns(rows: list[Row]) -> list[str]:
    """The coherence columns any system of the table has (none for a task without X_CE)."""
    return [c for c in COHERENCE_TABLE if any(metric_value(r.metrics, c) is not None for r in rows)]


def best_values(rows: list[Row], columns: list[str]) -> dict[str, float]:
    best = {}
    for column in columns:
        values = [v for r in rows if not r.sanity and (v := metric_value(r.metrics, column)) is not None]
        if values:
            best[column] = max(values)  # every column here is higher-is-better
    return best


def _cell(row: Row, column: str, best: dict, alpha: float, latex: bool) -> str:
    v = metric_value(row.metrics, column)
    if v is None:
        return "n/a"
    text = number(column, v)
    mark = significant(row.p_values, column, alpha)
    story = significant(row.story_p_values, column, alpha)
    bold = not row.sanity and v == best.get(column)
    if latex:
        text = f"\\textbf{{{text}}}" if bold else text
        return text + ("$^{*}$" if mark else "") + ("$^{\\dagger}$" if story else "")
    text = f"**{text}**" if bold else text
    return text + ("\\*" if mark else "") + ("†" if story else "")


def markdown_table(rows: list[Row], alpha: float, columns: list[str] | None = None) -> str:
    """The overlap table (columns None: overlap_columns) or any other columns."""
    columns = overlap_columns(rows) if columns is None else columns
    best = best_values(rows, columns)
    return table(["System"] + [column_label(c) for c in columns],
                 [[row.label] + [_cell(row, c, best, alpha, latex=False) for c in columns] for row in rows])


# LaTeX's special characters as text. pandas' Styler escapes a table's labels (latex_table), but
# not its caption, and keeps its own escape function private: the caption's names go through this.
LATEX_TEXT = {"&": "\\&", "%": "\\%", "$": "\\$", "#": "\\#", "_": "\\_", "{": "\\{", "}": "\\}",
              "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "\\": "\\textbackslash{}"}


def latex_text(text: str) -> str:
    """`text` as LaTeX prints it: each special character escaped."""
    return re.sub(r"[&%$#_{}~^\\]", lambda match: LATEX_TEXT[match.group()], text)


def latex_table(rows: list[Row], alpha: float, caption: str, columns: list[str] | None = None) -> str:
    """The overlap table (columns None: overlap_columns, in predictive and counterfactual groups
    where there are both) or any other columns, through pandas' Styler (booktabs rules)."""
    grouped = columns is None
    columns = overlap_columns(rows) if columns is None else columns
    best = best_values(rows, columns)
    if grouped and any(c.endswith("/counterfactual") for c in columns):  # both forms: a group each
        header = pd.MultiIndex.from_tuples([(FORM_HEADERS[c.split("/")[1]], METRIC_LABELS[c.split("/")[0]]) for c in columns],
                                           names=["", "System"])
    else:
        header = pd.Index([column_label(c) for c in columns], name="System")
    cells = pd.DataFrame([[_cell(row, c, best, alpha, latex=True) for c in columns] for row in rows], columns=header,
                         index=[row.label for row in rows])
    # pandas escapes the labels: a system's (a model's spec can hold `_`, `~`, `#`, ...) in full, the
    # headers outside their math ($M(\hat{Y}, Y_{EE})$ stays as written).
    styler = cells.style.format_index(escape="latex", axis=0).format_index(escape="latex-math", axis=1)
    return styler.set_table_styles([{"selector": "small", "props": ":;"}]).to_latex(  # (`\\small` under the caption)
        column_format="l" + "r" * len(columns), position="t", position_float="centering", hrules=True, caption=caption,
        multicol_align="c").rstrip("\n")
