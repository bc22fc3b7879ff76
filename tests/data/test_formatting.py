import pytest

from storyrewrite.data.formatting import model_source, model_target
from storyrewrite.models.store import load_tokenizer

TT = {
    "id": "s:0", "story_id": "s", "premise": "Ann baked.", "initial": "She burnt it.",
    "counterfactual": "She watched it.", "original_ending": "It was black.", "target": "It was golden.",
}
ART = {"id": "a:0", "story_id": "a", "premise": "Bo ran.", "hypothesis_1": "He fell.", "hypothesis_2": "He won.", "target": "He cried."}


@pytest.mark.parametrize(
    "task, instance, expected",
    [
        ("timetravel", TT, "Ann baked.</s>She burnt it.</s>It was black.</s>She watched it."),
        ("timetravel_ablated", TT, "Ann baked.</s>She burnt it.</s>She watched it."),
        ("art", ART, "Bo ran.</s>He fell.</s>He won."),
    ],
)
def test_seq2seq_input_joins_fields_with_bart_separator(tiny_model_dirs, task, instance, expected):
    tokenizer = load_tokenizer(tiny_model_dirs["bart"])
    assert model_source(instance, task, tokenizer, seq2seq=True) == expected
    # The separator is BART's real </s> token, not its characters spelled out.
    ids = tokenizer(expected)["input_ids"]
    assert ids.count(tokenizer.sep_token_id) == expected.count("</s>") + 1  # + the closing eos


@pytest.mark.parametrize(
    "task, instance, expected",
    [
        ("timetravel", TT, "Premise: Ann baked.\nInitial event: She burnt it.\nOriginal ending: It was black.\n"
                           "Counterfactual event: She watched it.\nEdited ending:"),
        ("timetravel_ablated", TT, "Premise: Ann baked.\nInitial event: She burnt it.\n"
                                   "Counterfactual event: She watched it.\nEdited ending:"),
        ("art", ART, "Premise: Bo ran.\nHypothesis 1: He fell.\nHypothesis 2: He won.\nEnding:"),
    ],
)
def test_causal_prompt(tiny_model_dirs, task, instance, expected):
    tokenizer = load_tokenizer(tiny_model_dirs["llama"])
    assert model_source(instance, task, tokenizer, seq2seq=False) == expected
    assert model_target(instance["target"], seq2seq=False) == " " + instance["target"]
    assert model_target(instance["target"], seq2seq=True) == instance["target"]
