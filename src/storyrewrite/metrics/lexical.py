"""ROUGE-L (rouge-score, with stemming) and SacreBLEU, per sentence and per corpus, in 0-100.

Both libraries compute every number; the module keeps their objects for the process, computes
a pair that repeats once, and sums corpus BLEU from the sentence statistics it has. The values are those of `rouge_scorer.RougeScorer(["rougeL"],
use_stemmer=True)` and of `sacrebleu.sentence_bleu` / `sacrebleu.corpus_bleu`, which tests check on
the bundled test split.
"""
from __future__ import annotations

from functools import lru_cache

from nltk.stem import porter
from rouge_score import rouge_scorer, tokenize, tokenizers
from sacrebleu.metrics import BLEU
from sacrebleu.metrics.bleu import BLEUScore


class _StemmedTokenizer(tokenizers.Tokenizer):
    """rouge-score's own tokenizer (`tokenizers.DefaultTokenizer(use_stemmer=True)`), with each
    word stemmed once per process. rouge-score stems every token of every pair again: on the
    5,613 test pairs that was 80 % of ROUGE-L's time (the same few thousand words, 156k times).
    rouge-score takes a tokenizer object for this (`RougeScorer(tokenizer=...)`); nltk's Porter
    stemmer is a pure function of the word, so a cache changes no value."""

    def __init__(self):
        self.stem = lru_cache(maxsize=2**18)(porter.PorterStemmer().stem)

    def tokenize(self, text):
        return tokenize.tokenize(text, self)


@lru_cache(maxsize=1)
def _rouge():
    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_StemmedTokenizer())


# sacrebleu.sentence_bleu and corpus_bleu build these objects, and so a new 13a tokenizer with an
# empty cache, on every call; kept, a text tokenised once is not tokenised again. Their settings
# are those functions' defaults.
@lru_cache(maxsize=1)
def _sentence_bleu() -> BLEU:
    return BLEU(effective_order=True)


@lru_cache(maxsize=1)
def _corpus_bleu() -> BLEU:
    return BLEU()


def _each_pair_once(score, predictions: list[str], references: list[str]) -> list[float]:
    """score(prediction, reference) of each pair, each distinct pair computed once: a story's
    three instances share one input, so a system's predictions repeat, and with them their pairs
    with the story's one original ending (a third of the test split's pairs are distinct)."""
    pairs = list(zip(predictions, references, strict=True))
    values = {pair: score(*pair) for pair in dict.fromkeys(pairs)}
    return [values[pair] for pair in pairs]


def rouge_l(predictions: list[str], references: list[str]) -> list[float]:
    """Sentence-level ROUGE-L F1 × 100 of each prediction against its reference."""
    return _each_pair_once(lambda pred, ref: 100 * _rouge().score(ref, pred)["rougeL"].fmeasure, predictions, references)


def corpus_rouge_l(predictions: list[str], references: list[str]) -> float:
    """The corpus ROUGE-L as rouge-score reports it: the mean of the sentence-level F1."""
    scores = rouge_l(predictions, references)
    return sum(scores) / len(scores)


@lru_cache(maxsize=2**16)
def _pair_bleu(prediction: str, reference: str) -> BLEUScore:
    """sacrebleu's sentence score of one pair, with its n-gram counts and lengths: kept, so that
    the corpus BLEU of the same pairs (`corpus_bleu`, which a `score` stage asks for next) sums
    them instead of tokenising and counting every pair again."""
    return _sentence_bleu().sentence_score(prediction, [reference])


def sentence_bleu(predictions: list[str], references: list[str]) -> list[float]:
    """SacreBLEU sentence BLEU (exp-smoothed, sacrebleu's default for sentences)."""
    return _each_pair_once(lambda pred, ref: _pair_bleu(pred, ref).score, predictions, references)


def corpus_bleu(predictions: list[str], references: list[str]) -> float:
    """SacreBLEU corpus BLEU, as `sacrebleu.corpus_bleu(predictions, [references])` computes it:
    from the n-gram counts and lengths summed over the pairs (each pair as often as it occurs),
    which are each pair's sentence statistics, the same whatever the smoothing."""
    order = _corpus_bleu().max_ngram_order
    correct, total, sys_len, ref_len = [0] * order, [0] * order, 0, 0
    for prediction, reference in zip(predictions, references, strict=True):
        pair = _pair_bleu(prediction, reference)
        correct = [c + n for c, n in zip(correct, pair.counts, strict=True)]
        total = [t + n for t, n in zip(total, pair.totals, strict=True)]
        sys_len, ref_len = sys_len + pair.sys_len, ref_len + pair.ref_len
    bleu = _corpus_bleu()
    return BLEU.compute_bleu(correct, total, sys_len, ref_len, bleu.smooth_method, bleu.smooth_value,
                             bleu.effective_order, order).score


def best_rouge_l(predictions: list[str], references: list[list[str]]) -> list[float]:
    """Sentence-level ROUGE-L F1 × 100 against several references each: the best of them."""
    return [max(100 * _rouge().score(ref, pred)["rougeL"].fmeasure for ref in refs) for pred, refs in zip(predictions, references, strict=True)]


def multi_reference_bleu(predictions: list[str], references: list[list[str]]) -> list[float]:
    """SacreBLEU sentence BLEU against several references each (BLEU's own multi-reference form)."""
    return [_sentence_bleu().sentence_score(pred, refs).score for pred, refs in zip(predictions, references, strict=True)]
