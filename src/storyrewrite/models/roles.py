"""The check that says, before any work, when the model a spec names cannot play its role: the
rule of storyrewrite.models.catalogue (which the roles and their needs are), read from the
materialised model's config, and what only the model can tell (an LM's end token, a
classifier's entailment label).
"""
from __future__ import annotations

import functools
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from storyrewrite.io import InputError
from storyrewrite.models.catalogue import ROLES, Shape, cannot_be_loaded, catalogued, refused, role_problem, vocabularies_differ


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


def check_same_vocabulary(generator: PreTrainedTokenizerBase, scorer: PreTrainedTokenizerBase, names: tuple[str, str]) -> None:
    """DTO feeds generator distributions to the scorer token by token: the vocabularies must match."""
    if generator.get_vocab() != scorer.get_vocab():
        raise vocabularies_differ((names[0], len(generator)), (names[1], len(scorer)))


@functools.cache
def _role_error(role: str, spec: str, directory: Path) -> InputError | None:
    """check_role's refusal of the model in `directory`, once a process (a sweep checks each experiment)."""
    try:
        check_role(role, directory, spec)
    except InputError as error:
        return error
    except (OSError, ValueError) as error:  # a config.json or tokenizer transformers cannot read, as its stage words it
        return cannot_be_loaded(role, spec, error)
    return None


def check_local_specs(specs: dict[str, str | None], directories: dict[str, Path]) -> list[InputError]:
    """What the models stages would refuse of the models that specs (role -> spec) name on this
    machine (role -> directory: storyrewrite.models.catalogue.local_models), read from their
    configs and tokenizers, no weights loaded: a model that cannot play its role, a generator and
    a scorer of different vocabularies."""
    errors = [error for role, directory in directories.items() if (error := _role_error(role, specs[role], directory))]
    if errors:
        return errors
    lms = {role: AutoTokenizer.from_pretrained(directories[role]) for role in ("generator", "scorer") if role in directories}
    if len(lms) == 2:
        try:
            check_same_vocabulary(lms["generator"], lms["scorer"], (specs["generator"], specs["scorer"]))
        except InputError as error:
            errors.append(error)
    elif len(lms) == 1:
        # The other one catalogued: vocabularies of different sizes differ (equal sizes tell nothing here).
        ((role, tokenizer),) = lms.items()
        other = "scorer" if role == "generator" else "generator"
        try:
            model = catalogued(specs[other]) if specs.get(other) else None
        except InputError:  # an unknown name: check_specs says so
            model = None
        if model is not None and model.tokens != len(tokenizer):
            sizes = {role: (specs[role], len(tokenizer)), other: (specs[other], model.tokens)}
            errors.append(vocabularies_differ(sizes["generator"], sizes["scorer"]))
    return errors
