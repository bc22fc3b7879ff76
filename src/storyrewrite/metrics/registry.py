"""The overlap-metric registry: every metric that compares a prediction with a reference ending,
by name, with how it is computed and how reports show it.

An entry is all a new overlap metric takes, besides its field in
`storyrewrite.metrics.artifacts.SystemMetrics` (the schema of `reports/metrics/*.json`). From it:
- `score` computes it per instance against the edited ending and, where the task has one, the
  original ending (`storyrewrite.metrics.evaluate.score_system`), and its corpus value;
- its counterfactual forms, significance tests and table columns follow from those two numbers
  (`storyrewrite.metrics.counterfactual`, `storyrewrite.metrics.columns`);
- the `validity` stage measures whether it tells the reference rewrite from a copy of the
  original ending, with its multi-reference form (`storyrewrite.metrics.validity`).

Every metric is higher-is-better. Its functions take the predictions and the references; a metric
computed with a model (`needs`: BARTScore the frozen LM scorer, BERTScore its encoder) takes a
`Scoring` as well, which carries the loaded models. A metric whose model is not loaded (BERTScore
while `models.bertscore` is null) is not computed, and no table shows it. Torch-free: the
significance and report stages read the names and labels here, and only the `score` and
`validity` stages load models.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from storyrewrite.metrics import lexical


@dataclass(frozen=True)
class Scoring:
    """What a metric computed with a model receives besides the texts."""

    scorer: object | None = None  # storyrewrite.metrics.lm_scorer.LMScorer: M(a, b), BARTScore's model
    batch_size: int = 16
    bertscore: object | None = None  # storyrewrite.metrics.bertscore.BERTScore (None: `models.bertscore` is null)


@dataclass(frozen=True)
class OverlapMetric:
    name: str  # its key in the scores rows (`<name>`, `<name>_original`) and the metrics files
    label: str  # how tables name it
    # (predictions, references[, scoring]) -> one value per prediction
    per_instance: Callable[..., list[float]]
    # (predictions, several references per prediction[, scoring]) -> one value per prediction: the
    # metric-validity check scores the reference rewrite and the copy of the original ending
    # against a story's other rewrites with it.
    best_of: Callable[..., list[float]]
    # (predictions, references) -> the corpus value; None: the mean of the per-instance values
    corpus: Callable[[list[str], list[str]], float] | None = None
    decimals: int = 1  # digits in the tables
    # The `Scoring` field its functions need (`scorer`, `bertscore`; it is also the `models.<needs>`
    # param): they then take the Scoring, and the metric is computed only where that model is loaded.
    needs: str | None = None
    instance_label: str | None = None  # what one instance's value is called, where it is not `label` (the figure)
    # Whether `best_of` is the largest of the `per_instance` values against each reference (not so
    # for BLEU, which counts n-grams against every reference at once): the validity stage then takes
    # the copy baseline's best from the score stage's per-instance values (storyrewrite.metrics.validity).
    best_is_max: bool = False

    def computable(self, scoring: Scoring) -> bool:
        return self.needs is None or getattr(scoring, self.needs) is not None

    def values(self, predictions: list[str], references: list[str], scoring: Scoring) -> list[float]:
        return self.per_instance(predictions, references, *self._scoring(scoring))

    def best_values(self, predictions: list[str], references: list[list[str]], scoring: Scoring) -> list[float]:
        return self.best_of(predictions, references, *self._scoring(scoring))

    def corpus_value(self, predictions: list[str], references: list[str], values: list[float]) -> float:
        return sum(values) / len(values) if self.corpus is None else self.corpus(predictions, references)

    def _scoring(self, scoring: Scoring) -> tuple[Scoring, ...]:
        return (scoring,) if self.needs else ()


def bartscore(predictions: list[str], references: list[str], scoring: Scoring) -> list[float]:
    """M(Ŷ, reference): the mean log-probability of the reference's tokens given the prediction."""
    return scoring.scorer.score(predictions, references, batch_size=scoring.batch_size)


def best_bartscore(predictions: list[str], references: list[list[str]], scoring: Scoring) -> list[float]:
    """The best M(Ŷ, reference) over each prediction's references."""
    sources = [prediction for prediction, refs in zip(predictions, references, strict=True) for _ in refs]
    values = iter(scoring.scorer.score(sources, [ref for refs in references for ref in refs], scoring.batch_size))
    return [max(next(values) for _ in refs) for refs in references]


def bertscore(predictions: list[str], references: list[str] | list[list[str]], scoring: Scoring) -> list[float]:
    """BERTScore F1 of Ŷ against its reference, or the best over several (bert_score takes
    either, so one function is both the per-instance and the best-of form)."""
    return scoring.bertscore.f1(predictions, references, scoring.batch_size)


OVERLAP_METRICS: dict[str, OverlapMetric] = {metric.name: metric for metric in (
    OverlapMetric("bartscore", "BARTScore", bartscore, best_bartscore, decimals=3, needs="scorer", best_is_max=True),
    OverlapMetric("rougeL", "ROUGE-L", lexical.rouge_l, lexical.best_rouge_l, best_is_max=True),
    OverlapMetric("sacrebleu", "SacreBLEU", lexical.sentence_bleu, lexical.multi_reference_bleu,
                  corpus=lexical.corpus_bleu, instance_label="sentence BLEU"),
    OverlapMetric("bertscore", "BERTScore", bertscore, bertscore, decimals=3, needs="bertscore", best_is_max=True),
)}
