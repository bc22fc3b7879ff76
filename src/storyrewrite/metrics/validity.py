"""The values behind the metric-validity figures (storyrewrite.significance.validity): each
metric's score of the reference rewrite Y_EE and of the original ending copied unchanged (X_OE),
per test instance.

- Reference-free metrics (`cf_pmi`, `ents`) score the two endings as they are.
- Reference-based metrics (`drift`, and for contrast every overlap metric of
  storyrewrite.metrics.registry in its predictive form) would score Y_EE against itself. So both
  endings are scored against the story's *other* references instead (TimeTravel has three
  rewrites per test story), the best of them (the multi-reference form, each overlap metric's
  `best_of`: Qin et al.'s drift takes the best of a story's references, ROUGE-L the best, BLEU
  counts n-grams against all). Instances of a story with a single reference are left out of these.

Much of it the score stage has computed already for the two copy baselines (storyrewrite.systems:
the copy of Y_EE and the copy of X_OE): both endings' CF-PMI, and the copy of X_OE against every
reference of its story. Given those rows (`copy_scores`), they are read, not computed again.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from storyrewrite.io import InputError, read_jsonl
from storyrewrite.metrics import coherence
from storyrewrite.metrics.evaluate import COHERENCE_MODELS, timed
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.metrics.registry import OVERLAP_METRICS, Scoring

# The copy baselines (storyrewrite.systems.COPY_BASELINES) that score the two endings.
GOLD, COPY = "copy_reference", "copy_original"


def other_instances(instances: list[dict]) -> list[list[int]]:
    """Per instance, the indices of the other instances of its story."""
    by_story: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(instances):
        by_story[row["story_id"]].append(i)
    return [[j for j in by_story[row["story_id"]] if j != i] for i, row in enumerate(instances)]


def read_copy_scores(directory: Path, instances: list[dict]) -> dict[str, list[dict]]:
    """{GOLD, COPY: the score stage's per-instance rows of that copy baseline
    (`<directory>/<system>.jsonl`)}, checked to hold the instances, in their order."""
    scores = {}
    for system in (GOLD, COPY):
        path = directory / f"{system}.jsonl"
        if not path.is_file():
            raise InputError(f"{path}: no such file; the score stage writes it for the copy baselines (score_sanity)")
        rows = []
        for line, row in read_jsonl(path):
            if len(rows) == len(instances) or row.get("id") != instances[len(rows)]["id"]:
                expected = f"id {instances[len(rows)]['id']}" if len(rows) < len(instances) else "no more rows"
                raise InputError(f"{path}:{line}: holds id {row.get('id')!r} where the evaluated split has {expected}: "
                                 "scores of another split or data; run score_sanity again")
            rows.append(row)
        if len(rows) < len(instances):
            raise InputError(f"{path}: {len(rows)} rows for {len(instances)} instances; run score_sanity again")
        scores[system] = rows
    return scores


def gold_and_copy(instances: list[dict], evaluators, scorer: LMScorer | None = None, batch_size: int = 16,
                  seconds: dict[str, float] | None = None, copy_scores: dict[str, list[dict]] | None = None,
                  ) -> tuple[dict[str, tuple[list[float], list[float], list[str]]], dict[str, str]]:
    """({metric: (values of Y_EE, values of the copy of X_OE, story ids)}, {metric: why it was
    not measured}) for every metric the models given can compute (`evaluators`:
    storyrewrite.metrics.evaluate.Evaluators; `scorer` for the overlap metric that needs one,
    BARTScore). `seconds`, if given, receives the wall time of each metric computed
    (evaluate.timed). `copy_scores` (read_copy_scores), if given: the values its rows hold are
    taken from them, CF-PMI whole and, for each metric whose best of several references is the
    largest single value (`OverlapMetric.best_is_max`), the copy's side: the copy of X_OE scored
    against instance j's reference is the copy baseline's value at j. Where Y_EE is X_OE unchanged,
    the copy's value is Y_EE's: the same text (scored in other batches, or read from the copy
    baseline's rows, the two differ by rounding alone, which would settle the tie either way)."""
    gold, copy = [row["target"] for row in instances], [row["original_ending"] for row in instances]
    stories = [row["story_id"] for row in instances]
    pairs: dict[str, tuple[list[float], list[float], list[str]]] = {}

    def record(name: str, gold_values: list[float], copy_values: list[float], indices) -> None:
        copy_values = [g if gold[i] == copy[i] else c for i, g, c in zip(indices, gold_values, copy_values, strict=True)]
        pairs[name] = (list(gold_values), copy_values, [stories[i] for i in indices])

    def measure(name: str, score, rows: list[dict], endings: tuple[list[str], list[str]], indices) -> None:
        with timed(seconds, name):
            record(name, score(rows, endings[0]), score(rows, endings[1]), indices)

    def held(name: str, system: str) -> bool:
        return copy_scores is not None and all(name in row for row in copy_scores[system])

    if evaluators.judge is not None:
        if held("cf_pmi", GOLD) and held("cf_pmi", COPY):
            record("cf_pmi", [row["cf_pmi"] for row in copy_scores[GOLD]], [row["cf_pmi"] for row in copy_scores[COPY]],
                   range(len(instances)))
        else:
            measure("cf_pmi", lambda rows, ends: coherence.cf_pmi(evaluators.judge, rows, ends, batch_size), instances, (gold, copy),
                    range(len(instances)))
    if evaluators.nli is not None:
        measure("ents", lambda rows, ends: coherence.entailment(evaluators.nli, rows, ends, batch_size), instances, (gold, copy),
                range(len(instances)))
    others = other_instances(instances)
    kept = [i for i, js in enumerate(others) if js]
    rows, refs = [instances[i] for i in kept], [[gold[j] for j in others[i]] for i in kept]
    endings = ([gold[i] for i in kept], [copy[i] for i in kept])
    if kept and evaluators.encoder is not None:
        measure("drift", lambda rows, ends: coherence.drift_similarity(evaluators.encoder, rows, ends, refs), rows, endings, kept)
    scoring = Scoring(scorer, batch_size, bertscore=evaluators.bertscore)
    for metric in OVERLAP_METRICS.values():
        if not (kept and metric.computable(scoring)):
            continue
        if metric.best_is_max and held(metric.name, COPY):
            with timed(seconds, metric.name):
                gold_values = metric.best_values(endings[0], refs, scoring)
            record(metric.name, gold_values, [max(copy_scores[COPY][j][metric.name] for j in others[i]) for i in kept], kept)
        else:
            measure(metric.name, lambda rows, ends, metric=metric: metric.best_values(ends, refs, scoring), rows, endings, kept)
    loaded = {"judge": evaluators.judge, "embedder": evaluators.encoder, "nli": evaluators.nli}
    models = {**{field: (role, loaded[role]) for field, role in COHERENCE_MODELS.items()},
              **{metric.name: (metric.needs, getattr(scoring, metric.needs)) for metric in OVERLAP_METRICS.values() if metric.needs}}
    not_measured = {name: "no LM scorer was given" if role == "scorer" else f"`models.{role}` is null"
                    for name, (role, model) in models.items() if model is None}
    return pairs, not_measured
