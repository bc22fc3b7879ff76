"""The coherence metrics against computations done another way: CF-PMI one token at a time,
drift with the encoder called on each text alone, EntScore as a softmax of the classifier's
logits; the entailment label found by name; tasks without X_CE; the bootstrap over the new
columns; and the checks that refuse a model that cannot play its role."""
import json
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from storyrewrite.io import InputError
from storyrewrite.metrics import coherence
from storyrewrite.metrics.evaluate import Evaluators, score_system, scoring_models
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.materialise import materialise
from storyrewrite.models.roles import check_role
from storyrewrite.models.sentence import SentenceEncoder
from storyrewrite.models.store import load_model, load_tokenizer, resolve_model_dir
from storyrewrite.params import ModelsConfig
from storyrewrite.significance.compare import compare

from helpers import redrawn

STORIES = [
    {"id": "s1:0", "story_id": "s1", "premise": "Ann baked a cake for the fair.", "initial": "It came out perfect.",
     "counterfactual": "She burnt it badly.", "original_ending": "She won first prize. Everyone loved it.",
     "target": "She threw it away. Nobody tasted it."},
    {"id": "s1:1", "story_id": "s1", "premise": "Ann baked a cake for the fair.", "initial": "It came out perfect.",
     "counterfactual": "She burnt it badly.", "original_ending": "She won first prize. Everyone loved it.",
     "target": "She baked another one."},
    {"id": "s2:0", "story_id": "s2", "premise": "Tom went fishing.", "initial": "He caught a huge trout.",
     "counterfactual": "It rained all day long and the lake flooded the path to the pier.",
     "original_ending": "He cooked it for dinner.", "target": "He went home wet and cold, with nothing."},
]
ENDINGS = ["She threw it away.", "", "He cooked a trout for dinner and told everyone about the big fish he caught."]


def log_prob_step_by_step(model, tokenizer, context: str, ending: str) -> float:
    """Mean log p of the ending's tokens and its end token after the context, one forward per
    token, no batch and no padding."""
    context_ids = tokenizer(context)["input_ids"]
    ending_ids = tokenizer(" " + ending, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    total = 0.0
    with torch.no_grad():
        for t, token in enumerate(ending_ids):
            logits = model(input_ids=torch.tensor([context_ids + ending_ids[:t]])).logits[0, -1]
            total += F.log_softmax(logits.double(), dim=-1)[token].item()
    return total / len(ending_ids)


def test_cf_pmi_equals_the_token_by_token_difference_of_the_two_contexts(tiny_evaluators):
    directory = resolve_model_dir(tiny_evaluators, "judge")
    model, tokenizer = load_model(directory).eval(), load_tokenizer(directory)
    expected = [log_prob_step_by_step(model, tokenizer, f"{row['premise']} {row['counterfactual']}", ending)
                - log_prob_step_by_step(model, tokenizer, f"{row['premise']} {row['initial']}", ending)
                for row, ending in zip(STORIES, ENDINGS, strict=True)]
    judge = LMScorer.from_dir(directory, max_input_tokens=96, max_output_tokens=40)
    # Batches of 2 over 6 pairs of mixed lengths: padding in every batch.
    assert coherence.cf_pmi(judge, STORIES, ENDINGS, batch_size=2) == pytest.approx(expected, abs=1e-5)


def cls_vector(model, tokenizer, text: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, 0]


def test_drift_equals_the_cosine_of_the_two_moves_computed_text_by_text(tiny_evaluators):
    directory = resolve_model_dir(tiny_evaluators, "embedder")
    model, tokenizer = AutoModel.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)
    expected = []
    for row, ending in zip(STORIES, ENDINGS, strict=True):
        start = cls_vector(model, tokenizer, f"{row['premise']} {row['initial']} {row['original_ending']}")
        moved = cls_vector(model, tokenizer, f"{row['premise']} {row['counterfactual']} {ending}") - start
        wanted = cls_vector(model, tokenizer, f"{row['premise']} {row['counterfactual']} {row['target']}") - start
        expected.append(float(moved @ wanted / (moved.norm() * wanted.norm())))
    encoder = SentenceEncoder(directory, batch_size=2)
    assert encoder.pooling == "cls" and not encoder.normalize  # a plain encoder: [CLS], as Qin et al.
    assert coherence.drift_similarity(encoder, STORIES, ENDINGS) == pytest.approx(expected, abs=1e-5)
    # The reference itself moves the story exactly as the reference does.
    assert coherence.drift_similarity(encoder, STORIES, [row["target"] for row in STORIES]) == pytest.approx([1.0] * 3, abs=1e-6)
    # Several references: the best of them.
    several = coherence.drift_similarity(encoder, STORIES, ENDINGS, [[r["target"], STORIES[0]["target"]] for r in STORIES])
    alone = coherence.drift_similarity(encoder, STORIES, ENDINGS, [[STORIES[0]["target"]]] * 3)
    assert several == pytest.approx([max(a, b) for a, b in zip(expected, alone, strict=True)], abs=1e-6)


