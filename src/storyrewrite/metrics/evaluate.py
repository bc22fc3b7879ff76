"""Score one system's predictions: per-instance scores and corpus metrics.

Per instance, each overlap metric (storyrewrite.metrics.registry) is computed against the edited
ending (Y_EE) and, where the task has one, against the original ending (X_OE); the
counterfactual forms are derived from those two (`storyrewrite.metrics.counterfactual`). Where
the task has a counterfactual event, the coherence metrics say whether the ending follows it
(`storyrewrite.metrics.coherence`).
BERTScore, an overlap metric too, only where `models.bertscore` names its encoder.
Corpus numbers: each overlap metric's own (BARTScore, ROUGE-L and BERTScore the mean over
instances, SacreBLEU corpus BLEU); the coherence metrics' means over instances (cf_follow the
share with cf_pmi > 0); HMean combines corpus BLEU with mean EntScore.
Each per-instance row names the prediction it scores by a digest (`prediction_digest`), so that
two systems' rows for the same text count as a tie, and the models that scored its model columns
(`scored_by`), so that columns scored by different models are never tested against each other
(storyrewrite.significance.compare).
"""
from __future__ import annotations

import hashlib
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from storyrewrite.io import InputError, read_jsonl
from storyrewrite.metrics import coherence, counterfactual, lexical
from storyrewrite.metrics.bertscore import BERTScore
from storyrewrite.metrics.registry import OVERLAP_METRICS, Scoring
from storyrewrite.metrics.echo import prompt_echo
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.sentence import SentenceEncoder
from storyrewrite.models.store import optional_model_dir, resolve_model_dir, role_spec, same_model

# The columns the coherence metrics read: the tasks without them (ART) get none.
COHERENCE_INPUTS = ("premise", "initial", "counterfactual", "original_ending")


@dataclass
class Evaluators:
    """The evaluation models besides the LM scorer: the coherence metrics' and BERTScore's, each
    None where its spec is null."""

    judge: LMScorer | None = None
    encoder: SentenceEncoder | None = None
    nli: coherence.EntailmentScorer | None = None
    specs: dict = field(default_factory=dict)  # role -> spec (None where null)
    judge_is_scorer: bool = False  # the judge has the training scorer's weights (DTO optimised its likelihoods)
    bertscore: BERTScore | None = None

    @classmethod
    def load(cls, directory: Path, scorer: LMScorer, scorer_models: Path, device: torch.device, dtype: str,
             max_input_tokens: int, max_output_tokens: int, bertscore_layer: int | None = None,
             bertscore_rescale: bool = False, coherence_models: bool = True) -> "Evaluators":
        """The eval_models stage's models (`directory`), on `device`; a judge that is the scorer
        of the models stage's directory `scorer_models` is that scorer itself (loaded once).
        Without `coherence_models`, BERTScore's alone (a task without a counterfactual event)."""
        bertscore = None
        if (bertscore_dir := optional_model_dir(directory, "bertscore")) is not None:
            bertscore = BERTScore(bertscore_dir, role_spec(directory, "bertscore"), bertscore_layer, bertscore_rescale, device)
        if not coherence_models:
            return cls(bertscore=bertscore)
        judge_dir, embedder_dir, nli_dir = (optional_model_dir(directory, role) for role in ("judge", "embedder", "nli"))
        same = judge_dir is not None and same_model(judge_dir, role_spec(directory, "judge"),
                                                    resolve_model_dir(scorer_models, "scorer"), role_spec(scorer_models, "scorer"))
        judge = scorer if same else (None if judge_dir is None else
                                     LMScorer.from_dir(judge_dir, max_input_tokens, max_output_tokens, dtype, device))
        return cls(
            judge=judge, encoder=None if embedder_dir is None else SentenceEncoder(embedder_dir, device),
            nli=None if nli_dir is None else coherence.EntailmentScorer(nli_dir, role_spec(directory, "nli"), device),
            specs={role: role_spec(directory, role) for role in ("judge", "embedder", "nli")}, judge_is_scorer=same,
            bertscore=bertscore,
        )


def load_scoring_models(scorer_models: Path, evaluators_dir: Path | None, models, config, device: torch.device,
                        coherence_models: bool = True) -> tuple[LMScorer, Evaluators | None]:
    """(the LM scorer of the models stage's directory `scorer_models`, the eval_models stage's models
    in `evaluators_dir`, None without it), on `device`, as the score and validity stages load them:
    `models` (params' ModelsConfig) gives the token limits, `config` (ScoreConfig) the dtype and
    BERTScore's settings; `coherence_models` as Evaluators.load's."""
    scorer = LMScorer.from_dir(resolve_model_dir(scorer_models, "scorer"), models.max_input_tokens, models.max_output_tokens,
                               dtype=config.dtype, device=device)
    evaluators = None if evaluators_dir is None else Evaluators.load(
        evaluators_dir, scorer, scorer_models, device, config.dtype, models.max_input_tokens, models.max_output_tokens,
        config.bertscore_layer, config.bertscore_rescale, coherence_models)
    return scorer, evaluators


