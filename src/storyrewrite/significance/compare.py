r"""Test every system against the baseline, for every tested column (the overlap metrics in each
form, the coherence metrics: storyrewrite.metrics.columns), from per-instance scores.

Any two systems' score files (a run's `reports/scores/<system>.jsonl`, a collected folder's
`scores/<run>/<system>.jsonl.gz`), tested again, over instances and over stories:

    python -m storyrewrite.significance.compare reports/gpu/scores/RUN-A/finetuned.jsonl.gz \
        reports/gpu/scores/RUN-B/finetuned.jsonl.gz [--n-resamples 10000] [--seed 0]

In a collected folder each run holds its `finetuned` system; the NLL model's, the LLM modes' and
the copy baselines' scores are in the folder of the run that holds them, one per machine
(`ls reports/gpu/scores/*/nll.jsonl.gz`; a file named in another run's folder says where).

With the run's `significance.n_resamples` and `seed` (the collected folder's params/<run>.yaml),
the p-values against NLL are those of its significance.json. A column the two files' rows name
different models for (`scored_by`: another scorer, judge or precision) is not tested, and said so.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Hashable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from storyrewrite.io import InputError, find_file, read_jsonl
from storyrewrite.markdown import table
from storyrewrite.metrics.columns import available, source, value
from storyrewrite.params import MAX_SEED
from storyrewrite.significance.bootstrap import paired_bootstrap_many


# Two systems' scores of one instance are a tie where both rows name the same prediction
# (`prediction_digest`, storyrewrite.metrics.evaluate): every column is a function of the instance
# and the prediction. A model metric scores identical predictions apart when they sit in other
# batches (another system's batches, another batch size or device), far more with a bfloat16
# scorer than in float32 (bench/scorer_and_bootstrap.py: largest_bf16_layout_difference,
# largest_fp32_difference). Where two systems share most predictions (a model continued for a few
# steps), a resample that draws only shared ones would have that noise for its mean, of either
# sign, and the p-value would hang on the batch layout.
# Rows without a digest (score files written before it) fall back on TIE: values closer than it
# are one value, which covers float32 rounding only. Between the systems of the full-data
# comparison (reports/gpu), BARTScore's and CF-PMI's per-instance differences fall below 1e-5
# (rounding) or from 1e-4 up (different endings), with few between.
TIE = 1e-5


class Pair(NamedTuple):
    """A system's per-instance scores and those of the system it is tested against (H1: it scores higher)."""
    system: str
    rows: list[dict]
    baseline: str
    base_rows: list[dict]


def same_predictions(rows: list[dict], base_rows: list[dict]) -> np.ndarray:
    """Per row of `base_rows`, whether the row of `rows` with its id names the same prediction
    (both carry a `prediction_digest`, and it is the same)."""
    digests = {row["id"]: row.get("prediction_digest") for row in rows}
    return np.array([(digest := row.get("prediction_digest")) is not None and digests.get(row["id"]) == digest
                     for row in base_rows], dtype=bool)


def scored_apart(rows: list[dict], base_rows: list[dict]) -> dict[str, tuple[str, str]]:
    """{row field: (its model in `rows`, in `base_rows`)} for the model columns the two score
    files' rows name different models for (`scored_by`, storyrewrite.metrics.evaluate; the same in
    every row of a file, so the first rows are read). A file without it (written before it) names
    none: its columns are tested as they are."""
    first, second = rows[0].get("scored_by") or {}, base_rows[0].get("scored_by") or {}
    return {field: (first[field], second[field]) for field in sorted(first.keys() & second.keys()) if first[field] != second[field]}


def common_columns(rows: list[dict], base_rows: list[dict]) -> list[str]:
    """The tested columns both score files' rows hold, in table order."""
    return [c for c in available(base_rows[0]) if c in available(rows[0])]


