"""Collect several DVC experiments into one table.

    dvc exp run --queue -S objective=score ; dvc exp run --queue -S objective=delta ; dvc queue start
    python -m storyrewrite.report.collect --out reports/experiments.md

One row per experiment (and the commits they are based on): the params in which the experiments
differ, then the `finetuned` system's metrics (its objective is a column) with significance marks
against that experiment's own NLL baseline, and that baseline's metrics for reference.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from storyrewrite.io import InputError, write_text_atomic
from storyrewrite.metrics.evaluate import METRICS
from storyrewrite.report.tables import METRIC_LABELS
from storyrewrite.significance.compare import FORMS

SYSTEM_METRICS = "reports/metrics/{}.json"
SIGNIFICANCE = "reports/significance.json"


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def experiments(exp_show: list[dict]) -> list[dict]:
    """[{name, params (flat), metrics: {path: data}}] from `dvc exp show --json` output."""
    found = []

    def add(name: str, data: dict) -> None:
        params = _flatten(data.get("params", {}).get("params.yaml", {}).get("data", {}))
        metrics = {path: entry.get("data", {}) for path, entry in (data.get("metrics") or {}).items()}
        found.append({"name": name, "params": params, "metrics": metrics})

    for commit in exp_show:
        if commit.get("data"):
            rev = commit["rev"]
            add(commit.get("name") or (rev if rev == "workspace" else rev[:7]), commit["data"])
        for experiment in commit.get("experiments") or []:
            for rev in experiment.get("revs", []):
                if rev.get("data"):
                    add(rev.get("name") or experiment.get("name") or rev["rev"][:7], rev["data"])
    return found


def table(rows: list[dict], system: str = "finetuned", baseline: str = "nll", alpha: float = 0.05) -> str:
    if not rows:
        raise InputError("no experiments found (run `dvc exp run` first)")
    varying = sorted(k for k in set().union(*(r["params"] for r in rows))
                     if len({json.dumps(r["params"].get(k)) for r in rows}) > 1 and k != "objective")
    header = ["Experiment", "objective", *varying] + [f"{METRIC_LABELS[m]} ({'M' if f == 'predictive' else 'M + Δ_M'})"
                                                      for f in FORMS for m in METRICS] + [f"{baseline} BARTScore (M)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        metrics = row["metrics"].get(SYSTEM_METRICS.format(system), {})
        p_values = row["metrics"].get(SIGNIFICANCE, {}).get(system, {})
        cells = [row["name"], str(row["params"].get("objective", ""))] + [str(row["params"].get(k, "")) for k in varying]
        for form in FORMS:
            for metric in METRICS:
                v = metrics.get(metric, {}).get(form)
                p = p_values.get(f"{metric}/{form}")
                cells.append("n/a" if v is None else f"{v:.{3 if metric == 'bartscore' else 1}f}" + ("\\*" if p is not None and p < alpha else ""))
        base = row["metrics"].get(SYSTEM_METRICS.format(baseline), {}).get("bartscore", {}).get("predictive")
        cells.append("n/a" if base is None else f"{base:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\\* p < {alpha}, one-tailed paired bootstrap of `{system}` against its own `{baseline}` baseline. "
            "Rows without metrics have not been run to the score stage.")
    return "\n".join(lines) + "\n\n" + note + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.report.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="saved `dvc exp show --json` output (default: run it)")
    parser.add_argument("--out", type=Path, default=Path("reports/experiments.md"))
    args = parser.parse_args(argv)
    if args.json:
        exp_show = json.loads(args.json.read_text())
    else:
        exp_show = json.loads(subprocess.run(["dvc", "exp", "show", "--json"], capture_output=True, text=True, check=True).stdout)
    text = "# Experiments\n\n" + table(experiments(exp_show))
    write_text_atomic(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
