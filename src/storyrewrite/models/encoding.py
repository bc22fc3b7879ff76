"""Token tensors for a batch of (source, target) pairs, laid out the same way for both model
kinds so that objectives see logits aligned with the target tokens: `B×T×V` against `B×T`.

- seq2seq: `input_ids`/`attention_mask` (B×S) hold the source; the decoder reads the target
  shifted right (`decoder_input_ids`, B×T).
- causal: each row is [left-padded prompt | right-padded target], so every target starts at the
  same column `prompt_width`; `position_ids` skip the left padding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.modeling_outputs import BaseModelOutput


@dataclass
class Encoder:
    tokenizer: PreTrainedTokenizerBase
    seq2seq: bool
    max_input_tokens: int
    max_output_tokens: int
    # Length buckets: pad every batch's sources and targets to a multiple of this (None: to the
    # longest row), so that a compiled model sees a few shapes
    pad_to_multiple_of: int | None = None

    def source_ids(self, sources: list[str]) -> list[list[int]]:
        ids = self.tokenizer(sources, add_special_tokens=True)["input_ids"]
        # A causal prompt keeps its end (the label the model continues after); a seq2seq
        # source keeps its start, as the tokenizer's own truncation would.
        if self.seq2seq:
            return [row[: self.max_input_tokens - 1] + row[-1:] if len(row) > self.max_input_tokens else row for row in ids]
        # A causal LM predicts the first target token from the last source token: an empty
        # source (an empty prediction being scored) becomes the start-of-text token.
        start = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.eos_token_id
        return [row[-self.max_input_tokens :] or [start] for row in ids]

    def target_ids(self, targets: list[str]) -> list[list[int]]:
        """Target tokens ending with eos (truncated targets keep their eos)."""
        eos = self.tokenizer.eos_token_id
        if self.seq2seq:
            rows = self.tokenizer(text_target=targets, add_special_tokens=True)["input_ids"]
        else:
            rows = [row + [eos] for row in self.tokenizer(targets, add_special_tokens=False)["input_ids"]]
        return [row[: self.max_output_tokens - 1] + [eos] if len(row) > self.max_output_tokens else row for row in rows]

    def batch(self, sources: list[str], targets: list[str]) -> dict:
        return self.batch_ids(self.source_ids(sources), self.target_ids(targets))

    def batch_ids(self, source_ids: list[list[int]], target_ids: list[list[int]]) -> dict:
        pad, multiple = self.tokenizer.pad_token_id, self.pad_to_multiple_of
        target, target_mask = pad_rows(target_ids, pad, left=False, multiple=multiple)
        if self.seq2seq:
            input_ids, attention_mask = pad_rows(source_ids, pad, left=False, multiple=multiple)
            return {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "target_ids": target,
                "target_mask": target_mask,
            }
        prompt, prompt_mask = pad_rows(source_ids, pad, left=True, multiple=multiple)
        attention_mask = torch.cat([prompt_mask, target_mask], dim=1)
        return {
            "input_ids": torch.cat([prompt, target], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids(attention_mask),
            "target_ids": target,
            "target_mask": target_mask,
        }

    def pair_batch(self, source_ids: list[list[int]], target_ids: list[list[int]]) -> dict:
        """The batch of (source, target) pairs for `pair_logits`: `batch_ids` where every source
        differs; where sources repeat, each distinct source once: `source_ids`/`source_mask` (D×S,
        the distinct sources in their first order: left-padded for a causal LM, right-padded for
        seq2seq), `target_ids`/`target_mask` (R×T, right-padded) and `index` (R: each target's
        source row), for `shared_source_logits`."""
        distinct = list(dict.fromkeys(tuple(row) for row in source_ids))
        if len(distinct) == len(source_ids):
            return self.batch_ids(source_ids, target_ids)
        pad, multiple = self.tokenizer.pad_token_id, self.pad_to_multiple_of
        row_of = {source: i for i, source in enumerate(distinct)}
        sources, source_mask = pad_rows([list(s) for s in distinct], pad, left=not self.seq2seq, multiple=multiple)
        targets, target_mask = pad_rows(target_ids, pad, left=False, multiple=multiple)
        return {"source_ids": sources, "source_mask": source_mask, "target_ids": targets, "target_mask": target_mask,
                "index": torch.tensor([row_of[tuple(row)] for row in source_ids])}

    def prompts(self, sources: list[str]) -> dict:
        """Left-padded (causal) or right-padded (seq2seq) sources, for generation."""
        ids, mask = pad_rows(self.source_ids(sources), self.tokenizer.pad_token_id, left=not self.seq2seq)
        return {"input_ids": ids, "attention_mask": mask}


def pad_rows(rows: list[list[int]], pad_id: int, left: bool, multiple: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded on the left or right to the longest (rounded up to a multiple of `multiple`),
    with their masks (1 for real tokens)."""
    width = max(len(row) for row in rows)
    if multiple:
        width = -(-width // multiple) * multiple
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token (padding gets 0 too)."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def generated_tokens(output: torch.Tensor, prompt_ids: torch.Tensor, seq2seq: bool) -> torch.Tensor:
    """The tokens `generate` wrote in each row of its `output`: a seq2seq model's after its
    decoder-start token, which it did not generate; a causal LM's after the (left-padded) prompt
    `prompt_ids` it continued. Rows that ended sooner are padded after their end token."""
    return output[:, 1:] if seq2seq else output[:, prompt_ids.shape[1]:]


def target_logits(model: PreTrainedModel, batch: dict) -> torch.Tensor:
    """Teacher-forced logits at each target position, B×T×V, whichever the model kind."""
    target = batch["target_ids"]  # B×T
    if model.config.is_encoder_decoder:
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=target)
        return model(
            input_ids=batch["input_ids"], attention_mask=key_mask(model, batch["attention_mask"]),
            decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_mask(model, decoder_input_ids), use_cache=False,
        ).logits
    # Drop the last column: positions prompt_width-1 .. end-1, the last T of what remains, predict
    # the target tokens.
    return causal_tail_logits(
        model, target.shape[1], input_ids=batch["input_ids"][:, :-1],
        attention_mask=batch["attention_mask"][:, :-1], position_ids=batch["position_ids"][:, :-1], use_cache=False,
    )


