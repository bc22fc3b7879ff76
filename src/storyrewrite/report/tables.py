"""The results table: rows = systems, columns = BARTScore, ROUGE-L, SacreBLEU, each predictive
M(Ŷ, Y_EE) and counterfactual M(Ŷ, Y_EE) + Δ_M; significance marks against the baseline; the
best value of each column (among the real systems, not the copy baselines) in bold."""
from __future__ import annotations

from dataclasses import dataclass, field

from storyrewrite.metrics.counterfactual import FORMS, METRICS

METRIC_LABELS = {"bartscore": "BARTScore", "rougeL": "ROUGE-L", "sacrebleu": "SacreBLEU"}
FORM_LABELS = {"predictive": "M", "counterfactual": "M + Δ_M"}


COLUMNS = [(metric, form) for form in FORMS for metric in METRICS]


def column_label(metric: str, form: str) -> str:
    return f"{METRIC_LABELS[metric]} ({FORM_LABELS[form]})"


def number(metric: str, v: float) -> str:
    return f"{v:.{3 if metric == 'bartscore' else 1}f}"


def significant(p_values: dict, metric: str, form: str, alpha: float) -> bool:
    p = p_values.get(f"{metric}/{form}")
    return p is not None and p < alpha


def plain_cells(metrics: dict, p_values: dict, alpha: float) -> list[str]:
    """Markdown cells of one system's metrics JSON in table order, significance marked."""
    return ["n/a" if (v := metrics.get(m, {}).get(f)) is None else number(m, v) + ("\\*" if significant(p_values, m, f, alpha) else "")
            for m, f in COLUMNS]


@dataclass
class Row:
    system: str
    label: str
    metrics: dict  # the metrics JSON of the system
    p_values: dict  # "<metric>/<form>" -> p, empty for the baseline
    sanity: bool = False
    story_p_values: dict = field(default_factory=dict)  # the same, resampling whole stories (marked †)


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
    text = number(metric, v)
    mark = significant(row.p_values, metric, form, alpha)
    story = significant(row.story_p_values, metric, form, alpha)
    if latex:
        text = f"\\textbf{{{text}}}" if not row.sanity and v == best.get((metric, form)) else text
        return text + ("$^{*}$" if mark else "") + ("$^{\\dagger}$" if story else "")
    text = f"**{text}**" if not row.sanity and v == best.get((metric, form)) else text
    return text + ("\\*" if mark else "") + ("†" if story else "")


def markdown_table(rows: list[Row], alpha: float) -> str:
    best = best_values(rows)
    header = ["System"] + [column_label(m, f) for m, f in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.label] + [_cell(row, m, f, best, alpha, latex=False) for m, f in COLUMNS]
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
        lines.append(label + " & " + " & ".join(_cell(row, m, f, best, alpha, latex=True) for m, f in COLUMNS) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{caption}}}", "\\end{table}"]
    return "\n".join(lines)
