"""The roles a model plays, what each needs of its model, and the check that says, before any
work, when the model a spec names cannot play it.

| role        | params             | kind       | needs                                                    |
|-------------|--------------------|------------|----------------------------------------------------------|
| `generator` | `models.generator` | lm         | a seq2seq or causal LM (it is trained)                   |
| `scorer`    | `models.scorer`    | lm         | an LM sharing the generator's vocabulary (BARTScore, DTO)|
| `judge`     | `models.judge`     | lm         | a causal LM with an end token (CF-PMI)                   |
| `embedder`  | `models.embedder`  | encoder    | a sentence encoder, not a decoder-only LM (drift)        |
| `nli`       | `models.nli`       | classifier | a sequence classifier with an `entailment` label (EntScore)|
| `bertscore` | `models.bertscore` | encoder    | an encoder, not a seq2seq or decoder-only LM (BERTScore)  |
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from storyrewrite.io import InputError


@dataclass(frozen=True)
class Role:
    name: str
    kind: str  # how a hub model is loaded (storyrewrite.models.specs.KINDS)
    stage: str  # the stage that materialises it: `models` (training's) or `eval_models`


ROLES = {
    "generator": Role("generator", "lm", "models"),
    "scorer": Role("scorer", "lm", "models"),
    "judge": Role("judge", "lm", "eval_models"),
    "embedder": Role("embedder", "encoder", "eval_models"),
    "nli": Role("nli", "classifier", "eval_models"),
    "bertscore": Role("bertscore", "encoder", "eval_models"),
}
EVAL_ROLES = tuple(name for name, role in ROLES.items() if role.stage == "eval_models")


def is_decoder_only(config: PretrainedConfig) -> bool:
    """A causal LM that reads left to right only (Llama, GPT-2, SmolLM2), not an encoder that
    also has an LM head (BERT)."""
    return (not config.is_encoder_decoder and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def entailment_label(config: PretrainedConfig, spec: str) -> int:
    """The index of the classifier's entailment class, found by name in its `id2label` (never
    assumed by position: MNLI models order their labels differently)."""
    found = [int(index) for index, label in config.id2label.items() if str(label).strip().lower() == "entailment"]
    if len(found) != 1:
        labels = ", ".join(f"{index}: {label}" for index, label in sorted(config.id2label.items()))
        raise InputError(f"params: `models.nli` = {spec!r} has no single `entailment` label in its config's id2label "
                         f"({labels}); name an NLI classifier, e.g. FacebookAI/roberta-large-mnli", key="models.nli")
    return found[0]


def check_role(role: str, directory: str | Path, spec: str) -> None:
    """Whether the model materialised in `directory` (from `spec`) can play `role`; an error
    naming the spec and what is wrong if not."""
    config = AutoConfig.from_pretrained(directory)
    param = f"models.{role}"

    def refused(problem: str) -> InputError:
        return InputError(f"params: `{param}` = {spec!r}{problem}", key=param)

    if ROLES[role].kind == "lm":  # the generator, the scorer, the judge
        if role == "judge" and not is_decoder_only(config):
            raise refused(f" is a {config.model_type} model, not a causal LM; CF-PMI scores the ending as a continuation "
                          "of the story (e.g. bundled:smollm2-135m-instruct, openai-community/gpt2-large)")
        if role != "judge" and not (config.is_encoder_decoder or is_decoder_only(config)):
            does = "is trained to write the ending" if role == "generator" else "scores the ending token by token (BARTScore, DTO)"
            raise refused(f" is a {config.model_type} model, not a seq2seq or causal LM, which the {role} needs: it {does} "
                          "(e.g. bundled:smollm2-135m-instruct, facebook/bart-large-cnn)")
        if AutoTokenizer.from_pretrained(directory).eos_token_id is None:
            uses = ("which CF-PMI scores after the ending (as BARTScore does) and pads batches with" if role == "judge"
                    else "which ends every target it is trained on or scores")
            raise refused(f": its tokenizer has no end-of-text token, {uses}")
    elif role in ("embedder", "bertscore"):
        needs = ("a sentence encoder; drift similarity needs one (e.g. bundled:all-minilm-l6-v2, bert-base-uncased)" if role == "embedder"
                 else "an encoder; BERTScore matches an encoder's token embeddings (e.g. roberta-large, bundled:all-minilm-l6-v2)")
        if config.is_encoder_decoder or is_decoder_only(config):
            raise refused(f" is a {'seq2seq' if config.is_encoder_decoder else 'decoder-only'} LM, not {needs}")
    elif role == "nli":
        if not any(name.endswith("ForSequenceClassification") for name in config.architectures or []):
            raise refused(f" is not a sequence classifier (architectures: {', '.join(config.architectures or ['none'])}); "
                          "EntScore needs an NLI classifier")
        entailment_label(config, spec)