def different_instances(test: Pair) -> str:
    """The error for a test whose two score files do not hold one row for each of the same instances."""
    ids, base_ids = [row["id"] for row in test.rows], [row["id"] for row in test.base_rows]
    repeated = [f"`{name}` repeats {len(rows) - len(set(rows))} id(s)" for name, rows in
                ((test.system, ids), (test.baseline, base_ids)) if len(rows) != len(set(rows))]
    return (f"scores of `{test.system}` and `{test.baseline}` cover different instances: {len(set(ids))} and "
            f"{len(set(base_ids))} instance ids, {len(set(ids) & set(base_ids))} in both"
            + "".join(f"; {line}" for line in repeated))


UNITS = ("instance", "story")  # what a bootstrap resamples: single instances, or whole stories (a story's endings share one input)


def compare_tests(tests: dict[Hashable, Pair], n_resamples: int, seed: int, units: tuple[str, ...] = UNITS) -> dict[str, dict]:
    """{unit: {key: {column: p-value}}} of each test (H1: its system scores higher than its
    baseline), resampling each of `units`, on the columns both score files have, less those their
    rows name different models for (scored_apart: another model's values are on another scale, and
    a difference between them says nothing of the systems); an instance whose
    rows name the same prediction is a tie in every column, and other differences below TIE are
    ties too. Tests whose baselines list the same instances in the same order share one
    bootstrap per unit: the resamples depend on the seed and the units alone (resample_means),
    so each test's p-values are those of a test of its own, with the draws, most of a test's
    time, made once for all. Each score file's columns are read once."""
    if unknown := [unit for unit in units if unit not in UNITS]:
        raise ValueError(f"compare_tests: unknown units {unknown}; valid: {', '.join(UNITS)}")
    read: dict[tuple[int, str], np.ndarray] = {}  # (id of a score file's rows, column) -> its values, in the file's order

    def values(rows: list[dict], column: str) -> np.ndarray:
        if (id(rows), column) not in read:
            read[id(rows), column] = np.array([value(row, column) for row in rows], dtype=np.float64)
        return read[id(rows), column]

    groups: dict[tuple, list] = {}  # the baseline's (instance ids, story ids) -> [(key, columns, system values, baseline values)]
    for key, test in tests.items():
        order = [row["id"] for row in test.base_rows]
        position = {row["id"]: i for i, row in enumerate(test.rows)}
        if len(position) != len(test.rows) or sorted(position) != sorted(order):
            raise InputError(different_instances(test))
        apart = scored_apart(test.rows, test.base_rows)
        tested = [c for c in common_columns(test.rows, test.base_rows) if source(c) not in apart]
        index = np.array([position[i] for i in order], dtype=np.int64)  # the system's rows in the baseline's order
        system = np.stack([values(test.rows, c)[index] for c in tested], axis=1) if tested else None
        base = np.stack([values(test.base_rows, c) for c in tested], axis=1) if tested else None
        if tested:
            same = same_predictions(test.rows, test.base_rows)
            system[same] = base[same]  # the same prediction: a difference of exactly 0
        groups.setdefault((tuple(order), tuple(row.get("story_id") for row in test.base_rows)), []).append((key, tested, system, base))
    found = {unit: {key: {} for key in tests} for unit in units}
    for (_, stories), members in groups.items():
        members = [member for member in members if member[1]]  # a test with no column in common has no p-value
        if not members:
            continue
        systems, bases = np.hstack([member[2] for member in members]), np.hstack([member[3] for member in members])
        for unit in units:
            p_values = iter(paired_bootstrap_many(systems, bases, n_resamples, seed, list(stories) if unit == "story" else None, tie=TIE))
            for key, tested, *_ in members:
                found[unit][key] = {column: round(float(next(p_values)), 4) for column in tested}
    return found


def p_text(p: float, n_resamples: int) -> str:
    """A bootstrap p-value to four decimals; one no resample reached (k/n = 0) as the bound it
    shows, 1/n rounded up: `< 0.0001` of 10,000 resamples, not a p of zero."""
    return f"< {math.ceil(1e4 / n_resamples) / 1e4:.4f}" if p == 0 else f"{p:.4f}"


