"""The values behind the metric-validity figures (storyrewrite.significance.validity): each
metric's score of the reference rewrite Y_EE and of the original ending copied unchanged (X_OE),
per test instance.

- Reference-free metrics (`cf_pmi`, `ents`) score the two endings as they are.
- Reference-based metrics (`drift`, and for contrast the overlap metrics `bartscore`, `rougeL`,
  `sacrebleu` in their predictive form) would score Y_EE against itself. So both endings are
  scored against the story's *other* references instead (TimeTravel has three rewrites per test
  story), the best of them (the multi-reference form: Qin et al.'s drift takes the best of a
  story's references, ROUGE-L the best, BLEU counts n-grams against all). Instances of a story
  with a single reference are left out of these.
"""
from __future__ import annotations

import time
from collections import defaultdict

from storyrewrite.metrics import coherence, lexical
from storyrewrite.metrics.lm_scorer import LMScorer


def other_references(instances: list[dict]) -> list[list[str]]:
    """Per instance, the references of the other instances of its story."""
    by_story: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(instances):
        by_story[row["story_id"]].append(i)
    return [[instances[j]["target"] for j in by_story[row["story_id"]] if j != i] for i, row in enumerate(instances)]


def _best_bartscore(scorer: LMScorer, endings: list[str], references: list[list[str]], batch_size: int) -> list[float]:
    sources = [ending for ending, refs in zip(endings, references) for _ in refs]
    values = iter(scorer.score(sources, [ref for refs in references for ref in refs], batch_size))
    return [max(next(values) for _ in refs) for refs in references]


def gold_and_copy(instances: list[dict], evaluators, scorer: LMScorer | None = None, batch_size: int = 16,
                  seconds: dict[str, float] | None = None) -> tuple[dict[str, tuple[list[float], list[float], list[str]]], dict[str, str]]:
    """({metric: (values of Y_EE, values of the copy of X_OE, story ids)}, {metric: why it was
    not measured}) for every metric the models given can compute (`evaluators`:
    storyrewrite.metrics.evaluate.Evaluators; `scorer` for BARTScore). `seconds`, if given,
    receives each metric's wall time."""
    seconds = {} if seconds is None else seconds
    gold, copy = [row["target"] for row in instances], [row["original_ending"] for row in instances]
    pairs: dict[str, tuple[list[float], list[float], list[str]]] = {}

    def measure(name: str, score, rows: list[dict], endings: tuple[list[str], list[str]]) -> None:
        started = time.perf_counter()
        pairs[name] = (score(rows, endings[0]), score(rows, endings[1]), [row["story_id"] for row in rows])
        seconds[name] = time.perf_counter() - started

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
    if kept and scorer is not None:
        measure("bartscore", lambda rows, ends: _best_bartscore(scorer, ends, refs, batch_size), rows, endings)
    if kept:
        measure("rougeL", lambda rows, ends: lexical.best_rouge_l(ends, refs), rows, endings)
        measure("sacrebleu", lambda rows, ends: lexical.multi_reference_bleu(ends, refs), rows, endings)
    models = {"cf_pmi": ("judge", evaluators.judge), "drift": ("embedder", evaluators.encoder), "ents": ("nli", evaluators.nli)}
    not_measured = {name: f"`models.{role}` is null" for name, (role, model) in models.items() if model is None}
    return pairs, not_measured
