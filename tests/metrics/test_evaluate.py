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
         r"p\.jsonl:3: id s9:0 is not in the evaluated split"),
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
    rows, metrics = score_system(predictions, INSTANCES, LMScorer.from_dir(tiny_model_dirs["bart"]), batch_size=2)
    assert [r["id"] for r in rows] == ["s1:0", "s1:1"] and metrics["empty_predictions"] == 1
    assert rows[0]["rougeL"] == 0.0 and rows[1]["rougeL"] == pytest.approx(100.0)


def test_corpus_metrics_and_counterfactual_forms(tiny_model_dirs):
    predictions = {"s1:0": "He stayed out.", "s1:1": "He went home."}
    rows, metrics = score_system(predictions, INSTANCES, LMScorer.from_dir(tiny_model_dirs["bart"]), batch_size=2)
    mean = lambda key: sum(r[key] for r in rows) / 2  # noqa: E731
    assert metrics["rougeL"]["predictive"] == pytest.approx(mean("rougeL"), abs=1e-4)
    assert metrics["bartscore"]["predictive"] == pytest.approx(mean("bartscore"), abs=1e-4)
    for metric in ("bartscore", "rougeL", "sacrebleu"):
        m = metrics[metric]
        assert m["counterfactual"] == pytest.approx(2 * m["predictive"] - (m["predictive"] - m["delta"]), abs=2e-4)
    assert metrics["counterfactual_metrics"] == "available"


def test_a_task_without_original_ending_has_only_predictive_metrics(tiny_model_dirs):
    art = [{"id": "a:0", "story_id": "a", "target": "He cried."}]
    rows, metrics = score_system({"a:0": "He cried."}, art, LMScorer.from_dir(tiny_model_dirs["bart"]), batch_size=1)
    assert set(metrics["rougeL"]) == {"predictive"} and "rougeL_original" not in rows[0]
    assert metrics["counterfactual_metrics"] == "not available: the task has no original ending"
