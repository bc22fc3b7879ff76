"""The results table: rows = systems, columns = BARTScore, ROUGE-L, SacreBLEU, each predictive
M(Ŷ, Y_EE) and counterfactual M(Ŷ, Y_EE) + Δ_M; significance marks against the baseline; the
best value of each column (among the real systems, not the copy baselines) in bold."""
from __future__ import annotations

from dataclasses import dataclass

from storyrewrite.metrics.evaluate import METRICS
from storyrewrite.significance.compare import FORMS

METRIC_LABELS = {"bartscore": "BARTScore", "rougeL": "ROUGE-L", "sacrebleu": "SacreBLEU"}
FORM_LABELS = {"predictive": "M", "counterfactual": "M + Δ_M"}
SANITY_LABELS = {"copy_reference": "Copy of the reference (upper bound)", "copy_original": "Copy of the original ending"}


@dataclass
class Row:
    system: str
    label: str
    metrics: dict  # the metrics JSON of the system
    p_values: dict  # "<metric>/<form>" -> p, empty for the baseline
    sanity: bool = False


def value(row: Row, metric: str, form: str) -> float | None:
    return row.metrics.get(metric, {}).get(form)


def best_values(rows: list[Row]) -> dict[tuple[str, str], float]:
    best = {}
    for metric in METRICS:
        for form in FORMS:
            values = [v for r in rows if not r.sanity and (v := value(r, metric, form)) is not None]
            if values:
                best[(metric, form)] = max(values)  # every metric here is higher-is-better
    return best


def _cell(row: Row, metric: str, form: str, best: dict, alpha: float, latex: bool) -> str:
    v = value(row, metric, form)
    if v is None:
        return "n/a"
    digits = 3 if metric == "bartscore" else 1
    text = f"{v:.{digits}f}"
    p = row.p_values.get(f"{metric}/{form}")
    mark = p is not None and p < alpha
    if latex:
        text = f"\\textbf{{{text}}}" if not row.sanity and v == best.get((metric, form)) else text
        return text + ("$^{*}$" if mark else "")
    text = f"**{text}**" if not row.sanity and v == best.get((metric, form)) else text
    return text + ("\\*" if mark else "")


def markdown_table(rows: list[Row], alpha: float) -> str:
    best = best_values(rows)
    header = ["System"] + [f"{METRIC_LABELS[m]} ({FORM_LABELS[f]})" for f in FORMS for m in METRICS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.label] + [_cell(row, m, f, best, alpha, latex=False) for f in FORMS for m in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latex_table(rows: list[Row], alpha: float, caption: str) -> str:
    best = best_values(rows)
    n = len(METRICS)
    lines = [
        "\\begin{table}[t]", "\\centering", "\\small",
        "\\begin{tabular}{l" + "r" * (2 * n) + "}", "\\toprule",
        " & \\multicolumn{%d}{c}{Predictive $M(\\hat{Y}, Y_{EE})$} & \\multicolumn{%d}{c}{Counterfactual $M + \\Delta_M$} \\\\" % (n, n),
        "System & " + " & ".join(METRIC_LABELS[m] for _ in FORMS for m in METRICS) + " \\\\", "\\midrule",
    ]
    for row in rows:
        label = row.label.replace("&", "\\&").replace("_", "\\_")
        lines.append(label + " & " + " & ".join(_cell(row, m, f, best, alpha, latex=True) for f in FORMS for m in METRICS) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{caption}}}", "\\end{table}"]
    return "\n".join(lines)