def bound_note(cells: list[str], n_resamples: int) -> str:
    """Said under a table of p-values where a cell is such a bound (p_text)."""
    return (f" {p_text(0, n_resamples)}: not one of the {n_resamples:,} resamples went against H1 (the bootstrap's k/n is 0)."
            if any("< " in cell for cell in cells) else "")


def compare(scores: dict[str, list[dict]], baseline: str, n_resamples: int, seed: int, by_story: bool) -> dict:
    """{system: {column: p-value}} for every system but the baseline (H1: system > baseline), on
    the columns both systems' scores have; the same prediction is a tie (compare_tests)."""
    if baseline not in scores:
        raise InputError(f"params: `significance.baseline` = {baseline!r} has no scores; systems: {', '.join(sorted(scores))}",
                         key="significance.baseline")
    unit = "story" if by_story else "instance"
    tests = {system: Pair(system, rows, baseline, scores[baseline]) for system, rows in sorted(scores.items()) if system != baseline}
    return compare_tests(tests, n_resamples, seed, (unit,))[unit]


def compare_units(scores: dict[str, list[dict]], system: str, against: str, n_resamples: int, seed: int) -> dict[str, dict]:
    """{unit: {column: p}} of `system` against `against` (H1: it scores higher), resampling each of UNITS."""
    found = compare_tests({system: Pair(system, scores[system], against, scores[against])}, n_resamples, seed)
    return {unit: found[unit][system] for unit in UNITS}


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
    if not 0 <= args.seed <= MAX_SEED:  # the seeds params.yaml's `seed` takes
        raise InputError(f"--seed must be a whole number from 0 to {MAX_SEED}, got {args.seed}")
    scores = {}  # by the files' names, which errors quote
    for path in (args.system, args.against):
        if path.is_dir():
            # a run's reports/scores/ holds them, a collected folder's scores/<run>/ and the folder above
            found = sorted(str(f) for depth in ("", "*/", "*/*/") for suffix in (".jsonl", ".jsonl.gz")
                           for f in path.glob(f"{depth}*{suffix}"))
            raise InputError(f"{path}: a folder; name one system's score file" +
                             (f", e.g. {found[0]} ({len(found)} in it)" if found else " (.jsonl or .jsonl.gz): it holds none"))
        if not path.is_file():
            # A collected folder keeps the shared systems (nll, llm_*, copy_*) in one run's folder.
            elsewhere = sorted(str(other) for other in path.parent.parent.glob(f"*/{path.name}") if other.is_file())
            raise InputError(f"{path}: no such file" + (f"; {path.name} is in {', '.join(elsewhere)}" if elsewhere else ""))
        scores[str(path)] = [row for _, row in read_jsonl(path)]
        if not scores[str(path)]:
            raise InputError(f"{path}: no scores")
    system, against = scores[str(args.system)], scores[str(args.against)]
    p = compare_units(scores, str(args.system), str(args.against), args.n_resamples, args.seed)
    # How much of the comparison is ties by construction, where both files name their predictions.
    named = all("prediction_digest" in row for row in system + against)
    shared = (f"; the same prediction on {same_predictions(system, against).sum()} of "
              f"{len(against)} instances (ties)" if named else "")
    print(f"{args.system} against {args.against}: one-tailed paired bootstrap (H1: the first scores higher), "
          f"{args.n_resamples:,} resamples, seed {args.seed}{shared}")
    rows = [[c, p_text(p["instance"][c], args.n_resamples), p_text(p["story"][c], args.n_resamples)] for c in p["instance"]]
    print(table(["column", "p (instances)", "p (stories)"], rows))
    if note := bound_note([cell for row in rows for cell in row[1:]], args.n_resamples):
        print(note.strip())
    for field, models in scored_apart(system, against).items():  # columns on different models' scales
        columns = [c for c in common_columns(system, against) if source(c) == field]
        print(f"not tested: {', '.join(columns)}: scored by {models[0]} in the first file, by {models[1]} in the second")


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(main)
