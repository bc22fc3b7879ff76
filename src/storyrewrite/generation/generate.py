"""Generate predictions for one system: batched, length-sorted, resumable, deterministic on CPU.

Predictions are JSON Lines `{"id": ..., "prediction": ...}` in the order of the prepared
table. Instances that give the model the same input (a TimeTravel test story has three, one per
human rewrite) are decoded once and share the prediction: decoding is greedy or beam search,
so it would give each of them the same ending anyway. While a run is under way each finished
batch is appended to a partial file named by a fingerprint of the model weights, the data and
the generation settings; an interrupted run started again with the same inputs skips what is
done, anything else starts afresh. It counts the endings cut at `max_new_tokens`: those the
model had not finished (no end-of-sequence token, and for a causal LM no line break) when the
limit stopped it.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from storyrewrite.data.formatting import model_source
from storyrewrite.io import InputError, read_jsonl_resumable, write_jsonl_atomic
from storyrewrite.models.encoding import Encoder, generated_tokens
from storyrewrite.models.store import is_seq2seq, load_model, load_tokenizer, plain_decoding, resolve_model_dir, weights_digest
from storyrewrite.params import GenerateConfig, ModelsConfig


def _fingerprint(model_dir: Path, instances: list[dict], config: GenerateConfig, models: ModelsConfig,
                 device: torch.device) -> str:
    digest = hashlib.sha256(weights_digest(model_dir).encode())
    # The device type too: a GPU's kernels may round differently, so a CPU run never resumes a GPU one.
    digest.update(json.dumps([config.model_dump(), models.max_input_tokens, device.type], sort_keys=True).encode())
    digest.update(json.dumps(instances, sort_keys=True).encode())
    return digest.hexdigest()[:16]


class Generated(NamedTuple):
    """What one call of `generate_predictions` did."""

    predictions: int  # written now (the rest were resumed from the partial file)
    decoded: int  # distinct model inputs decoded for them
    cut: int = 0  # predictions (of all, resumed ones included) cut at `max_new_tokens`


def _cut(ended: bool, text: str, seq2seq: bool) -> bool:
    """Whether an output row stopped at the token limit in mid-ending: it holds no end-of-sequence
    token (`ended`: rows that ended are padded after theirs) and, for a causal LM, no line break
    (`_clean` keeps the line before one: the model had finished the ending and gone on to a new
    prompt field)."""
    return not ended and (seq2seq or "\n" not in text.strip())


def _clean(text: str, seq2seq: bool) -> str:
    text = text.strip()
    # A causal LM continues the plain-text prompt; the ending is one line (targets never hold a
    # newline), and what follows a newline is the model starting a new prompt field.
    return text if seq2seq else text.split("\n", 1)[0].strip()


def generate_predictions(
    model_dir: str | Path,
    instances: list[dict],
    task: str,
    config: GenerateConfig,
    models: ModelsConfig,
    out_path: str | Path,
    seed: int,
    device: torch.device | str = "cpu",
) -> Generated:
    """Write predictions for `instances` to `out_path`; return how many were generated now, and
    from how many distinct inputs.

    The model runs on `device` with its weights in `config.dtype` (bf16 on a GPU), batches of
    `config.batch_size` prompts of similar length, SDPA attention (transformers' default) and,
    with `config.cache: static`, a fixed-size KV cache (no re-allocation per new token)."""
    model_dir, out_path = resolve_model_dir(model_dir), Path(out_path)  # (a folder without a model: an error naming it)
    ids = [row["id"] for row in instances]
    if len(set(ids)) != len(ids):
        raise InputError("generate: duplicated instance ids in the prepared table")
    torch.manual_seed(seed)
    device = torch.device(device)
    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir, config.dtype, device).eval()
    seq2seq = is_seq2seq(model_dir)
    encoder = Encoder(tokenizer, seq2seq, models.max_input_tokens, models.max_output_tokens)
    generation = GenerationConfig(
        max_new_tokens=config.max_new_tokens, num_beams=config.num_beams, do_sample=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=model.config.decoder_start_token_id if seq2seq else None,
        cache_implementation="static" if config.cache == "static" else None,
    )

    partial = out_path.parent / ".partial" / f"{out_path.stem}-{_fingerprint(model_dir, instances, config, models, device)}.jsonl"
    partial.parent.mkdir(parents=True, exist_ok=True)
    for stale in partial.parent.glob(f"{out_path.stem}-*.jsonl"):
        if stale != partial:
            stale.unlink()
    done, cut, torn = {}, set(), False
    if partial.exists():
        rows, torn = read_jsonl_resumable(partial)
        done = {row["id"]: row["prediction"] for row in rows}
        cut = {row["id"] for row in rows if row.get("cut")}
        if torn:  # rewritten with its complete lines, so that what follows starts on a line of its own
            write_jsonl_atomic(partial, rows)

    sources = {row["id"]: model_source(row, task, tokenizer, seq2seq) for row in instances if row["id"] not in done}
    sharing: dict[str, list[str]] = {}  # a distinct model input -> the ids of the instances that give it
    for instance_id, source in sources.items():
        sharing.setdefault(source, []).append(instance_id)
    distinct = list(sharing)
    lengths = dict(zip(distinct, (len(r) for r in encoder.source_ids(distinct)), strict=True)) if distinct else {}
    # Longest first: similar lengths share a batch (little padding), and memory peaks at once.
    todo = sorted(distinct, key=lambda source: -lengths[source])
    if torn:
        print(f"warning: {partial}: its last line was cut short (an interrupted write) and is dropped; "
              f"{len(done)} prediction(s) kept, {len(sources)} to generate", file=sys.stderr)
    # Decoded as `generate.*` say, not as the checkpoint's own decoding defaults would fill the rest.
    with open(partial, "a", encoding="utf-8") as sink, torch.inference_mode(), plain_decoding(model):
        for start in tqdm(range(0, len(todo), config.batch_size), desc=f"generate {out_path.stem}", unit="batch"):
            batch = todo[start : start + config.batch_size]
            inputs = {k: v.to(device) for k, v in encoder.prompts(batch).items()}
            output = model.generate(**inputs, generation_config=generation)
            new_tokens = generated_tokens(output, inputs["input_ids"], seq2seq)
            ended = new_tokens.eq(tokenizer.eos_token_id).any(dim=1).tolist()  # (one read of the device a batch)
            texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            for source, text, row_ended in zip(batch, texts, ended, strict=True):
                stopped = _cut(row_ended, text, seq2seq)
                for instance_id in sharing[source]:
                    done[instance_id] = _clean(text, seq2seq)
                    if stopped:
                        cut.add(instance_id)
                    sink.write(json.dumps({"id": instance_id, "prediction": done[instance_id], "cut": stopped},
                                          ensure_ascii=False) + "\n")
            sink.flush()
    write_jsonl_atomic(out_path, ({"id": i, "prediction": done[i]} for i in ids))
    partial.unlink()
    return Generated(len(sources), len(distinct), len(cut & set(ids)))
