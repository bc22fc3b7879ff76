import hashlib
import json

import pytest

from storyrewrite.io import InputError
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.metrics.evaluate import read_predictions, score_system

INSTANCES = [
    {"id": "s1:0", "story_id": "s1", "original_ending": "He went home.", "target": "He stayed out."},
    {"id": "s1:1", "story_id": "s1", "original_ending": "He went home.", "target": "He went out."},
]


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"id": "s1:0", "prediction": "a"}], r"1 instance\(s\) have no prediction, e.g. id s1:1"),
        ([{"id": "s1:0", "prediction": "a"}, {"id": "s1:0", "prediction": "b"}], r"p\.jsonl:2: duplicated id s1:0 \(first at line 1\)"),
        ([{"id": "s1:0", "prediction": "a"}, {"id": "s1:1", "prediction": "b"}, {"id": "s9:0", "prediction": "c"}],
         r"p\.jsonl:3: id s9:0 is not in the evaluated split; the split holds 2 instances \(`generate\.split`, as many as "
         r"`data\.max_eval` keeps\), e\.g\. id s1:0$"),
        # A mistyped id: its line, not the instance it leaves without a prediction.
        ([{"id": "s1:0", "prediction": "a"}, {"id": "s1-1", "prediction": "b"}, {"id": "s9:0", "prediction": "c"}],
         r"p\.jsonl:2: id s1-1 is not in the evaluated split, nor is 1 more of its ids; the split holds 2 instances"),
        ([{"id": "s1:0", "prediction": None}], r"p\.jsonl:1: field `prediction` must be a string \(id s1:0\)"),
        (['{"id": "s1:0", '], r"p\.jsonl:1: malformed JSON"),
    ],
)
def test_bad_predictions_are_reported_with_the_id(tmp_path, rows, message):
    with pytest.raises(InputError, match=message):
        read_predictions(_write(tmp_path / "p.jsonl", rows), INSTANCES)


def test_empty_prediction_is_scored_not_dropped(tmp_path, tiny_model_dirs, capsys):
    path = _write(tmp_path / "p.jsonl", [{"id": "s1:0", "prediction": ""}, {"id": "s1:1", "prediction": "He went out."}])
    predictions = read_predictions(path, INSTANCES)
    assert "1 empty prediction(s), scored as empty, e.g. id s1:0" in capsys.readouterr().err
    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    rows, metrics = score_system(predictions, INSTANCES, scorer, batch_size=2)
    assert [r["id"] for r in rows] == ["s1:0", "s1:1"] and metrics["empty_predictions"] == 1
    assert score_system({**predictions, "s1:0": " \n"}, INSTANCES, scorer, batch_size=2)[1]["empty_predictions"] == 1  # blank
    assert rows[0]["rougeL"] == 0.0 and rows[1]["rougeL"] == pytest.approx(100.0)
    # Each row names its prediction by the start of its SHA-256 (e3b0c442... is the empty string's).
    assert [r["prediction_digest"] for r in rows] == ["e3b0c44298fc", hashlib.sha256(b"He went out.").hexdigest()[:12]]


def test_corpus_metrics_and_counterfactual_forms(tiny_model_dirs):
    """Every form against values computed apart: each prediction scored against the edited and,
    separately, the original ending with the libraries and the scorer one pair at a time; the
    counterfactual form is 2·M(Ŷ, Y_EE) − M(Ŷ, X_OE) of those (corpus BLEU from the corpora)."""
    import sacrebleu
    from rouge_score import rouge_scorer

    predictions = {"s1:0": "He stayed out.", "s1:1": "He went home."}
    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    encoded = []  # BARTScore reads each prediction once for both endings: 2 encoder rows, not 4
    hook = scorer.model.get_encoder().register_forward_hook(lambda module, inputs, output: encoded.append(output[0].shape[0]))
    rows, metrics = score_system(predictions, INSTANCES, scorer, batch_size=2)
    hook.remove()
    assert sum(encoded) == 2
    rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    preds = [predictions[i["id"]] for i in INSTANCES]
    edited, original = [i["target"] for i in INSTANCES], [i["original_ending"] for i in INSTANCES]
    apart = {
        "bartscore": ([scorer.score([p], [t])[0] for p, t in zip(preds, edited, strict=True)], [scorer.score([p], [o])[0] for p, o in zip(preds, original, strict=True)]),
        "rougeL": ([100 * rouge.score(t, p)["rougeL"].fmeasure for p, t in zip(preds, edited, strict=True)],
                   [100 * rouge.score(o, p)["rougeL"].fmeasure for p, o in zip(preds, original, strict=True)]),
    }
    for metric, (vs_edited, vs_original) in apart.items():
        assert [r[metric] for r in rows] == pytest.approx(vs_edited, abs=1e-4)
        assert [r[f"{metric}_original"] for r in rows] == pytest.approx(vs_original, abs=1e-4)
        mean_edited, mean_original = sum(vs_edited) / 2, sum(vs_original) / 2
        assert metrics[metric]["predictive"] == pytest.approx(mean_edited, abs=1e-4)
        assert metrics[metric]["counterfactual"] == pytest.approx(2 * mean_edited - mean_original, abs=1e-4)
    bleu_edited = sacrebleu.corpus_bleu(preds, [edited]).score
    bleu_original = sacrebleu.corpus_bleu(preds, [original]).score
    assert metrics["sacrebleu"]["predictive"] == pytest.approx(bleu_edited, abs=1e-4)
    assert metrics["sacrebleu"]["counterfactual"] == pytest.approx(2 * bleu_edited - bleu_original, abs=1e-4)
    # The second prediction copies X_OE: it scores 100 against it and lower against the edit.
    assert rows[1]["rougeL_original"] == pytest.approx(100.0) and rows[1]["rougeL"] < 100
    assert metrics["counterfactual_metrics"] == "available"


def test_a_task_without_original_ending_has_only_predictive_metrics(tiny_model_dirs):
    art = [{"id": "a:0", "story_id": "a", "target": "He cried."}]
    rows, metrics = score_system({"a:0": "He cried."}, art, LMScorer.from_dir(tiny_model_dirs["bart"]), batch_size=1)
    assert set(metrics["rougeL"]) == {"predictive"} and "rougeL_original" not in rows[0]
    assert metrics["counterfactual_metrics"] == "not available: the task has no original ending"


def test_each_metrics_seconds_are_added_to_what_the_dict_holds(tiny_model_dirs):
    """A stage scoring several systems passes one dict: each computed metric's wall time (both
    references) is added to it, and what was there stays."""
    predictions = {"s1:0": "He stayed out.", "s1:1": "He went home."}
    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    seconds = {"load_models": 1.5}
    score_system(predictions, INSTANCES, scorer, 2, seconds=seconds)
    once = dict(seconds)
    assert set(once) == {"load_models", "bartscore", "rougeL", "sacrebleu"} and once["load_models"] == 1.5
    assert all(value > 0 for value in once.values())
    score_system(predictions, INSTANCES, scorer, 2, seconds=seconds)
    assert all(seconds[name] > once[name] for name in ("bartscore", "rougeL", "sacrebleu"))