def test_a_sentence_transformers_directory_pools_as_its_files_say(tiny_evaluators, tmp_path):
    directory = tmp_path / "st"
    shutil.copytree(resolve_model_dir(tiny_evaluators, "embedder"), directory)
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    model, tokenizer = AutoModel.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)
    texts = ["A short one.", "A much longer sentence, so that the batch has padding in it.", "Mid-length, this one.", "Hi.",
             "The longest of them all, so that it comes first in the order of lengths, as the encoder sorts them."]
    with torch.no_grad():
        expected = torch.stack([F.normalize(model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0].mean(0), dim=0)
                                for t in texts])
    # In one batch, and in batches of two (sorted by length): each vector back at its text's place.
    for batch_size in (64, 2):
        torch.testing.assert_close(SentenceEncoder(directory, batch_size=batch_size).embed(texts), expected, atol=1e-5, rtol=1e-5)
    # Without a Normalize module the mean vectors stay as they are; the card's max_seq_length bounds the input.
    modules = json.loads((directory / "modules.json").read_text())[:2]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8}))
    with torch.no_grad():
        means = torch.stack([model(**tokenizer(t, return_tensors="pt", truncation=True, max_length=8)).last_hidden_state[0].mean(0)
                             for t in texts])
    encoder = SentenceEncoder(directory)
    assert encoder.max_length == 8 and (means.norm(dim=1) - 1).abs().max() > 0.01
    torch.testing.assert_close(encoder.embed(texts), means, atol=1e-5, rtol=1e-5)


def _classifier_copy(tiny_evaluators, tmp_path, id2label: dict, initializer_range: float | None = None) -> tuple:
    """The tiny NLI classifier with other labels; with `initializer_range`, weights drawn afresh at
    that spread (at the default 0.02 its probabilities barely depend on the premise)."""
    directory = tmp_path / "nli"
    shutil.copytree(resolve_model_dir(tiny_evaluators, "nli"), directory)
    config = json.loads((directory / "config.json").read_text())
    config["id2label"], config["label2id"] = id2label, {v: int(k) for k, v in id2label.items()}
    (directory / "config.json").write_text(json.dumps(config))
    if initializer_range is not None:
        redrawn(directory, directory, AutoModelForSequenceClassification, initializer_range)
    return directory


def test_ents_is_the_softmax_of_the_class_named_entailment_and_hmean_its_harmonic_mean(tiny_evaluators, tmp_path):
    # Labels in another order than roberta-large-mnli's (and than tiny:roberta-nli's): the lookup must go by name.
    directory = _classifier_copy(tiny_evaluators, tmp_path, {"0": "neutral", "1": "entailment", "2": "contradiction"}, 0.2)
    model, tokenizer = AutoModelForSequenceClassification.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)
    expected = []
    with torch.no_grad():
        for row, ending in zip(STORIES, ENDINGS, strict=True):
            # One pair at a time, no padding. (As lists: a lone string pair with an empty hypothesis
            # drops the hypothesis's separators, which a batch keeps.)
            logits = model(**tokenizer([f"{row['premise']} {row['counterfactual']}"], [ending], return_tensors="pt")).logits[0]
            expected.append(torch.softmax(logits, dim=-1)[1].item())
    nli = coherence.EntailmentScorer(directory, "tiny:roberta-nli")
    assert nli.label == 1
    assert coherence.entailment(nli, STORIES, ENDINGS, batch_size=2) == pytest.approx(expected, abs=1e-5)
    assert coherence.hmean(40.0, 0.6) == pytest.approx(2 * 0.4 * 0.6 / 1.0)
    assert coherence.hmean(0.0, 0.0) == 0.0


