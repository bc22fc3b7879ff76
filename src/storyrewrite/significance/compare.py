"""Test every system against the baseline, for every metric and form, from per-instance scores."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from storyrewrite.io import InputError, find_file, read_jsonl
from storyrewrite.metrics.counterfactual import FORMS, METRICS, instance_value
from storyrewrite.significance.bootstrap import paired_bootstrap_many


def columns(rows: list[dict]) -> list[tuple[str, str]]:
    """(metric, form) pairs these per-instance rows support."""
    has_original = all(f"{m}_original" in rows[0] for m in METRICS)
    return [(m, f) for f in FORMS for m in METRICS if f == "predictive" or has_original]


def compare(scores: dict[str, list[dict]], baseline: str, n_resamples: int, seed: int, by_story: bool) -> dict:
    """{system: {"<metric>/<form>": p-value}} for every system but the baseline (H1: system > baseline)."""
    if baseline not in scores:
        raise InputError(f"params: `significance.baseline` = {baseline!r} has no scores; systems: {', '.join(sorted(scores))}")
    base_rows = scores[baseline]
    order = [row["id"] for row in base_rows]
    pairs = columns(base_rows)
    base = np.array([[instance_value(row, m, f) for m, f in pairs] for row in base_rows])
    clusters = [row["story_id"] for row in base_rows] if by_story else None
    results = {}
    for system, rows in sorted(scores.items()):
        if system == baseline:
            continue
        by_id = {row["id"]: row for row in rows}
        if sorted(by_id) != sorted(order):
            raise InputError(f"scores of `{system}` and `{baseline}` cover different instances")
        values = np.array([[instance_value(by_id[i], m, f) for m, f in pairs] for i in order])
        p_values = paired_bootstrap_many(values, base, n_resamples=n_resamples, seed=seed, clusters=clusters)
        results[system] = {f"{m}/{f}": round(float(p), 4) for (m, f), p in zip(pairs, p_values)}
    return results


def read_scores(systems: list[str], directories: list[Path]) -> dict[str, list[dict]]:
    """system -> its per-instance score rows, for exactly the systems named."""
    return {system: [row for _, row in read_jsonl(find_file(system, directories, ".jsonl"))] for system in systems}
