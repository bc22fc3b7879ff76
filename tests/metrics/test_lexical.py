import pytest
import sacrebleu
from helpers import BUNDLED
from rouge_score import rouge_scorer

from storyrewrite.data.prepare import read_stories, timetravel_instances
from storyrewrite.metrics import lexical

PREDICTIONS = ["The cats were running home quickly.", "He ate the cake.", ""]
REFERENCES = ["The cat ran home quickly.", "She baked a cake.", "Something."]


def test_rouge_l_is_rouge_score_with_stemming():
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    expected = [100 * scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(PREDICTIONS, REFERENCES, strict=True)]
    assert lexical.rouge_l(PREDICTIONS, REFERENCES) == pytest.approx(expected)
    assert lexical.corpus_rouge_l(PREDICTIONS, REFERENCES) == pytest.approx(sum(expected) / 3)
    # By hand: stems the/cat/run/home/quick (6 tokens) vs the/cat/ran/home/quick (5); "run" != "ran", so
    # the LCS is 4 tokens: P = 4/6, R = 4/5.
    assert lexical.rouge_l(PREDICTIONS[:1], REFERENCES[:1])[0] == pytest.approx(100 * 2 * (4 / 6) * (4 / 5) / (4 / 6 + 4 / 5))


def test_bleu_matches_sacrebleu():
    assert lexical.corpus_bleu(PREDICTIONS, REFERENCES) == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)
    assert lexical.sentence_bleu(PREDICTIONS, REFERENCES) == pytest.approx(
        [sacrebleu.sentence_bleu(p, [r]).score for p, r in zip(PREDICTIONS, REFERENCES, strict=True)])
    assert lexical.sentence_bleu(["same words here ok"], ["same words here ok"])[0] == pytest.approx(100)


@pytest.mark.parametrize("function, references", [
    (lexical.rouge_l, REFERENCES), (lexical.sentence_bleu, REFERENCES),
    (lexical.best_rouge_l, [[r] for r in REFERENCES]), (lexical.multi_reference_bleu, [[r] for r in REFERENCES]),
])
def test_a_prediction_without_its_reference_is_an_error_not_a_shorter_score(function, references):
    """One list shorter than the other (a reference lost on the way) raises, where pairing them up
    to the shorter one would score the rest and say nothing."""
    assert len(function(PREDICTIONS, references)) == len(PREDICTIONS)
    with pytest.raises(ValueError, match="zip"):
        function(PREDICTIONS, references[:-1])
    with pytest.raises(ValueError, match="zip"):
        function(PREDICTIONS[:-1], references)


def test_a_pair_that_repeats_is_scored_once(monkeypatch):
    """A story's three instances share one prediction and one original ending: each metric calls
    its library once per distinct pair, and every instance gets its pair's value."""
    calls = []
    rouge, bleu = lexical._rouge(), lexical._sentence_bleu()
    lexical._pair_bleu.cache_clear()
    monkeypatch.setattr(rouge, "score", lambda ref, pred: calls.append((pred, ref)) or {"rougeL": type("S", (), {"fmeasure": len(pred) / 100})})
    monkeypatch.setattr(bleu, "sentence_score", lambda pred, refs: calls.append((pred, refs[0])) or type("S", (), {"score": len(refs[0])}))
    predictions, references = ["a b", "a b", "a b", "c"], ["x", "x", "yy", "x"]
    assert lexical.rouge_l(predictions, references) == pytest.approx([3, 3, 3, 1])
    assert calls == [("a b", "x"), ("a b", "yy"), ("c", "x")]
    calls.clear()
    try:
        assert lexical.sentence_bleu(predictions, references) == [1, 1, 2, 1]
        assert calls == [("a b", "x"), ("a b", "yy"), ("c", "x")]
    finally:
        lexical._pair_bleu.cache_clear()  # it holds the stand-ins


def test_corpus_bleu_sums_the_sentence_statistics_without_counting_a_pair_again(monkeypatch):
    """The score stage asks for sentence BLEU, then corpus BLEU of the same pairs: the second
    counts no n-gram again, and gives sacrebleu.corpus_bleu's value (a repeated pair counted as
    often as it occurs; pairs without a 4-gram in common; a reference longer than its prediction)."""
    lexical._pair_bleu.cache_clear()
    predictions = ["the cat sat on the mat today", "the cat sat on the mat today", "a dog", "he went home and slept"]
    references = ["the cat sat on a mat", "the cat sat on a mat", "a dog barked at the moon all night", "he went home and slept"]
    sentences = lexical.sentence_bleu(predictions, references)
    assert sentences == [sacrebleu.sentence_bleu(p, [r]).score for p, r in zip(predictions, references, strict=True)]
    calls = []
    bleu = lexical._sentence_bleu()
    original = bleu.sentence_score
    monkeypatch.setattr(bleu, "sentence_score", lambda pred, refs: calls.append(pred) or original(pred, refs))
    assert lexical.corpus_bleu(predictions, references) == sacrebleu.corpus_bleu(predictions, [references]).score
    assert calls == []
    assert lexical.corpus_bleu(predictions[2:], references[2:]) == sacrebleu.corpus_bleu(predictions[2:], [references[2:]]).score


def test_kept_objects_give_the_libraries_values_on_real_stories():
    """rouge-score with each word stemmed once and sacrebleu's BLEU objects kept for the process
    (storyrewrite.metrics.lexical) give exactly the values of the libraries' plain calls, on 900
    test instances of the bundled TimeTravel file: the original ending as the prediction, scored
    against the edited ending, then the original ending itself (repeated texts, cache hits)."""
    rows = timetravel_instances(read_stories(BUNDLED / "timetravel" / "test_data.json"))[:900]
    predictions = [row["original_ending"] for row in rows]
    rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    for references in ([row["target"] for row in rows], predictions):
        pairs = list(zip(predictions, references, strict=True))
        assert lexical.rouge_l(predictions, references) == [100 * rouge.score(r, p)["rougeL"].fmeasure for p, r in pairs]
        assert lexical.sentence_bleu(predictions, references) == [sacrebleu.sentence_bleu(p, [r]).score for p, r in pairs]
        assert lexical.corpus_bleu(predictions, references) == sacrebleu.corpus_bleu(predictions, [references]).score
    several = [[row["target"], row["original_ending"]] for row in rows[:200]]
    assert lexical.multi_reference_bleu(predictions[:200], several) == [
        sacrebleu.sentence_bleu(p, refs).score for p, refs in zip(predictions[:200], several, strict=True)]
    assert lexical.best_rouge_l(predictions[:200], several) == [
        max(100 * rouge.score(r, p)["rougeL"].fmeasure for r in refs) for p, refs in zip(predictions[:200], several, strict=True)]