def read_predictions(path: Path, instances: list[dict]) -> dict[str, str]:
    """id -> prediction, checked against the instances: a missing, duplicated or unknown id or a
    malformed row is an error naming it; an empty prediction is reported and scored as it is."""
    predictions: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, row in read_jsonl(path):
        instance_id, prediction = row.get("id"), row.get("prediction")
        if not isinstance(instance_id, str):
            raise InputError(f"{path}:{line}: field `id` must be a string")
        if not isinstance(prediction, str):
            raise InputError(f"{path}:{line}: field `prediction` must be a string (id {instance_id})")
        if instance_id in predictions:
            raise InputError(f"{path}:{line}: duplicated id {instance_id} (first at line {lines[instance_id]})")
        predictions[instance_id], lines[instance_id] = prediction, line
    expected = [row["id"] for row in instances]
    # An unknown id first: its line is where a file written for other ids (another split, or more
    # of it than `data.max_eval` keeps) or with a mistyped id goes wrong.
    known = set(expected)
    if unknown := [i for i in predictions if i not in known]:
        more = {1: "", 2: ", nor is 1 more of its ids"}.get(len(unknown), f", nor are {len(unknown) - 1} more of its ids")
        raise InputError(f"{path}:{lines[unknown[0]]}: id {unknown[0]} is not in the evaluated split{more}; the split holds "
                         f"{len(expected)} instances (`generate.split`, as many as `data.max_eval` keeps), e.g. id {expected[0]}")
    missing = [i for i in expected if i not in predictions]
    if missing:
        raise InputError(f"{path}: {len(missing)} instance(s) have no prediction, e.g. id {missing[0]}")
    empty = [i for i in expected if not predictions[i].strip()]
    if empty:
        print(f"warning: {path}: {len(empty)} empty prediction(s), scored as empty, e.g. id {empty[0]}", file=sys.stderr)
    return predictions


# The row fields each model scores (besides the overlap metrics', named by their `needs`): the
# coherence metrics' models.
COHERENCE_MODELS = {"cf_pmi": "judge", "drift": "embedder", "ents": "nli"}


def scoring_models(scorer_spec: str, precision: str, evaluators: Evaluators | None) -> dict[str, str]:
    """role -> what a score row's `scored_by` names for it: the model's spec, with its weights'
    precision for the LMs that `score.dtype` sets (the scorer, the judge: `precision`, as the
    stage record names it), BERTScore's with its layer and rescaling. A value in a model column is
    a function of the instance, the prediction and this (up to the batch layout's rounding)."""
    models = {"scorer": f"{scorer_spec} ({precision})"}
    if evaluators is None:
        return models
    if evaluators.judge is not None:
        models["judge"] = f"{evaluators.specs['judge']} ({precision})"
    models |= {role: evaluators.specs[role] for role in ("embedder", "nli") if evaluators.specs.get(role) is not None}
    if (bertscore := evaluators.bertscore) is not None:
        models["bertscore"] = f"{bertscore.spec}, layer {bertscore.layer}" + (", rescaled" if bertscore.rescale else "")
    return models


def prediction_digest(text: str) -> str:
    """The first 12 hex digits of the SHA-256 of `text` (UTF-8): a score row's name for the
    prediction it scores, without the text (48 bits: two different predictions of one instance
    share one with odds of 1 in 2.8e14)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@contextmanager
def timed(seconds: dict[str, float] | None, name: str):
    """Adds the wall time of the block to seconds[name] (nothing where `seconds` is None)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if seconds is not None:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started


