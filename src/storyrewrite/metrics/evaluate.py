"""Score one system's predictions: per-instance scores and corpus metrics.

Per instance, each metric is computed against the edited ending (Y_EE) and, where the task has
one, against the original ending (X_OE); the counterfactual forms are derived from those two
(`storyrewrite.metrics.counterfactual`). Corpus numbers: BARTScore and ROUGE-L are means of the
sentence scores; SacreBLEU is corpus BLEU.
"""
from __future__ import annotations

import sys
from pathlib import Path

from storyrewrite.io import InputError, read_jsonl
from storyrewrite.metrics import counterfactual, lexical
from storyrewrite.metrics.counterfactual import METRICS
from storyrewrite.metrics.lm_scorer import LMScorer

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
    missing = [i for i in expected if i not in predictions]
    if missing:
        raise InputError(f"{path}: {len(missing)} instance(s) have no prediction, e.g. id {missing[0]}")
    unknown = sorted(set(predictions) - set(expected))
    if unknown:
        raise InputError(f"{path}:{lines[unknown[0]]}: id {unknown[0]} is not in the evaluated split")
    empty = [i for i in expected if not predictions[i].strip()]
    if empty:
        print(f"warning: {path}: {len(empty)} empty prediction(s), scored as empty, e.g. id {empty[0]}", file=sys.stderr)
    return predictions


def score_system(predictions: dict[str, str], instances: list[dict], scorer: LMScorer, batch_size: int) -> tuple[list[dict], dict]:
    """(per-instance rows, corpus metrics) for one system."""
    outputs = [predictions[row["id"]] for row in instances]
    references = {"edited": [row["target"] for row in instances]}
    if all("original_ending" in row for row in instances):
        references["original"] = [row["original_ending"] for row in instances]
    per_instance: dict[str, dict[str, list[float]]] = {}
    corpus: dict[str, dict[str, float]] = {}
    for name, refs in references.items():
        bart = scorer.score(outputs, refs, batch_size=batch_size)  # M(Ŷ, reference)
        rouge = lexical.rouge_l(outputs, refs)
        per_instance[name] = {"bartscore": bart, "rougeL": rouge, "sacrebleu": lexical.sentence_bleu(outputs, refs)}
        corpus[name] = {"bartscore": sum(bart) / len(bart), "rougeL": sum(rouge) / len(rouge),
                        "sacrebleu": lexical.corpus_bleu(outputs, refs)}

    rows = []
    for i, row in enumerate(instances):
        scored = {"id": row["id"], "story_id": row["story_id"]}
        for metric in METRICS:
            scored[metric] = per_instance["edited"][metric][i]
            if "original" in per_instance:
                scored[f"{metric}_original"] = per_instance["original"][metric][i]
        rows.append(scored)
    metrics = {
        metric: {k: round(v, 4) for k, v in counterfactual.forms(corpus["edited"][metric], corpus.get("original", {}).get(metric)).items()}
        for metric in METRICS
    }
    metrics["instances"] = len(instances)
    metrics["empty_predictions"] = sum(not p.strip() for p in outputs)
    metrics["counterfactual_metrics"] = "available" if "original" in references else "not available: the task has no original ending"
    return rows, metrics