@pytest.mark.parametrize("labels", [
    {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},  # none
    {"0": "entailment", "1": "neutral", "2": " ENTAILMENT"},  # two, once the case and spaces are set aside
])
def test_a_classifier_without_a_single_entailment_label_is_refused_by_name(tiny_evaluators, tmp_path, labels):
    directory = _classifier_copy(tiny_evaluators, tmp_path, labels)
    listed = ", ".join(f"{index}: {label}" for index, label in labels.items())
    refusal = rf"`models.nli` = 'my/nli' has no single `entailment` label .*\({re.escape(listed)}\)"
    with pytest.raises(InputError, match=refusal):  # the models stage's check, before any scoring
        check_role("nli", directory, "my/nli")
    with pytest.raises(InputError, match=refusal):
        coherence.EntailmentScorer(directory, "my/nli")


@pytest.mark.parametrize("role, spec, message", [
    ("judge", "tiny:bart", r"`models.judge` = 'tiny:bart' is a bart model, not a causal LM"),
    ("embedder", "tiny:llama", r"`models.embedder` = 'tiny:llama' is a decoder-only LM, not a sentence encoder"),
    ("nli", "tiny:roberta", r"`models.nli` = 'tiny:roberta' is a roberta model, not a sequence classifier"),
])
def test_a_model_that_cannot_play_its_role_is_refused_before_any_scoring(tmp_path, role, spec, message):
    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", max_input_tokens=96, max_output_tokens=40, **{role: spec})
    with pytest.raises(InputError, match=message):
        materialise(config, tmp_path / "evaluators", seed=0, roles=(role,))
    assert not (tmp_path / "evaluators").exists()  # nothing half-written


def _evaluators(tiny_evaluators, nli: bool = True) -> Evaluators:
    judge = LMScorer.from_dir(resolve_model_dir(tiny_evaluators, "judge"), 96, 40)
    return Evaluators(judge=judge, encoder=SentenceEncoder(resolve_model_dir(tiny_evaluators, "embedder")),
                      nli=coherence.EntailmentScorer(resolve_model_dir(tiny_evaluators, "nli"), "tiny:roberta-nli") if nli else None,
                      specs={"judge": "tiny:llama", "embedder": "tiny:roberta", "nli": "tiny:roberta-nli" if nli else None})


def test_a_judge_with_the_scorers_weights_is_the_scorer_and_another_judge_is_loaded_apart(tiny_evaluators, tmp_path):
    """The eval_models stage's judge (tiny:llama) against two models stages: one whose scorer is
    the same model (the judge is that LMScorer, loaded once, and the report says DTO optimised
    its likelihoods) and one whose scorer is another model (the judge is loaded from its own
    directory, and CF-PMI is the judge's)."""
    cpu = torch.device("cpu")
    found = {}
    for scorer_spec in ("tiny:llama", "tiny:bart"):
        models = tmp_path / scorer_spec.replace(":", "_")
        materialise(ModelsConfig(generator=scorer_spec, scorer=scorer_spec, max_input_tokens=96, max_output_tokens=40), models, seed=0)
        scorer = LMScorer.from_dir(resolve_model_dir(models, "scorer"), 96, 40)
        found[scorer_spec] = scorer, Evaluators.load(tiny_evaluators, scorer, models, cpu, "float32", 96, 40)
    scorer, same = found["tiny:llama"]
    assert same.judge is scorer and same.judge_is_scorer
    scorer, other = found["tiny:bart"]
    assert other.judge is not scorer and not other.judge_is_scorer and other.judge.model.config.model_type == "llama"
    judge = LMScorer.from_dir(resolve_model_dir(tiny_evaluators, "judge"), 96, 40)
    assert coherence.cf_pmi(other.judge, STORIES, ENDINGS, 2) == pytest.approx(coherence.cf_pmi(judge, STORIES, ENDINGS, 2), abs=1e-6)


