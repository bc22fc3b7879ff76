"""The model store: the one place that loads the materialised models back
(storyrewrite.models.materialise writes them: `models/pretrained/`, `models/evaluators/`, each
with an `index.json` of role -> model directory and the spec each came from)."""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, PreTrainedModel,
                          PreTrainedTokenizerBase)

from storyrewrite.io import InputError, atomic_dir, read_json, sha256_file, write_json_atomic

# Beside a trained model's weights: what it was trained for (task, objective, system label).
# transformers' own files hold no field for it, and the task decides the input format.
TRAINED_FILE = "storyrewrite.json"


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest: Path, trained: dict | None = None) -> None:
    """save_pretrained into a temporary sibling directory, then swap it in: never half-written.
    `trained`: what the model was trained for, written to TRAINED_FILE."""
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if trained is not None:
            write_json_atomic(tmp / TRAINED_FILE, trained)


def trained_task(model_dir: str | Path) -> str | None:
    """The task a model of this project was trained on (None: a model from elsewhere, or exported
    before the file was written)."""
    path = Path(model_dir) / TRAINED_FILE
    return read_json(path).get("task") if path.is_file() else None


def _index(path: Path) -> dict | None:
    return read_json(path / "index.json") if (path / "index.json").exists() else None


def resolve_model_dir(path: str | Path, role: str = "generator") -> Path:
    """A model directory, or the `role` model of a directory a models stage wrote."""
    path = Path(path)
    index = _index(path)
    if index is not None:
        if index.get(role) is None:
            raise InputError(f"{path}: no {role} model (is `models.{role}` null?)")
        path = path / index[role]
    if not (path / "config.json").exists():
        raise InputError(f"{path}: not a model directory (no config.json); run `dvc repro` first")
    return path


def optional_model_dir(path: str | Path, role: str) -> Path | None:
    """The `role` model of a models stage's directory, or None where its spec is null."""
    index = _index(Path(path))
    if index is not None and role in index and index[role] is None:
        return None
    return resolve_model_dir(path, role)


def role_spec(path: str | Path, role: str) -> str:
    """The spec the `role` model of a models stage's directory was materialised from."""
    index = _index(Path(path))
    return index["specs"][role] if index is not None else str(path)


def same_model(first: Path, first_spec: str, second: Path, second_spec: str) -> bool:
    """Whether two materialised directories hold the same model: the same spec, and weight files
    of the same names and sizes (a cheap check: hashing them would read every byte)."""
    def sizes(directory: Path) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in sorted(Path(directory).glob("*.safetensors"))}
    return first_spec == second_spec and sizes(first) == sizes(second)


def weights_digest(model_dir: str | Path) -> str:
    """sha256 over the model's weight files: what identifies a model in fingerprints and caches."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    return hashlib.sha256("".join(sha256_file(p) for p in files).encode()).hexdigest()


def is_seq2seq(model_dir: str | Path) -> bool:
    return bool(AutoConfig.from_pretrained(model_dir).is_encoder_decoder)


def load_model(model_dir: str | Path, dtype: str = "float32", device: torch.device | str = "cpu") -> PreTrainedModel:
    """A materialised LM with its weights in `dtype` (float32 | bfloat16 | float16), on `device`."""
    model_class = AutoModelForSeq2SeqLM if is_seq2seq(model_dir) else AutoModelForCausalLM
    return model_class.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


@contextmanager
def plain_decoding(model: PreTrainedModel):
    """The model with a generation config that holds its special tokens only, so that a decoding
    is what its call asks for: transformers fills the settings a call leaves unset from the
    checkpoint's generation config (bart-large-cnn's, for news summaries: 4 beams, a minimum
    length of 56, trigram blocking, a length penalty, forced first and last tokens). The generate
    stage's predictions would follow those, and RLOO's samples would not be samples of π."""
    saved = model.generation_config
    config = model.config
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=saved.eos_token_id if saved.eos_token_id is not None else config.eos_token_id,
        pad_token_id=saved.pad_token_id, decoder_start_token_id=getattr(config, "decoder_start_token_id", None))
    try:
        yield model
    finally:
        model.generation_config = saved
