"""BERTScore: the `bert_score` package's values on our models, checked against the formula
computed with transformers alone, and the metric's path through scoring, significance and tables
(computed only where `models.bertscore` names an encoder)."""
import csv

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from helpers import system_metrics
from storyrewrite.metrics.artifacts import SystemMetrics
from storyrewrite.io import InputError
from storyrewrite.metrics.bertscore import BERTScore, baseline_file, default_layer
from storyrewrite.metrics.columns import available
from storyrewrite.metrics.evaluate import Evaluators, score_system, scoring_models
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.roles import check_role
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.report.tables import Row, latex_table, markdown_table

PREDICTIONS = ["He went to the store and bought milk.", "", "The cat sat."]
REFERENCES = ["He walked to the shop to buy milk.", "Something happened.", "A dog ran away from the cat."]
INSTANCES = [
    {"id": "s1:0", "story_id": "s1", "original_ending": "He went home.", "target": "He stayed out late."},
    {"id": "s1:1", "story_id": "s1", "original_ending": "He went home.", "target": "He went out."},
]


def _encoder(tiny_evaluators):
    return resolve_model_dir(tiny_evaluators, "embedder")  # tiny:roberta, a RoBERTa encoder


def by_hand(directory, layer: int, prediction: str, reference: str) -> float:
    """BERTScore F1 as Zhang et al. define it, with transformers alone: the layer's token vectors,
    unit-normalised; precision = the mean over the prediction's tokens of the best cosine with
    any reference token (special tokens included on the matched side, not averaged over), recall
    the other way round. RoBERTa text starts with a space, as bert_score encodes it; an empty
    prediction scores 0, as bert_score defines it."""
    if not prediction.strip():
        return 0.0
    tokenizer, model = AutoTokenizer.from_pretrained(directory), AutoModel.from_pretrained(directory).eval()

    def vectors(text: str) -> torch.Tensor:
        encoded = tokenizer(" " + text.strip(), return_tensors="pt")
        with torch.no_grad():
            hidden = model(**encoded, output_hidden_states=True).hidden_states[layer][0]
        return torch.nn.functional.normalize(hidden, dim=-1)

    similarity = vectors(prediction) @ vectors(reference).T
    precision = similarity[1:-1].max(dim=1).values.mean()
    recall = similarity[:, 1:-1].max(dim=0).values.mean()
    return float(2 * precision * recall / (precision + recall))


def test_bertscore_equals_the_formula_computed_apart(tiny_evaluators):
    directory = _encoder(tiny_evaluators)
    for layer in (1, 2):
        values = BERTScore(directory, "tiny:roberta", layer=layer).f1(PREDICTIONS, REFERENCES, batch_size=2)
        assert values == pytest.approx([by_hand(directory, layer, p, r) for p, r in zip(PREDICTIONS, REFERENCES, strict=True)], abs=1e-5)
    assert values[1] == 0.0 and 0 < values[0] < 1


def test_the_multi_reference_form_is_the_best_single_reference(tiny_evaluators):
    bertscore = BERTScore(_encoder(tiny_evaluators), "tiny:roberta", layer=2)
    others = ["The cat sat on a mat.", "He bought milk."]
    best = bertscore.f1(PREDICTIONS, [[reference, *others] for reference in REFERENCES])
    singles = [bertscore.f1(PREDICTIONS, [reference] * len(PREDICTIONS)) for reference in (REFERENCES, *others)]
    singles[0] = bertscore.f1(PREDICTIONS, REFERENCES)
    assert best == pytest.approx([max(column) for column in zip(*singles, strict=True)], abs=1e-6)