def pair_logits(model: PreTrainedModel, batch: dict) -> torch.Tensor:
    """Teacher-forced logits at each target position (R×T×V) of an `Encoder.pair_batch`: one
    forward over every row (`target_logits`), or, where its sources repeat, each read once
    (`shared_source_logits`)."""
    return shared_source_logits(model, batch) if "index" in batch else target_logits(model, batch)


def shared_source_logits(model: PreTrainedModel, batch: dict) -> torch.Tensor:
    """The values of `target_logits` (R×T×V) for an `Encoder.pair_batch` whose sources repeat: each
    distinct source is read once, for all the targets that continue it, at a fraction of the
    compute where sources repeat (the K samples of one source, a story's reference endings scored
    against one prediction). Differentiable: a source's gradient sums over its targets.

    A seq2seq model's encoder runs over the distinct sources; each target's decoder attends to its
    own source's states. A causal LM's body reads the sources once and keeps their keys and
    values, which each target's row then continues (the cache's rows picked per target), with the
    positions after its source's."""
    index, target_ids, target_mask = batch["index"], batch["target_ids"], batch["target_mask"]
    source_ids, source_mask = batch["source_ids"], batch["source_mask"]
    if model.config.is_encoder_decoder:
        encoded = model.get_encoder()(input_ids=source_ids, attention_mask=key_mask(model, source_mask)).last_hidden_state
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=target_ids)
        return model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoded[index]), attention_mask=key_mask(model, source_mask[index]),
            decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_mask(model, decoder_input_ids), use_cache=False,
        ).logits
    read = model.base_model(input_ids=source_ids, attention_mask=causal_mask(model, source_mask),
                            position_ids=position_ids(source_mask), use_cache=True)
    # The last source position (each row's real last token: left padding) predicts the target's
    # first token; the target's tokens but its last predict the rest.
    hidden = read.last_hidden_state[index, -1:]
    inputs, input_mask, past_mask = target_ids[:, :-1], target_mask[:, :-1], source_mask[index]
    if inputs.shape[1]:
        cache = read.past_key_values
        cache.reorder_cache(index)
        positions = past_mask.sum(dim=1, keepdim=True) + torch.arange(inputs.shape[1], device=inputs.device)
        continued = model.base_model(
            input_ids=inputs, attention_mask=continuation_mask(model, past_mask, input_mask),
            position_ids=positions, past_key_values=cache, use_cache=True,
        ).last_hidden_state
        hidden = torch.cat([hidden, continued], dim=1)
    return output_logits(model, hidden)


def output_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """A causal LM's logits from its last hidden states (B×T×d -> B×T×V): the output
    projection, then the soft-capping of models that have it (as their own forward does)."""
    logits = model.get_output_embeddings()(hidden)
    if cap := getattr(model.config, "final_logit_softcapping", None):
        logits = torch.tanh(logits / cap) * cap
    return logits


