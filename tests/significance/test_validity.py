"""Metric validity: wins, ties and losses of the reference over the copy of the original ending,
their story-resampled intervals, the verdict in words, and the values behind them (reference-
based metrics never score a reference against itself)."""
import numpy as np
import pytest

from storyrewrite.metrics import coherence, lexical
from storyrewrite.metrics.bertscore import BERTScore
from storyrewrite.metrics.counterfactual import METRICS
from storyrewrite.io import InputError, write_jsonl_atomic
from storyrewrite.metrics.evaluate import Evaluators, score_system
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.metrics.validity import gold_and_copy, other_instances, read_copy_scores
from storyrewrite.models.sentence import SentenceEncoder
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.systems import COPY_BASELINES
from storyrewrite.significance.validity import markdown, outcomes, summarise, validity


def test_outcomes_count_ties_apart():
    table = outcomes([1.0, 0.5, 0.2, 0.3 + 1e-12], [0.5, 0.5, 0.4, 0.3])
    assert table.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]]


def test_shares_intervals_and_the_verdict():
    stories = [f"s{i // 3}" for i in range(300)]
    rng = np.random.default_rng(0)
    copy = rng.normal(size=300)
    clear = summarise(list(copy + 1.0), list(copy), stories, n_resamples=500, seed=0)
    assert clear["wins"] == 1.0 and clear["ties"] == 0.0 and clear["separates"] and clear["margin_ci"][0] == 1.0
    coin = summarise(list(rng.normal(size=300)), list(copy), stories, n_resamples=500, seed=0)
    assert coin["wins_ci"][0] < coin["wins"] < coin["wins_ci"][1] and not coin["separates"]
    assert abs(coin["wins"] + coin["ties"] + coin["losses"] - 1) < 1e-9
    result = validity({"cf_pmi": (list(copy + 1.0), list(copy), stories), "rougeL": (list(rng.normal(size=300)), list(copy), stories)},
                      {"ents": "`models.nli` is null"}, n_resamples=500)
    text = markdown(result)
    assert "**ROUGE-L (M) does not tell the reference rewrite from the unchanged original ending**" in text
    below = validity({"drift": (list(copy - 1.0), list(copy), stories)}, {}, n_resamples=500)
    assert "**drift similarity prefers the unchanged original ending to the reference rewrite**: the copy scores higher on 100.0 %" in markdown(below)
    assert "CF-PMI does not" not in text and "EntScore: not measured (`models.nli` is null)." in text
    assert result["instances"] == 300 and result["stories"] == 100


STORIES = [
    {"id": "s1:0", "story_id": "s1", "premise": "Ann baked a cake.", "initial": "It was perfect.", "counterfactual": "She burnt it.",
     "original_ending": "She won a prize.", "target": "She threw it away."},
    {"id": "s1:1", "story_id": "s1", "premise": "Ann baked a cake.", "initial": "It was perfect.", "counterfactual": "She burnt it.",
     "original_ending": "She won a prize.", "target": "She won no prize."},
    {"id": "s2:0", "story_id": "s2", "premise": "Tom fished.", "initial": "He caught a trout.", "counterfactual": "It rained.",
     "original_ending": "He ate it.", "target": "He went home."},
]


def test_reference_based_metrics_score_both_endings_against_the_other_references(tiny_evaluators):
    assert [[STORIES[j]["target"] for j in others] for others in other_instances(STORIES)] == [
        ["She won no prize."], ["She threw it away."], []]
    judge = LMScorer.from_dir(resolve_model_dir(tiny_evaluators, "judge"), 96, 40)
    bertscore = BERTScore(resolve_model_dir(tiny_evaluators, "embedder"), "tiny:roberta", layer=2)
    evaluators = Evaluators(judge=judge, encoder=SentenceEncoder(resolve_model_dir(tiny_evaluators, "embedder")), bertscore=bertscore)
    pairs, not_measured = gold_and_copy(STORIES, evaluators, scorer=judge, batch_size=2)
    assert set(pairs) == {"cf_pmi", "drift", *METRICS} and not_measured == {"ents": "`models.nli` is null"}
    assert pairs["bertscore"][0][0] == pytest.approx(bertscore.f1(["She threw it away."], ["She won no prize."])[0], abs=1e-6)
    _, without = gold_and_copy(STORIES, Evaluators(judge=judge), scorer=judge, batch_size=2)
    assert without["bertscore"] == "`models.bertscore` is null"
    gold_pmi, copy_pmi, stories = pairs["cf_pmi"]
    assert gold_pmi == pytest.approx(coherence.cf_pmi(judge, STORIES, [r["target"] for r in STORIES]), abs=1e-6)
    assert copy_pmi == pytest.approx(coherence.cf_pmi(judge, STORIES, [r["original_ending"] for r in STORIES]), abs=1e-6)
    assert stories == ["s1", "s1", "s2"]
    # s2 has one reference: nothing to compare with, left out of the reference-based metrics.
    gold_rouge, copy_rouge, kept = pairs["rougeL"]
    assert kept == ["s1", "s1"]
    assert gold_rouge == pytest.approx(lexical.rouge_l(["She threw it away.", "She won no prize."], ["She won no prize.", "She threw it away."]))
    assert copy_rouge == pytest.approx(lexical.rouge_l(["She won a prize."] * 2, ["She won no prize.", "She threw it away."]))
    gold_drift = pairs["drift"][0]
    assert max(gold_drift) < 1.0 - 1e-6  # never a reference against itself
    assert pairs["bartscore"][0][0] == pytest.approx(judge.score(["She threw it away."], ["She won no prize."])[0], abs=1e-6)


