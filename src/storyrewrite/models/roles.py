"""The check that says, before any work, when the model a spec names cannot play its role: the
rule of storyrewrite.models.catalogue (which the roles and their needs are), read from the
materialised model's config, and what only the model can tell (an LM's end token, a
classifier's entailment label).
"""
from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from storyrewrite.models.catalogue import ROLES, Shape, refused, role_problem


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
        raise refused("nli", spec, f" has no single `entailment` label in its config's id2label ({labels}); name an NLI "
                                   "classifier, e.g. FacebookAI/roberta-large-mnli")
    return found[0]


def shape_of(config: PretrainedConfig) -> Shape:
    """What the role check reads of a model's config."""
    return Shape(config.model_type, bool(config.is_encoder_decoder), is_decoder_only(config),
                 any(name.endswith("ForSequenceClassification") for name in config.architectures or []))


def check_role(role: str, directory: str | Path, spec: str) -> None:
    """Whether the model materialised in `directory` (from `spec`) can play `role`; an error
    naming the spec and what is wrong if not."""
    config = AutoConfig.from_pretrained(directory)
    if (problem := role_problem(role, shape_of(config))) is not None:
        raise refused(role, spec, problem)
    if ROLES[role].kind == "lm" and AutoTokenizer.from_pretrained(directory).eos_token_id is None:
        uses = ("which CF-PMI scores after the ending (as BARTScore does) and pads batches with" if role == "judge"
                else "which ends every target it is trained on or scores")
        raise refused(role, spec, f": its tokenizer has no end-of-text token, {uses}")
    if role == "nli":
        entailment_label(config, spec)