def causal_tail_logits(model: PreTrainedModel, width: int, **inputs) -> torch.Tensor:
    """Logits at the last `width` positions only (B×width×V) of a causal LM.

    The vocabulary projection runs on those positions alone, on a contiguous copy of their
    hidden states: `logits_to_keep` would project a strided slice, which PyTorch turns into a
    batched matmul that copies the whole output matrix once per row (measured: 3/4 of a scoring
    forward in bf16). The 2D attention mask goes in as the 4D one (`causal_mask`).
    """
    if "attention_mask" in inputs:
        inputs["attention_mask"] = causal_mask(model, inputs["attention_mask"])
    hidden = model.base_model(**inputs).last_hidden_state
    return output_logits(model, hidden[:, -width:].contiguous())


def causal_mask(model: PreTrainedModel, attention_mask: torch.Tensor) -> torch.Tensor:
    """The B×1×L×L attention mask of a padded batch for a causal LM (`attention_mask` B×L, 1 for
    real tokens): each query sees the real tokens up to itself (a padding query sees itself
    alone, so that no row is empty), in the form the model's attention takes (`model_form`).
    Built on the device without reading it back: given the 2D mask, transformers (5.x,
    masking_utils._ignore_causal_mask_sdpa) tests in an `if` whether the batch holds padding,
    a read of the device that makes the host wait for the GPU once or twice a forward (and,
    beside other processes on the GPU, for the GPU's turn to come back). Real positions get
    the values transformers' own mask gives them. Models with sliding-window layers, whose
    masks transformers builds per layer, and attention implementations other than SDPA and
    eager take the 2D mask as it is."""
    if not takes_4d_masks(model.config):
        return attention_mask
    return model_form(causal_allowed(attention_mask.bool()), model.config._attn_implementation, model.dtype)


def continuation_mask(model: PreTrainedModel, past_mask: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
    """The attention mask of a causal LM's inputs (`input_mask` B×Q, 1 for real tokens) that
    continue its key/value cache of rows whose real tokens are `past_mask` (B×P): the last Q rows
    of `causal_mask` over [past | inputs], each query seeing the real cached keys and the real
    inputs up to itself. The 2D mask [past | inputs] where 4D ones do not serve."""
    mask = causal_mask(model, torch.cat([past_mask, input_mask], dim=1))
    return mask if mask.dim() == 2 else mask[:, :, past_mask.shape[1]:]


def causal_allowed(real: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """The B×L×L boolean mask (True: the query, a row, sees the key, a column) of rows whose real
    tokens are `real` (B×L, boolean): each query sees the real keys up to itself, of those the L×L
    `visible` lets it see (None: all), and itself, so that a padding query's row is never empty
    (its output is never read)."""
    index = torch.arange(real.shape[1], device=real.device)
    allowed = index.unsqueeze(1) >= index.unsqueeze(0)
    if visible is not None:
        allowed = allowed & visible
    return (allowed.unsqueeze(0) & real.unsqueeze(1)) | torch.eye(real.shape[1], dtype=torch.bool, device=real.device)


def key_mask(model: PreTrainedModel, attention_mask: torch.Tensor) -> torch.Tensor:
    """A seq2seq model's B×1×1×S mask over its source (`attention_mask` B×S, 1 for real tokens):
    every query of its encoder, and of its decoder over the encoder's states, sees the real source
    tokens. As `causal_mask`, without the read of the device that transformers makes for a 2D mask
    (masking_utils._ignore_bidirectional_mask_sdpa), and the 2D mask where 4D ones do not serve."""
    if not takes_4d_masks(model.config):
        return attention_mask
    return model_form(attention_mask.bool().unsqueeze(1), model.config._attn_implementation, model.dtype)


def decoder_mask(model: PreTrainedModel, decoder_input_ids: torch.Tensor) -> torch.Tensor:
    """A seq2seq decoder's causal mask over its (teacher-forced) inputs, every position real: what
    transformers builds when given none, after a read of the device to find no padding."""
    return causal_mask(model, torch.ones_like(decoder_input_ids))


def takes_4d_masks(config) -> bool:
    """Whether a model takes a 4D attention mask in place of its 2D one, with the same values:
    SDPA or eager attention, and no sliding-window layers (transformers builds theirs per layer
    from the 2D mask)."""
    return (config._attn_implementation in ("sdpa", "eager") and getattr(config, "sliding_window", None) is None
            and all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ()))


def model_form(allowed: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """A B×Q×K boolean mask (True: the query sees the key) as the B×1×Q×K mask an attention
    implementation takes: boolean for SDPA, additive in `dtype` for eager."""
    if implementation == "sdpa":
        return allowed.unsqueeze(1)
    if implementation == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)
    raise ValueError(f"model_form: no 4D mask form for attention implementation {implementation!r}; valid: sdpa, eager")