def test_the_copy_baselines_scores_are_read_not_computed_again(tiny_evaluators, tmp_path):
    """Given the score stage's rows of the two copy baselines, the validity values equal those it
    computes without them; CF-PMI is not computed, and the copy's BARTScore is not scored again.
    Story s1 has three references, as TimeTravel's stories do: each ending is held against the best
    of two others."""
    stories = [*STORIES, {**STORIES[0], "id": "s1:2", "target": "She cried and then smiled."}]
    judge = LMScorer.from_dir(resolve_model_dir(tiny_evaluators, "judge"), 96, 40)
    bertscore = BERTScore(resolve_model_dir(tiny_evaluators, "embedder"), "tiny:roberta", layer=2)
    evaluators = Evaluators(judge=judge, encoder=SentenceEncoder(resolve_model_dir(tiny_evaluators, "embedder")), bertscore=bertscore)
    computed, not_measured = gold_and_copy(stories, evaluators, scorer=judge, batch_size=2)
    for system, (column, _) in COPY_BASELINES.items():
        rows, _ = score_system({row["id"]: row[column] for row in stories}, stories, judge, 2, evaluators)
        write_jsonl_atomic(tmp_path / f"{system}.jsonl", rows)
    scored_pairs = []
    judge.score = lambda sources, targets, batch_size=16: scored_pairs.extend(zip(sources, targets, strict=True)) or judge.score_ids(
        judge.encoder.source_ids(sources), targets, batch_size)
    seconds = {}
    read, read_not_measured = gold_and_copy(stories, evaluators, judge, 2, seconds, read_copy_scores(tmp_path, stories))
    assert set(read) == set(computed) and read_not_measured == not_measured
    for name, (gold, copy, story_ids) in computed.items():
        assert read[name][0] == pytest.approx(gold, abs=1e-5) and read[name][1] == pytest.approx(copy, abs=1e-5), name
        assert read[name][2] == story_ids
    assert "cf_pmi" not in seconds and "bartscore" in seconds
    assert scored_pairs and not any(source == "She won a prize." for source, _ in scored_pairs)  # the copy of X_OE


def test_a_reference_that_is_the_original_ending_ties_with_the_copy(tiny_evaluators, tmp_path):
    """Where Y_EE is X_OE unchanged (about 1 % of TimeTravel's test instances), the two endings
    are one text: every metric's copy value is the reference's, though scored in other batches
    or read from the copy baseline's rows with another rounding, and the instance is a tie."""
    stories = [dict(row) for row in STORIES]
    stories[1]["target"] = stories[1]["original_ending"]  # s1:1 keeps X_OE
    judge = LMScorer.from_dir(resolve_model_dir(tiny_evaluators, "judge"), 96, 40)
    evaluators = Evaluators(judge=judge, encoder=SentenceEncoder(resolve_model_dir(tiny_evaluators, "embedder")))
    for system, values in {"copy_reference": [0.1, 0.2, 0.3], "copy_original": [0.0, 0.2 + 3e-2, 0.5]}.items():
        write_jsonl_atomic(tmp_path / f"{system}.jsonl", [{"id": row["id"], "cf_pmi": v} for row, v in zip(stories, values, strict=True)])
    pairs, _ = gold_and_copy(stories, evaluators, judge, 2, copy_scores=read_copy_scores(tmp_path, stories))
    assert pairs["cf_pmi"][:2] == ([0.1, 0.2, 0.3], [0.0, 0.2, 0.5])
    assert set(pairs) == {"cf_pmi", "drift", *(set(METRICS) - {"bertscore"})}
    for name, (gold, copy, _) in pairs.items():  # the others: s1:0 and s1:1, each against the other's reference
        assert copy[1] == gold[1] and copy[0] != gold[0], name
        assert outcomes(gold, copy)[1].tolist() == [0, 1, 0], name


def test_copy_scores_of_other_instances_are_an_error_naming_the_line(tmp_path):
    for system in COPY_BASELINES:
        write_jsonl_atomic(tmp_path / f"{system}.jsonl", [{"id": row["id"]} for row in STORIES])
    assert len(read_copy_scores(tmp_path, STORIES)["copy_original"]) == 3
    write_jsonl_atomic(tmp_path / "copy_original.jsonl", [{"id": "s1:0"}, {"id": "s9:9"}])
    with pytest.raises(InputError, match=r"copy_original.jsonl:2: holds id 's9:9' where the evaluated split has id s1:1"):
        read_copy_scores(tmp_path, STORIES)
    write_jsonl_atomic(tmp_path / "copy_original.jsonl", [{"id": "s1:0"}])
    with pytest.raises(InputError, match=r"copy_original.jsonl: 1 rows for 3 instances; run score_sanity again"):
        read_copy_scores(tmp_path, STORIES)
    (tmp_path / "copy_reference.jsonl").unlink()
    with pytest.raises(InputError, match=r"copy_reference.jsonl: no such file"):
        read_copy_scores(tmp_path, STORIES)