def test_rescaling_uses_bert_score_s_baseline_for_the_model(tiny_evaluators):
    """(F − b) / (1 − b) with b the F column of the package's baseline file at the layer, read
    here with csv. The tiny encoder stands in for roberta-large: only the arithmetic is checked."""
    directory = _encoder(tiny_evaluators)
    raw = BERTScore(directory, "tiny:roberta", layer=2).f1(PREDICTIONS[:1], REFERENCES[:1])[0]
    rescaled = BERTScore(directory, "roberta-large", layer=2, rescale=True).f1(PREDICTIONS[:1], REFERENCES[:1])[0]
    with open(baseline_file("roberta-large"), newline="") as file:
        baseline = float(next(row for row in csv.DictReader(file) if int(row["LAYER"]) == 2)["F"])
    assert rescaled == pytest.approx((raw - baseline) / (1 - baseline), abs=1e-5)
    assert default_layer("roberta-large") == 17


@pytest.mark.parametrize("spec, layer, baseline", [
    ("roberta-large", 17, "roberta-large.tsv"),
    ("FacebookAI/roberta-large", 17, "roberta-large.tsv"),  # the hub's current name of the same model
    ("google-bert/bert-base-uncased", 9, "bert-base-uncased.tsv"),
    ("facebook/bart-large", 10, None),  # the package knows it under its org; it has no baseline for it
    ("someone/roberta-large", None, None),  # another org's model of that name is not the package's
    ("FacebookAI/no-such-model", None, None),
])
def test_the_package_s_tables_know_hub_models_by_their_old_and_new_names(spec, layer, baseline):
    assert default_layer(spec) == layer
    assert (None if baseline_file(spec) is None else baseline_file(spec).name) == baseline


def test_bad_settings_name_the_parameter(tiny_evaluators, tiny_model_dirs):
    directory = _encoder(tiny_evaluators)
    with pytest.raises(InputError, match=r"`score.bertscore_layer` is null and `models.bertscore` = 'tiny:roberta'.*name the layer \(1 to 2\)"):
        BERTScore(directory, "tiny:roberta")
    with pytest.raises(InputError, match=r"`score.bertscore_layer` = 5: .* has layers 1 to 2"):
        BERTScore(directory, "tiny:roberta", layer=5)
    with pytest.raises(InputError, match=r"`score.bertscore_rescale` is true but bert_score has no baseline for `models.bertscore` = 'tiny:roberta'"):
        BERTScore(directory, "tiny:roberta", layer=1, rescale=True)
    with pytest.raises(InputError, match=r"`models.bertscore` = 'tiny:llama' is a decoder-only LM, not an encoder; BERTScore"):
        check_role("bertscore", tiny_model_dirs["llama"], "tiny:llama")


def test_scored_with_both_forms_where_named_and_absent_everywhere_where_not(tiny_evaluators, tiny_model_dirs):
    bertscore = BERTScore(_encoder(tiny_evaluators), "tiny:roberta", layer=2)
    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    predictions = {"s1:0": "He stayed out.", "s1:1": "He went home."}
    rows, metrics = score_system(predictions, INSTANCES, scorer, batch_size=2, evaluators=Evaluators(bertscore=bertscore))
    outputs = list(predictions.values())
    vs_edited = bertscore.f1(outputs, [row["target"] for row in INSTANCES])
    vs_original = bertscore.f1(outputs, [row["original_ending"] for row in INSTANCES])
    assert [r["bertscore"] for r in rows] == pytest.approx(vs_edited, abs=1e-6)
    assert [r["bertscore_original"] for r in rows] == pytest.approx(vs_original, abs=1e-6)
    mean_edited, mean_original = sum(vs_edited) / 2, sum(vs_original) / 2
    assert metrics["bertscore"]["predictive"] == pytest.approx(mean_edited, abs=1e-4)
    assert metrics["bertscore"]["counterfactual"] == pytest.approx(2 * mean_edited - mean_original, abs=1e-4)
    assert rows[1]["bertscore_original"] == pytest.approx(1.0, abs=1e-5)  # the copy of X_OE matches it exactly
    assert "bertscore/counterfactual" in available(rows[0])
    assert SystemMetrics.model_validate(metrics).bertscore.predictive == metrics["bertscore"]["predictive"]

    rows, metrics = score_system(predictions, INSTANCES, scorer, batch_size=2)
    assert "bertscore" not in metrics and "bertscore" not in rows[0]
    assert SystemMetrics.model_validate(metrics).bertscore is None
    assert not any(column.startswith("bertscore/") for column in available(rows[0]))