def score_system(predictions: dict[str, str], instances: list[dict], scorer: LMScorer, batch_size: int,
                 evaluators: Evaluators | None = None, seconds: dict[str, float] | None = None,
                 models: dict[str, str] | None = None) -> tuple[list[dict], dict]:
    """(per-instance rows, corpus metrics) for one system; the coherence metrics and BERTScore
    of the `evaluators` given (none without). `seconds`, if given, receives each metric's wall
    time, added to what it holds (a stage scoring several systems sums them). `models`
    (scoring_models), if given: each row's `scored_by`, {row field: model} for its model columns."""
    outputs = [predictions[row["id"]] for row in instances]
    references = {"edited": [row["target"] for row in instances]}
    if all("original_ending" in row for row in instances):
        references["original"] = [row["original_ending"] for row in instances]
    scoring = Scoring(scorer, batch_size, bertscore=None if evaluators is None else evaluators.bertscore)
    computed = [metric for metric in OVERLAP_METRICS.values() if metric.computable(scoring)]
    per_instance: dict[str, dict[str, list[float]]] = {name: {} for name in references}
    corpus: dict[str, dict[str, float]] = {name: {} for name in references}
    # Each metric scores every reference set in one call (its values are per pair): a model metric
    # then reads each prediction once for all its targets (LMScorer's shared sources).
    sets = list(references.items())
    for metric in computed:
        with timed(seconds, metric.name):
            values = metric.values(outputs * len(sets), [ref for _, refs in sets for ref in refs], scoring)
            for k, (name, refs) in enumerate(sets):
                part = per_instance[name][metric.name] = values[k * len(outputs) : (k + 1) * len(outputs)]
                corpus[name][metric.name] = metric.corpus_value(outputs, refs, part)

    rows = []
    for i, row in enumerate(instances):
        scored = {"id": row["id"], "story_id": row["story_id"], "prediction_digest": prediction_digest(outputs[i])}
        for metric in computed:
            scored[metric.name] = per_instance["edited"][metric.name][i]
            if "original" in per_instance:
                scored[f"{metric.name}_original"] = per_instance["original"][metric.name][i]
        rows.append(scored)
    metrics = {
        metric.name: {k: round(v, 4) for k, v in counterfactual.forms(corpus["edited"][metric.name],
                                                                      corpus.get("original", {}).get(metric.name)).items()}
        for metric in computed
    }
    metrics["instances"] = len(instances)
    metrics["empty_predictions"] = sum(not p.strip() for p in outputs)
    metrics["prompt_echo"] = round(prompt_echo(outputs, instances), 4)
    metrics["counterfactual_metrics"] = "available" if "original" in references else "not available: the task has no original ending"
    if not all(column in instances[0] for column in COHERENCE_INPUTS):
        metrics["coherence_metrics"] = "not available: the task has no counterfactual event"
    elif evaluators is not None:
        # HMean is defined on corpus BLEU (EDUCAT), whichever overlap metrics are registered; it
        # needs EntScore's NLI model.
        bleu = (None if evaluators.nli is None else corpus["edited"]["sacrebleu"] if "sacrebleu" in corpus["edited"]
                else lexical.corpus_bleu(outputs, references["edited"]))
        metrics |= score_coherence(outputs, instances, rows, evaluators, bleu, batch_size, seconds)
    if models is not None and rows:
        roles = {metric.name: metric.needs for metric in computed if metric.needs} | COHERENCE_MODELS
        scored_by = {field: models[role] for field, role in roles.items() if field in rows[0] and role in models}
        for row in rows:
            row["scored_by"] = scored_by
    return rows, metrics


def score_coherence(outputs: list[str], instances: list[dict], rows: list[dict], evaluators: Evaluators,
                    bleu: float | None, batch_size: int, seconds: dict[str, float] | None = None) -> dict:
    """Adds each coherence metric's per-instance value to `rows`; returns their corpus values.
    `bleu`: the corpus SacreBLEU that HMean combines with EntScore (None without an NLI model);
    `seconds` as score_system's."""
    per_instance = {}
    if evaluators.judge is not None:
        with timed(seconds, "cf_pmi"):
            per_instance["cf_pmi"] = coherence.cf_pmi(evaluators.judge, instances, outputs, batch_size)
    if evaluators.encoder is not None:
        with timed(seconds, "drift"):
            per_instance["drift"] = coherence.drift_similarity(evaluators.encoder, instances, outputs)
    if evaluators.nli is not None:
        with timed(seconds, "ents"):
            per_instance["ents"] = coherence.entailment(evaluators.nli, instances, outputs, batch_size)
    for name, values in per_instance.items():
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    corpus = {name: sum(values) / len(values) for name, values in per_instance.items()}
    if "cf_pmi" in per_instance:
        corpus["cf_follow"] = sum(v > 0 for v in per_instance["cf_pmi"]) / len(instances)
    if "ents" in per_instance:
        corpus["hmean"] = coherence.hmean(bleu, corpus["ents"])
    ordered = {name: round(corpus[name], 4) for name in ("cf_pmi", "cf_follow", "drift", "ents", "hmean") if name in corpus}
    return {**ordered, "coherence_metrics": "available",
            "evaluators": {**evaluators.specs, "judge_is_scorer": evaluators.judge_is_scorer}}
