"""BARTScore-style scoring with a frozen seq2seq or causal LM.

M(a, b) = (1/|b|) Σ_t log p(b_t | a, b_<t): the mean over the tokens of b, its end token
included (as BARTScore counts it), of their log-probability given a. For a seq2seq scorer `a`
is the encoder input; for a causal scorer `a` is a prefix and only b's tokens are scored.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from storyrewrite.data.formatting import model_target
from storyrewrite.io import InputError
from storyrewrite.models.encoding import (Encoder, causal_allowed, causal_mask, decoder_mask, key_mask, model_form, output_logits,
                                         pad_rows, pair_logits, position_ids)
from storyrewrite.models.store import load_model, load_tokenizer
from storyrewrite.models.logprobs import mean_target_log_prob


@dataclass(frozen=True)
class TargetRows:
    """A scorer's target rows for texts: (ids, mask), right-padded as the scorer pads them, on the
    CPU. Host work that a data loader's worker can do ahead of a training step; small enough to
    travel to a worker process (a tokenizer, no model)."""

    encoder: Encoder
    seq2seq: bool

    def ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's target token ids, unpadded."""
        return self.encoder.target_ids([model_target(t, self.seq2seq) for t in texts])

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_rows(self.ids(texts), self.encoder.tokenizer.pad_token_id, left=False, multiple=self.encoder.pad_to_multiple_of)


# A target set: texts, or their rows from the scorer's `target_rows` (made ahead of the step).
TargetSet = list[str] | tuple[torch.Tensor, torch.Tensor]


