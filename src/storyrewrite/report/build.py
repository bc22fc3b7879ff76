"""Assemble reports/results.md (and the LaTeX table) from what the pipeline wrote."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from storyrewrite.io import InputError, read_jsonl
from storyrewrite.params import positive
from storyrewrite.report.examples import example_block
from storyrewrite.report.tables import SANITY_LABELS, Row, latex_table, markdown_table

OBJECTIVE_LABELS = {"nll": "NLL", "cpo": "CPO", "score": "DTO-Score", "delta": "DTO-Delta", "score_delta": "DTO-Score+Delta"}


@dataclass(frozen=True)
class ReportConfig:
    """`report` section of params.yaml."""

    examples: int  # qualitative examples shown

    def check(self, where: str) -> None:
        positive(where, examples=self.examples)


MODE_LABELS = {"zero_shot": "zero-shot", "one_shot_random": "one-shot, random example",
               "one_shot_fixed": "one-shot, fixed example", "rag": "RAG (nearest training example)"}


def system_label(system: str, train_logs: Path, llm_usage: Path) -> str:
    if system in SANITY_LABELS:
        return SANITY_LABELS[system]
    usage = llm_usage / f"{system.removeprefix('llm_')}.json"
    if system.startswith("llm_") and usage.exists():
        info = json.loads(usage.read_text())
        return f"{info['model']} {MODE_LABELS.get(info['mode'], info['mode'])} ({info['backend']})"
    summary = train_logs / system / "summary.json"
    if summary.exists():
        info = json.loads(summary.read_text())
        label = OBJECTIVE_LABELS.get(info["objective"], info["objective"])
        if system == "nll":
            return label
        return f"{label}, continued (+{info['global_step']} steps)" if info["objective"] == "nll" \
            else f"{label} (from NLL, +{info['global_step']} steps)"
    return system


def _read_json_dir(directories: list[Path]) -> dict[str, dict]:
    found = {}
    for directory in directories:
        for path in sorted(directory.glob("*.json")):
            found[path.stem] = json.loads(path.read_text())
    return found


def build_report(metrics_dirs: list[Path], significance_path: Path, prediction_dirs: list[Path], instances: list[dict],
                 train_logs: Path, llm_usage: Path, config: ReportConfig, seed: int, task: str, baseline: str, alpha: float) -> tuple[str, str]:
    """(results.md, results.tex)."""
    metrics = _read_json_dir(metrics_dirs)
    if baseline not in metrics:
        raise InputError(f"no metrics for the baseline `{baseline}` in {', '.join(map(str, metrics_dirs))}")
    significance = json.loads(significance_path.read_text())
    order = [baseline] + sorted(s for s in metrics if s != baseline and s not in SANITY_LABELS) + [s for s in SANITY_LABELS if s in metrics]
    labels = {s: system_label(s, train_logs, llm_usage) for s in order}
    rows = [Row(s, labels[s], metrics[s], significance.get(s, {}), sanity=s in SANITY_LABELS) for s in order]

    n = metrics[baseline]["instances"]
    unit = significance.get("_unit", "instance")
    notes = [
        f"Task `{task}`, {n} test instances. M(Ŷ, Y_EE) scores the prediction against the edited ending; "
        "M + Δ_M = 2·M(Ŷ, Y_EE) − M(Ŷ, X_OE) rewards moving away from the original ending as well.",
        f"\\* one-tailed paired bootstrap against {labels[baseline]} ({significance.get('_n_resamples')} resamples "
        f"over {unit}s), p < {alpha}. **Bold**: best value of the column among the systems (copy baselines excluded).",
    ]
    if metrics[baseline].get("counterfactual_metrics") != "available":
        notes.append("Counterfactual columns: n/a, the task has no original ending.")

    predictions = {}
    for system in order:
        path = next((d / f"{system}.jsonl" for d in prediction_dirs if (d / f"{system}.jsonl").exists()), None)
        if path is not None:
            predictions[system] = {row["id"]: row["prediction"] for _, row in read_jsonl(path)}
    # One instance from each of a few stories drawn with the seed (a story's endings share its input).
    first_of_story = list({row["story_id"]: row for row in reversed(instances)}.values())[::-1]
    shown = random.Random(seed).sample(first_of_story, min(config.examples, len(first_of_story)))
    examples = [example_block(inst, {s: p[inst["id"]] for s, p in predictions.items() if s not in SANITY_LABELS}, labels)
                for inst in shown]

    markdown = "\n\n".join([
        "# Results", markdown_table(rows, alpha), *notes,
        "Training curves: `dvc plots show` (reports/train/*/train_loss.csv, val_loss.csv).",
        "## Examples", *examples,
    ]) + "\n"
    latex = latex_table(rows, alpha, caption=f"Results on {task} ({n} test instances). "
                        f"$^{{*}}$: one-tailed paired bootstrap against {labels[baseline]}, $p < {alpha}$.") + "\n"
    return markdown, latex