def test_a_bertscore_column_names_its_encoder_layer_and_rescaling(tiny_evaluators, tiny_model_dirs):
    """Raw and rescaled BERTScore, or two layers, are different numbers: each row's `scored_by`
    tells them apart, so that significance never tests one against the other."""
    directory = _encoder(tiny_evaluators)
    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    named = {}
    for spec, layer, rescale in (("tiny:roberta", 1, False), ("tiny:roberta", 2, False), ("roberta-large", 2, True)):
        evaluators = Evaluators(bertscore=BERTScore(directory, spec, layer=layer, rescale=rescale))
        rows, _ = score_system({"s1:0": "He stayed out.", "s1:1": "He went home."}, INSTANCES, scorer, batch_size=2,
                               evaluators=evaluators, models=scoring_models("tiny:bart", "float32", evaluators))
        named[spec, layer] = rows[0]["scored_by"]["bertscore"]
    assert named == {("tiny:roberta", 1): "tiny:roberta, layer 1", ("tiny:roberta", 2): "tiny:roberta, layer 2",
                     ("roberta-large", 2): "roberta-large, layer 2, rescaled"}


def test_tables_show_bertscore_only_where_a_system_has_it():
    without = [Row("nll", "NLL", system_metrics(-2.0), {}), Row("finetuned", "DTO", system_metrics(-1.9), {})]
    assert "BERTScore" not in markdown_table(without, 0.05) and "BERTScore" not in latex_table(without, 0.05, "c")
    scored = {"bertscore": {"predictive": 0.812, "counterfactual": 0.7}}
    rows = [Row("nll", "NLL", system_metrics(-2.0, **scored), {}),
            Row("finetuned", "DTO", system_metrics(-1.9, bertscore={"predictive": 0.815, "counterfactual": 0.69}), {})]
    header, _, nll, dto = markdown_table(rows, 0.05).splitlines()
    assert header.count("BERTScore") == 2 and header.index("BERTScore (M)") < header.index("BARTScore (M + Δ_M)")
    assert nll.endswith("| 0.812 | -3.000 | **50.0** | **0.0** | **0.700** |") and "**0.815**" in dto
    latex = latex_table(rows, 0.05, "c")
    assert "\\multicolumn{4}{c}{Predictive" in latex and "System & BARTScore & ROUGE-L & SacreBLEU & BERTScore & BARTScore" in latex


def test_the_eval_models_directory_carries_the_encoder_to_the_score_stage(tmp_path):
    """The path `dvc exp run -S models.bertscore=… -S score.bertscore_layer=…` takes: the
    eval_models stage materialises the encoder; the score stage loads it with the spec it came
    from, also for a task without a counterfactual event (ART: BERTScore alone)."""
    from storyrewrite.models.materialise import materialise
    from storyrewrite.models.catalogue import EVAL_ROLES
    from storyrewrite.params import ModelsConfig

    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", max_input_tokens=96, max_output_tokens=40,
                          bertscore="tiny:roberta")
    materialise(config, tmp_path, seed=0, roles=EVAL_ROLES)
    evaluators = Evaluators.load(tmp_path, None, tmp_path, torch.device("cpu"), "float32", 96, 40, bertscore_layer=1,
                                 coherence_models=False)
    assert evaluators.bertscore.spec == "tiny:roberta" and evaluators.bertscore.layer == 1
    assert evaluators.judge is None and evaluators.encoder is None
    assert evaluators.bertscore.f1(["He went home."], ["He went home."]) == [pytest.approx(1.0, abs=1e-5)]
