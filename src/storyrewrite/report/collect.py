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

from storyrewrite.io import InputError, read_json, write_text_atomic
from storyrewrite.report.tables import COLUMNS, column_label, plain_cells

SYSTEM_METRICS = "reports/metrics/{}.json"
SIGNIFICANCE = "reports/significance.json"
SUMMARY = "reports/train/{}/summary.json"


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
    header = ["Experiment", "objective", *varying] + [column_label(m, f) for m, f in COLUMNS] + [f"{baseline} BARTScore (M)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        metrics = row["metrics"].get(SYSTEM_METRICS.format(system), {})
        p_values = row["metrics"].get(SIGNIFICANCE, {}).get(system, {})
        cells = [row["name"], str(row["params"].get("objective", ""))] + [str(row["params"].get(k, "")) for k in varying]
        cells += plain_cells(metrics, p_values, alpha)
        base = row["metrics"].get(SYSTEM_METRICS.format(baseline), {}).get("bartscore", {}).get("predictive")
        cells.append("n/a" if base is None else f"{base:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\\* p < {alpha}, one-tailed paired bootstrap of `{system}` against its own `{baseline}` baseline. "
            "Rows without metrics have not been run to the score stage.")
    return "\n".join(lines) + "\n\n" + note + "\n"


def best_per_objective(rows: list[dict], system: str = "finetuned") -> list[dict]:
    """For each objective, the run with the lowest validation NLL at its best checkpoint (the
    model-selection rule for the CPO grid); runs without scores, and the workspace, are left out."""
    best: dict[str, dict] = {}
    for row in rows:
        if row["name"] == "workspace":  # uncommitted state: the commits and experiments stand for it
            continue
        summary = row["metrics"].get(SUMMARY.format(system), {})
        if SYSTEM_METRICS.format(system) not in row["metrics"] or summary.get("best_val_nll") is None:
            continue
        objective = row["params"].get("objective")
        if objective not in best or summary["best_val_nll"] < best[objective]["_val_nll"]:
            best[objective] = {**row, "_val_nll": summary["best_val_nll"]}
    return list(best.values())


def objectives_table(rows: list[dict], baseline: str = "nll", alpha: float = 0.05) -> str:
    """NLL, then the best run of each objective, with significance against NLL. Labels are the
    ones the runs wrote (from the objective registry) into their training summaries."""
    scored = [r for r in rows if SUMMARY.format("finetuned") in r["metrics"]]
    chosen = best_per_objective(rows)
    if not chosen:
        raise InputError("no scored experiments found (run `dvc exp run -S objective=...` first)")
    header = ["System", "selected by val NLL", *(column_label(m, f) for m, f in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = chosen[0]["metrics"][SYSTEM_METRICS.format(baseline)]
    base_label = chosen[0]["metrics"].get(SUMMARY.format(baseline), {}).get("label", baseline)
    lines.append("| " + " | ".join([base_label, "-", *plain_cells(base, {}, alpha)]) + " |")

    def settings(row: dict) -> dict:
        return row["metrics"][SUMMARY.format("finetuned")].get("settings") or {}

    def label(row: dict) -> str:
        objective = row["params"].get("objective")
        text = row["metrics"][SUMMARY.format("finetuned")].get("label", objective)
        if objective == baseline:
            return f"{text}, continued"
        # The objective's settings that differ between its runs (the CPO grid's beta and lambda).
        runs = [settings(r) for r in scored if r["params"].get("objective") == objective]
        varying = [k for k in settings(row) if len({json.dumps(r.get(k)) for r in runs}) > 1]
        return f"{text} ({', '.join(f'{k}={settings(row)[k]}' for k in varying)})" if varying else text

    # The baseline objective continued (the equal-budget control) first, then by label.
    for row in sorted(chosen, key=lambda r: (r["params"].get("objective") != baseline, label(r))):
        p_values = row["metrics"].get(SIGNIFICANCE, {}).get("finetuned", {})
        lines.append("| " + " | ".join([label(row), f"{row['name']}: {row['_val_nll']:.4f}",
                                        *plain_cells(row["metrics"][SYSTEM_METRICS.format("finetuned")], p_values, alpha)]) + " |")
    note = (f"Each objective fine-tunes the same NLL model; of several runs of an objective (the CPO grid) the one "
            f"with the lowest validation NLL at its best checkpoint is shown. \\* p < {alpha}, one-tailed paired "
            f"bootstrap against NLL.")
    return "\n".join(lines) + "\n\n" + note + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.report.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="saved `dvc exp show --json` output (default: run it)")
    parser.add_argument("--rev", help="the experiments derived from this commit (default: HEAD)")
    parser.add_argument("--out", type=Path, default=Path("reports/experiments.md"))
    parser.add_argument("--objectives", action="store_true",
                        help="one row per objective (its best run by validation NLL) instead of one per experiment")
    args = parser.parse_args(argv)
    if args.json:
        exp_show = read_json(args.json)
    else:
        command = ["dvc", "exp", "show", "--json"] + (["--rev", args.rev] if args.rev else [])
        exp_show = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    rows = experiments(exp_show)
    text = ("# Objectives\n\n" + objectives_table(rows)) if args.objectives else ("# Experiments\n\n" + table(rows))
    write_text_atomic(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
