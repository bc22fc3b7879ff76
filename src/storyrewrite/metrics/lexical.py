"""ROUGE-L (rouge-score, with stemming) and SacreBLEU, per sentence and per corpus, in 0-100."""
from __future__ import annotations

from functools import lru_cache

import sacrebleu
from rouge_score import rouge_scorer


@lru_cache(maxsize=1)
def _rouge():
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(predictions: list[str], references: list[str]) -> list[float]:
    """Sentence-level ROUGE-L F1 × 100 of each prediction against its reference."""
    return [100 * _rouge().score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references, strict=True)]


def corpus_rouge_l(predictions: list[str], references: list[str]) -> float:
    """The corpus ROUGE-L as rouge-score reports it: the mean of the sentence-level F1."""
    scores = rouge_l(predictions, references)
    return sum(scores) / len(scores)


def sentence_bleu(predictions: list[str], references: list[str]) -> list[float]:
    """SacreBLEU sentence BLEU (exp-smoothed, sacrebleu's default for sentences)."""
    return [sacrebleu.sentence_bleu(pred, [ref]).score for pred, ref in zip(predictions, references, strict=True)]


def corpus_bleu(predictions: list[str], references: list[str]) -> float:
    return sacrebleu.corpus_bleu(predictions, [references]).score


def best_rouge_l(predictions: list[str], references: list[list[str]]) -> list[float]:
    """Sentence-level ROUGE-L F1 × 100 against several references each: the best of them."""
    return [max(100 * _rouge().score(ref, pred)["rougeL"].fmeasure for ref in refs) for pred, refs in zip(predictions, references, strict=True)]


def multi_reference_bleu(predictions: list[str], references: list[list[str]]) -> list[float]:
    """SacreBLEU sentence BLEU against several references each (BLEU's own multi-reference form)."""
    return [sacrebleu.sentence_bleu(pred, refs).score for pred, refs in zip(predictions, references, strict=True)]