def test_score_system_adds_the_coherence_columns_and_their_corpus_values(tiny_evaluators):
    evaluators = _evaluators(tiny_evaluators)
    predictions = {row["id"]: ending for row, ending in zip(STORIES, ENDINGS, strict=True)}
    rows, metrics = score_system(predictions, STORIES, evaluators.judge, batch_size=2, evaluators=evaluators)
    for name in ("cf_pmi", "drift", "ents"):
        assert metrics[name] == pytest.approx(np.mean([r[name] for r in rows]), abs=1e-4)
    assert metrics["cf_follow"] == pytest.approx(np.mean([r["cf_pmi"] > 0 for r in rows]), abs=1e-4)  # (4 digits kept)
    assert metrics["hmean"] == pytest.approx(coherence.hmean(metrics["sacrebleu"]["predictive"], metrics["ents"]), abs=1e-3)
    assert metrics["coherence_metrics"] == "available" and metrics["evaluators"]["nli"] == "tiny:roberta-nli"
    # The ablated task has X_CE, X_IE and X_OE (only not as input): the same columns. ART has none.
    art = [{"id": "a:0", "story_id": "a", "premise": "He ran.", "hypothesis_1": "x", "hypothesis_2": "y", "target": "He fell."}]
    rows, metrics = score_system({"a:0": "He fell."}, art, evaluators.judge, batch_size=1, evaluators=evaluators)
    assert metrics["coherence_metrics"] == "not available: the task has no counterfactual event"
    assert "cf_pmi" not in metrics and "cf_pmi" not in rows[0]
    _, without_nli = score_system(predictions, STORIES, evaluators.judge, batch_size=2, evaluators=_evaluators(tiny_evaluators, nli=False))
    assert "ents" not in without_nli and "hmean" not in without_nli and "cf_pmi" in without_nli


def test_each_row_names_the_model_behind_each_of_its_model_columns(tiny_evaluators):
    """`scored_by`: {row field: model} for the columns computed with a model, the LMs with their
    precision; the lexical columns name none; without `models` a row has no `scored_by`."""
    evaluators = _evaluators(tiny_evaluators)
    predictions = {row["id"]: ending for row, ending in zip(STORIES, ENDINGS, strict=True)}
    models = scoring_models("my/scorer", "float32 (tf32 matmul)", evaluators)
    assert models == {"scorer": "my/scorer (float32 (tf32 matmul))", "judge": "tiny:llama (float32 (tf32 matmul))",
                      "embedder": "tiny:roberta", "nli": "tiny:roberta-nli"}
    rows, _ = score_system(predictions, STORIES, evaluators.judge, batch_size=2, evaluators=evaluators, models=models)
    assert all(row["scored_by"] == {"bartscore": models["scorer"], "cf_pmi": models["judge"], "drift": "tiny:roberta",
                                    "ents": "tiny:roberta-nli"} for row in rows)
    without_nli = _evaluators(tiny_evaluators, nli=False)
    rows, _ = score_system(predictions, STORIES, without_nli.judge, batch_size=2, evaluators=without_nli,
                           models=scoring_models("my/scorer", "bfloat16", without_nli))
    assert rows[0]["scored_by"] == {"bartscore": "my/scorer (bfloat16)", "cf_pmi": "tiny:llama (bfloat16)", "drift": "tiny:roberta"}
    assert "scored_by" not in score_system(predictions, STORIES, evaluators.judge, batch_size=2)[0][0]


def test_the_bootstrap_tests_the_coherence_columns(tiny_evaluators):
    rows = [{"id": f"s{i}:0", "story_id": f"s{i}", "bartscore": -2.0, "rougeL": 50.0, "sacrebleu": 30.0,
             "cf_pmi": 0.1 * (i % 3) - 0.05, "drift": 0.2, "ents": 0.5} for i in range(30)]
    better = [dict(row, cf_pmi=row["cf_pmi"] + 0.3, drift=row["drift"] - 0.1) for row in rows]
    p = compare({"nll": rows, "dto": better}, "nll", n_resamples=500, seed=0, by_story=True)["dto"]
    assert set(p) == {"bartscore/predictive", "rougeL/predictive", "sacrebleu/predictive", "cf_pmi", "cf_follow", "drift", "ents"}
    assert p["cf_pmi"] == 0.0 and p["cf_follow"] == 0.0 and p["drift"] == 1.0 and p["ents"] == 1.0


def test_an_ending_follows_the_counterfactual_where_its_cf_pmi_is_above_zero():
    from storyrewrite.metrics.columns import value

    assert [value({"cf_pmi": v}, "cf_follow") for v in (-0.3, 0.0, 1e-9, 2.0)] == [0.0, 0.0, 1.0, 1.0]