class LMScorer:
    """A frozen LM that scores targets given sources, as text (`score`) or as soft token
    distributions (`score_soft`, differentiable, for DTO)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 max_input_tokens: int = 1024, max_output_tokens: int = 250, pad_to_multiple_of: int | None = None):
        self.model = model.eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.seq2seq = bool(model.config.is_encoder_decoder)
        self.encoder = Encoder(tokenizer, self.seq2seq, max_input_tokens, max_output_tokens, pad_to_multiple_of)
        self.target_rows = TargetRows(self.encoder, self.seq2seq)

    @classmethod
    def from_dir(cls, model_dir: str | Path, max_input_tokens: int = 1024, max_output_tokens: int = 250,
                 dtype: str = "float32", device: torch.device | str = "cpu", pad_to_multiple_of: int | None = None) -> "LMScorer":
        """The scorer in `model_dir`, its weights in `dtype` (float32 | bfloat16 | float16), on
        `device`; `pad_to_multiple_of`: its encoder's length buckets (Encoder)."""
        return cls(load_model(model_dir, dtype, device), load_tokenizer(model_dir), max_input_tokens, max_output_tokens,
                   pad_to_multiple_of)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def score(self, sources: list[str], targets: list[str], batch_size: int = 16) -> list[float]:
        """M(source_i, target_i) for each pair, in input order. Batches hold pairs of similar
        length (sorted, longest first) so that little compute goes to padding."""
        if len(sources) != len(targets):
            raise ValueError(f"score: {len(sources)} sources but {len(targets)} targets")
        return self.score_ids(self.encoder.source_ids(sources), targets, batch_size)

    @torch.no_grad()
    def score_ids(self, source_ids: list[list[int]], targets: list[str], batch_size: int = 16) -> list[float]:
        """`score` with the sources given as token ids (no tokenisation of the source)."""
        target_ids = self.target_rows.ids(targets)
        # Identical pairs are scored once: a story's three instances share one input, so a
        # system's prediction, and its score against the original ending, often repeat.
        pairs = [(tuple(s), tuple(t)) for s, t in zip(source_ids, target_ids, strict=True)]
        unique = list(dict.fromkeys(pairs))
        # A source is read once for all its targets in a batch (`pair_logits`): a
        # source's pairs go together, longest target first. Where no source repeats, this is
        # the order of the longest pairs first.
        targets_of: dict[tuple, list[tuple]] = {}
        for source, target in unique:
            targets_of.setdefault(source, []).append(target)
        groups = sorted(((source, sorted(group, key=len, reverse=True)) for source, group in targets_of.items()),
                        key=lambda item: -(len(item[0]) + len(item[1][0])))
        order = [(source, target) for source, group in groups for target in group]
        # The values stay on the device until every batch is queued, read back in one copy: a read
        # per batch would make the host wait for each batch's kernels (and, beside other processes
        # on the GPU, for the GPU's turn to come back) before it pads the next one.
        values = []
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = self.encoder.pair_batch([list(s) for s, _ in chunk], [list(t) for _, t in chunk])
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            values.append(mean_target_log_prob(pair_logits(self.model, batch), batch["target_ids"], batch["target_mask"]))
        scored = torch.cat(values).tolist() if values else []
        values_of = dict(zip(order, scored, strict=True))
        return [values_of[pair] for pair in pairs]

    def soft_embeddings(self, source_probs: torch.Tensor) -> torch.Tensor:
        """probs B×S×V @ E V×d -> B×S×d, scaled as the model scales its own token embeddings."""
        embedding = self.model.get_input_embeddings()
        weight = embedding.weight
        return (source_probs.to(weight.dtype) @ weight) * getattr(embedding, "embed_scale", 1.0)

    def score_soft(self, source_probs: torch.Tensor, source_mask: torch.Tensor, targets: list[str]) -> torch.Tensor:
        """M(a_i, targets_i) with each source a_i given as a distribution over the vocabulary at
        each of its positions (source_probs B×S×V, source_mask B×S, right-padded). Differentiable
        with respect to source_probs; the scorer's weights stay frozen. Returns B."""
        return self.score_soft_many(source_probs, source_mask, [targets])[0]

    def score_soft_many(self, source_probs: torch.Tensor, source_mask: torch.Tensor,
                        target_sets: list[TargetSet]) -> list[torch.Tensor]:
        """`score_soft` against several target lists that share the same soft sources: the
        sources are run once for all of them (a seq2seq scorer's encoder; for a causal scorer,
        one pass over each source followed by all its target sets, see `_score_soft_causal`).
        A set is texts, or their rows from `target_rows` (tokenised ahead of the step)."""
        embeds = self.soft_embeddings(source_probs)  # B×S×d
        source_mask = source_mask.to(self.device)
        if self.seq2seq:
            keys = key_mask(self.model, source_mask)
            encoded = self.model.get_encoder()(inputs_embeds=embeds, attention_mask=keys)
            results = []
            for targets in target_sets:
                target_ids, target_mask = self._padded_targets([targets])
                decoder_input_ids = self.model.prepare_decoder_input_ids_from_labels(labels=target_ids)
                logits = self.model(
                    encoder_outputs=encoded, attention_mask=keys, decoder_input_ids=decoder_input_ids,
                    decoder_attention_mask=decoder_mask(self.model, decoder_input_ids), use_cache=False,
                ).logits
                results.append(mean_target_log_prob(logits, target_ids, target_mask))
            return results
        return self._score_soft_causal(embeds, source_mask, target_sets)

    def _padded_targets(self, target_sets: list[TargetSet]) -> tuple[torch.Tensor, torch.Tensor]:
        """The target sets' rows on the device, row b·K + k holding set k of source b, padded to
        the widest set (each set's width already a multiple of the buckets', if any)."""
        rows = [target if isinstance(target, tuple) else self.target_rows(target) for target in target_sets]
        width = max(ids.shape[1] for ids, _ in rows)
        pad = self.encoder.tokenizer.pad_token_id
        ids = torch.stack([F.pad(ids, (0, width - ids.shape[1]), value=pad) for ids, _ in rows], dim=1).flatten(0, 1)
        mask = torch.stack([F.pad(mask, (0, width - mask.shape[1])) for _, mask in rows], dim=1).flatten(0, 1)
        # Without waiting for the device: a blocking copy to a GPU waits for the work queued before it
        # (in a DTO step, the generator's forward), so the host could not queue the scorer's meanwhile.
        return ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)

    def _score_soft_causal(self, embeds: torch.Tensor, source_mask: torch.Tensor,
                           target_sets: list[list[str]]) -> list[torch.Tensor]:
        """One pass over rows laid out [pad | soft source | inputs of target set 1 | … | set K]:
        every target starts at the source's end, whose last position predicts each set's first
        token, and each set's positions continue from the source's length. With one set
        (DTO-Score) the usual causal mask serves. With several (DTO-Delta, DTO-Score+Delta) a
        block mask lets each set's tokens see the source and the earlier tokens of their own set,
        never another set, so every set gets the values of a pass of its own, and the sources
        run once. One pass over S + K·T positions costs less than a pass over the sources and a
        continuation of their key/value cache (measured on a 2-vCPU VM, SmolLM2-135M, batch 2,
        fp32, scorer forward and backward: about a fifth less, for one set and for two)."""
        batch, width = source_mask.shape
        sets = len(target_sets)
        # Move each row's padding to the left ([pad | source]), the layout of
        # storyrewrite.models.encoding.
        lengths = source_mask.sum(dim=1)
        columns = torch.arange(width, device=self.device)
        gather = (columns.unsqueeze(0) - (width - lengths).unsqueeze(1)) % width  # B×S
        left_embeds = torch.gather(embeds, 1, gather.unsqueeze(-1).expand(-1, -1, embeds.shape[-1]))
        left_mask = (columns.unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()
        # Target rows b·K + k: source b with target set k. Each set's inputs (its tokens but the
        # last) predict its tokens 1..T-1; they are laid out set after set in source b's row.
        target_ids, target_mask = self._padded_targets(target_sets)
        steps = target_ids.shape[1] - 1
        target_embeds = self.model.get_input_embeddings()(target_ids[:, :-1]).reshape(batch, sets * steps, -1)
        target_positions = (lengths.unsqueeze(1) + torch.arange(steps, device=self.device)).repeat(1, sets)
        input_mask = target_mask[:, :-1].reshape(batch, sets * steps)
        if sets == 1:
            attention_mask = causal_mask(self.model, torch.cat([left_mask, input_mask], dim=1))
        else:
            attention_mask = self._target_sets_mask(left_mask.bool(), input_mask.bool(), sets, embeds.dtype)
        hidden = self.model.base_model(
            inputs_embeds=torch.cat([left_embeds, target_embeds], dim=1), attention_mask=attention_mask,
            position_ids=torch.cat([position_ids(left_mask), target_positions], dim=1), use_cache=False,
        ).last_hidden_state
        # Set k's hidden states: the source's last position, then its own inputs' (B·K)×T×d,
        # contiguous (see causal_tail_logits).
        first = hidden[:, width - 1 : width].unsqueeze(1).expand(-1, sets, -1, -1)
        hidden = torch.cat([first, hidden[:, width:].reshape(batch, sets, steps, -1)], dim=2).reshape(batch * sets, steps + 1, -1)
        logits = output_logits(self.model, hidden)
        scores = mean_target_log_prob(logits, target_ids, target_mask).view(batch, sets)
        return list(scores.unbind(dim=1))

    def _target_sets_mask(self, source_mask: torch.Tensor, input_mask: torch.Tensor, sets: int,
                          dtype: torch.dtype) -> torch.Tensor:
        """The B×1×Q×Q attention mask of rows [source (S) | set 1 | … | set K] (each set's
        inputs T-1 wide; masks True for real tokens): source queries see the real source tokens
        up to themselves; a set's queries see the real source tokens and their own set's real
        tokens up to themselves. Every query also sees itself, so that a padding position has
        something to attend to (its output is never read). In the form the scorer's attention
        implementation takes: boolean for SDPA, additive for eager."""
        width = source_mask.shape[1]
        steps = input_mask.shape[1] // sets
        # Segment of each column: 0 for the source, k + 1 for target set k.
        segment = torch.cat([torch.zeros(width, dtype=torch.long, device=self.device),
                             torch.arange(1, sets + 1, device=self.device).repeat_interleave(steps)])
        same_set_or_source = (segment.unsqueeze(0) == 0) | (segment.unsqueeze(0) == segment.unsqueeze(1))
        allowed = causal_allowed(torch.cat([source_mask, input_mask], dim=1), same_set_or_source)
        implementation = self.model.config._attn_implementation
        if implementation in ("sdpa", "eager"):
            return model_form(allowed, implementation, dtype)
        raise InputError(f"scorer: DTO with two target sets (delta, score_delta) scores them in one pass under a block "
                         f"attention mask, which the scorer's attention implementation {implementation!r} does not take; "
                         "valid implementations: sdpa (the default), eager")
