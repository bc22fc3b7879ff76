"""Test every system against the baseline, for every tested column (the overlap metrics in each
form, the coherence metrics: storyrewrite.metrics.columns), from per-instance scores."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from storyrewrite.io import InputError, find_file, read_jsonl
from storyrewrite.metrics.columns import available, value
from storyrewrite.significance.bootstrap import paired_bootstrap_many


def compare(scores: dict[str, list[dict]], baseline: str, n_resamples: int, seed: int, by_story: bool) -> dict:
    """{system: {column: p-value}} for every system but the baseline (H1: system > baseline), on
    the columns both systems' scores have."""
    if baseline not in scores:
        raise InputError(f"params: `significance.baseline` = {baseline!r} has no scores; systems: {', '.join(sorted(scores))}")
    base_rows = scores[baseline]
    order = [row["id"] for row in base_rows]
    clusters = [row["story_id"] for row in base_rows] if by_story else None
    results = {}
    for system, rows in sorted(scores.items()):
        if system == baseline:
            continue
        by_id = {row["id"]: row for row in rows}
        if sorted(by_id) != sorted(order):
            raise InputError(f"scores of `{system}` and `{baseline}` cover different instances")
        tested = [c for c in available(base_rows[0]) if c in available(rows[0])]
        base = np.array([[value(row, c) for c in tested] for row in base_rows])
        values = np.array([[value(by_id[i], c) for c in tested] for i in order])
        p_values = paired_bootstrap_many(values, base, n_resamples=n_resamples, seed=seed, clusters=clusters)
        results[system] = {column: round(float(p), 4) for column, p in zip(tested, p_values, strict=True)}
    return results


def read_scores(systems: list[str], directories: list[Path]) -> dict[str, list[dict]]:
    """system -> its per-instance score rows, for exactly the systems named."""
    return {system: [row for _, row in read_jsonl(find_file(system, directories, ".jsonl"))] for system in systems}
