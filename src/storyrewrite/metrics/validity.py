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
"""
from __future__ import annotations

from collections import defaultdict

from storyrewrite.metrics import coherence
from storyrewrite.metrics.evaluate import timed
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.metrics.registry import OVERLAP_METRICS, Scoring


def other_references(instances: list[dict]) -> list[list[str]]:
    """Per instance, the references of the other instances of its story."""
    by_story: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(instances):
        by_story[row["story_id"]].append(i)
    return [[instances[j]["target"] for j in by_story[row["story_id"]] if j != i] for i, row in enumerate(instances)]


def gold_and_copy(instances: list[dict], evaluators, scorer: LMScorer | None = None, batch_size: int = 16,
                  seconds: dict[str, float] | None = None) -> tuple[dict[str, tuple[list[float], list[float], list[str]]], dict[str, str]]:
    """({metric: (values of Y_EE, values of the copy of X_OE, story ids)}, {metric: why it was
    not measured}) for every metric the models given can compute (`evaluators`:
    storyrewrite.metrics.evaluate.Evaluators; `scorer` for the overlap metric that needs one,
    BARTScore). `seconds`, if given, receives each metric's wall time (evaluate.timed)."""
    gold, copy = [row["target"] for row in instances], [row["original_ending"] for row in instances]
    pairs: dict[str, tuple[list[float], list[float], list[str]]] = {}

    def measure(name: str, score, rows: list[dict], endings: tuple[list[str], list[str]]) -> None:
        with timed(seconds, name):
            pairs[name] = (score(rows, endings[0]), score(rows, endings[1]), [row["story_id"] for row in rows])

    if evaluators.judge is not None:
        measure("cf_pmi", lambda rows, ends: coherence.cf_pmi(evaluators.judge, rows, ends, batch_size), instances, (gold, copy))
    if evaluators.nli is not None:
        measure("ents", lambda rows, ends: coherence.entailment(evaluators.nli, rows, ends, batch_size), instances, (gold, copy))
    others = other_references(instances)
    kept = [i for i, refs in enumerate(others) if refs]
    rows, refs = [instances[i] for i in kept], [others[i] for i in kept]
    endings = ([gold[i] for i in kept], [copy[i] for i in kept])
    if kept and evaluators.encoder is not None:
        measure("drift", lambda rows, ends: coherence.drift_similarity(evaluators.encoder, rows, ends, refs), rows, endings)
    scoring = Scoring(scorer, batch_size, bertscore=evaluators.bertscore)
    for metric in OVERLAP_METRICS.values():
        if kept and metric.computable(scoring):
            measure(metric.name, lambda rows, ends, metric=metric: metric.best_values(ends, refs, scoring), rows, endings)
    models = {"cf_pmi": ("judge", evaluators.judge), "drift": ("embedder", evaluators.encoder), "ents": ("nli", evaluators.nli),
              **{metric.name: (metric.needs, getattr(scoring, metric.needs)) for metric in OVERLAP_METRICS.values() if metric.needs}}
    not_measured = {name: "no LM scorer was given" if role == "scorer" else f"`models.{role}` is null"
                    for name, (role, model) in models.items() if model is None}
    return pairs, not_measured
