"""Test every system against the baseline, for every tested column (the overlap metrics in each
form, the coherence metrics: storyrewrite.metrics.columns), from per-instance scores.

Any two systems' score files (a run's `reports/scores/<system>.jsonl`, a collected folder's
`scores/<run>/<system>.jsonl.gz`), tested again, over instances and over stories:

    python -m storyrewrite.significance.compare reports/gpu/scores/RUN/finetuned.jsonl.gz \
        reports/gpu/scores/RUN/nll.jsonl.gz [--n-resamples 10000] [--seed 0]

With the run's `significance.n_resamples` and `seed` (the collected folder's params/<run>.yaml),
the p-values against NLL are those of its significance.json.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from storyrewrite.io import InputError, find_file, read_jsonl
from storyrewrite.markdown import table
from storyrewrite.metrics.columns import available, value
from storyrewrite.significance.bootstrap import paired_bootstrap_many


# Per-instance scores closer than this are one value (a tie). A model metric scores identical
# predictions up to ~1e-5 apart when they sit in other batches (float32 rounding: another system's
# batches, another batch size or device). Where two systems share most predictions (a model
# continued for a few steps), a resample that draws only shared ones has that noise for its mean,
# of either sign, and the p-value would hang on the batch layout. Between the systems of the
# full-data comparison (reports/gpu), BARTScore's and CF-PMI's per-instance differences fall below
# 1e-5 (rounding) or from 1e-4 up (different endings), with few between.
TIE = 1e-5


def compare(scores: dict[str, list[dict]], baseline: str, n_resamples: int, seed: int, by_story: bool) -> dict:
    """{system: {column: p-value}} for every system but the baseline (H1: system > baseline), on
    the columns both systems' scores have; differences below TIE are ties."""
    if baseline not in scores:
        raise InputError(f"params: `significance.baseline` = {baseline!r} has no scores; systems: {', '.join(sorted(scores))}")
    base_rows = scores[baseline]
    order = [row["id"] for row in base_rows]
    clusters = [row["story_id"] for row in base_rows] if by_story else None
    systems, bases, columns = [], [], {}
    for system, rows in sorted(scores.items()):
        if system == baseline:
            continue
        by_id = {row["id"]: row for row in rows}
        if sorted(by_id) != sorted(order):
            raise InputError(f"scores of `{system}` and `{baseline}` cover different instances")
        tested = [c for c in available(base_rows[0]) if c in available(rows[0])]
        bases.append(np.array([[value(row, c) for c in tested] for row in base_rows], dtype=np.float64))
        systems.append(np.array([[value(by_id[i], c) for c in tested] for i in order], dtype=np.float64))
        columns[system] = tested
    if not columns:
        return {}
    # Every system in one bootstrap: the resamples depend on the seed and the units alone
    # (resample_means), so each system's p-values are those of a test of its own, with the draws,
    # most of the test's time, made once for all.
    p_values = iter(paired_bootstrap_many(np.hstack(systems), np.hstack(bases), n_resamples, seed, clusters, tie=TIE))
    return {system: {column: round(float(next(p_values)), 4) for column in tested} for system, tested in columns.items()}


UNITS = ("instance", "story")  # what a bootstrap resamples: single instances, or whole stories (a story's endings share one input)


def compare_units(scores: dict[str, list[dict]], system: str, against: str, n_resamples: int, seed: int) -> dict[str, dict]:
    """{unit: {column: p}} of `system` against `against` (H1: it scores higher), resampling each of UNITS."""
    return {unit: compare(scores, against, n_resamples, seed, by_story=unit == "story")[system] for unit in UNITS}


def read_scores(systems: list[str], directories: list[Path]) -> dict[str, list[dict]]:
    """system -> its per-instance score rows, for exactly the systems named."""
    return {system: [row for _, row in read_jsonl(find_file(system, directories, ".jsonl"))] for system in systems}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.significance.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("system", type=Path, help="per-instance scores (.jsonl or .jsonl.gz) of the system tested")
    parser.add_argument("against", type=Path, help="those of the system it is tested against (H1: `system` scores higher)")
    parser.add_argument("--n-resamples", type=int, default=10000, help="bootstrap resamples (default 10000, as the pipeline's)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0, the pipeline's `seed`)")
    args = parser.parse_args(argv)
    if args.n_resamples < 1:
        raise InputError(f"--n-resamples must be a whole number >= 1, got {args.n_resamples}")
    scores = {}
    for role in ("system", "against"):
        path = getattr(args, role)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        scores[role] = [row for _, row in read_jsonl(path)]
        if not scores[role]:
            raise InputError(f"{path}: no scores")
    p = compare_units(scores, "system", "against", args.n_resamples, args.seed)
    print(f"{args.system} against {args.against}: one-tailed paired bootstrap (H1: the first scores higher), "
          f"{args.n_resamples} resamples, seed {args.seed}")
    print(table(["column", "p (instances)", "p (stories)"], [[c, f"{p['instance'][c]:.4f}", f"{p['story'][c]:.4f}"] for c in p["instance"]]))


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(main)
