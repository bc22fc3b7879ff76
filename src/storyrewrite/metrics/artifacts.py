"""The evaluation's files, typed as storyrewrite.artifacts types the others (read and write them
with its `read` and `write`). Apart from it because only the stages that score, test and report
import this module: a new metric's field (docs/extending.md) reruns them, never a stage that
trains or generates (tests/test_dvc_deps.py).

| file                                   | written by            | model           |
|----------------------------------------|-----------------------|-----------------|
| reports/metrics/<system>.json          | score                 | SystemMetrics   |
| reports/significance.json              | significance          | Significance    |
| reports/validity.json                  | validity              | Validity        |
"""
from __future__ import annotations

from storyrewrite.artifacts import Artifact


class Overlap(Artifact):
    """An overlap metric's corpus value in each form (storyrewrite.metrics.counterfactual)."""
    predictive: float
    delta: float | None = None
    counterfactual: float | None = None


class EvaluatorSpecs(Artifact):
    judge: str | None
    embedder: str | None
    nli: str | None
    judge_is_scorer: bool


class SystemMetrics(Artifact):
    bartscore: Overlap
    rougeL: Overlap
    sacrebleu: Overlap
    bertscore: Overlap | None = None  # None: `models.bertscore` is null
    instances: int
    empty_predictions: int
    counterfactual_metrics: str  # "available", or why not
    prompt_echo: float  # the share of predictions that echo a prompt field (storyrewrite.metrics.echo)
    coherence_metrics: str | None = None  # "available", or why not (None: not computed)
    cf_pmi: float | None = None
    cf_follow: float | None = None
    drift: float | None = None
    ents: float | None = None
    hmean: float | None = None
    evaluators: EvaluatorSpecs | None = None


class Significance(Artifact):
    baseline: str
    n_resamples: int
    unit: str  # instance | story: what the bootstrap resampled
    p_values: dict[str, dict[str, float]]  # system -> column -> p (H1: system > baseline)


class ValidityFigures(Artifact):
    compared: str
    instances: int
    wins: float
    ties: float
    losses: float
    wins_ci: list[float]
    margin: float
    margin_ci: list[float]
    gold_mean: float
    copy_mean: float
    separates: bool


class Validity(Artifact):
    instances: int = 0
    stories: int = 0
    n_resamples: int = 0
    metrics: dict[str, ValidityFigures] = {}
    not_measured: dict[str, str] = {}
    not_available: str | None = None  # why the task has none (no original ending to copy)
