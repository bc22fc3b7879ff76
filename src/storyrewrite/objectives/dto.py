"""Differentiable training objectives (DTO): the generator's teacher-forced distribution at
each target position is relaxed with Gumbel-softmax and scored by a frozen LM scorer, which sees
it as soft input embeddings (probs @ E). With M(a, b) the scorer's mean log-probability of b
given a (BARTScore):

  score        L = −M(Ŷ, Y_EE)
  delta        L = −[M(Ŷ, Y_EE) − M(Ŷ, X_OE)]
  score_delta  L = −[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)]

each averaged over the batch.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from storyrewrite.io import InputError
from storyrewrite.metrics.lm_scorer import LMScorer, TargetRows
from storyrewrite.models.encoding import target_logits
from storyrewrite.models.logprobs import masked_mean
from storyrewrite.objectives.base import Loss, LossOutput, ObjectiveContext
from storyrewrite.objectives.nll import nll_loss
from storyrewrite.objectives.registry import DTOConfig


def gumbel_softmax(logits: torch.Tensor, tau: float, hard: bool, seed: int) -> torch.Tensor:
    """softmax((logits + g) / tau), g ~ Gumbel(0, 1), in float32.

    The noise is drawn on the logits' device from a generator seeded with `seed` (the step), so
    a step is reproducible for a given device and seed, a resumed run draws what the interrupted
    one would have, and no B×T×V tensor crosses between host and GPU. bf16 logits are promoted by
    the addition, not copied first. With `hard`, the forward value is the one-hot argmax and the
    gradient that of the soft sample (straight-through).

    The noise becomes the softmax's input in place: one B×T×V float32 buffer where the written-out
    formula allocates six (the same values bit for bit; at 2×124×49,152 on a 2-vCPU CPU, forward
    and backward take half the time). Neither the addition nor the division by tau (skipped at
    1.0) keeps its input for the backward pass, so autograd allows it."""
    generator = torch.Generator(device=logits.device).manual_seed(seed)
    noise = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    noise.clamp_(min=1e-10, max=1.0 - 1e-7).log_().neg_().log_().neg_()  # g = −log(−log u)
    noise.add_(logits)
    if tau != 1.0:
        noise.div_(tau)
    soft = torch.softmax(noise, dim=-1)
    if not hard:
        return soft
    one_hot = torch.zeros_like(soft).scatter_(-1, soft.argmax(dim=-1, keepdim=True), 1.0)
    return one_hot - soft.detach() + soft


def gumbel_statistics(probs: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Over the real target positions (mask B×T) of the relaxed samples (probs B×T×V): the mean
    entropy −Σ_v p log p (0 when collapsed to one-hot) and the mean largest probability (1.0
    when collapsed)."""
    entropy = torch.special.entr(probs).sum(dim=-1)  # B×T; entr(0) = 0, no 0·log 0 NaN
    return {"gumbel_entropy": masked_mean(entropy, mask), "gumbel_max_prob": masked_mean(probs.amax(dim=-1), mask)}


def score_loss(m_edited: torch.Tensor) -> torch.Tensor:
    """−M(Ŷ, Y_EE), batch mean; m_edited: B."""
    return -m_edited.mean()


def delta_loss(m_edited: torch.Tensor, m_original: torch.Tensor) -> torch.Tensor:
    """−[M(Ŷ, Y_EE) − M(Ŷ, X_OE)], batch mean; both B."""
    return -(m_edited - m_original).mean()


def score_delta_loss(m_edited: torch.Tensor, m_original: torch.Tensor) -> torch.Tensor:
    """−[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)] = −[M + Δ_M], batch mean; both B."""
    return -(2 * m_edited - m_original).mean()


@dataclass(frozen=True)
class ScorerRows:
    """A batch's endings tokenised for the scorer ahead of the step (Loss.prepare): Y_EE, and X_OE
    where the batch has it."""

    rows: TargetRows

    def __call__(self, batch: dict) -> dict:
        prepared = {"scorer_targets": self.rows(batch["targets"])}
        if "original_endings" in batch:
            prepared["scorer_original_endings"] = self.rows(batch["original_endings"])
        return prepared


def _builder(combine: Callable[..., torch.Tensor], with_original: bool) -> Callable[[ObjectiveContext[DTOConfig]], Loss]:
    def build(context: ObjectiveContext[DTOConfig]) -> Loss:
        config = context.settings
        scorer = LMScorer.from_dir(context.scorer_dir, context.max_input_tokens, context.max_output_tokens,
                                   dtype=config.scorer_dtype, pad_to_multiple_of=context.pad_to_multiple_of)
        vocab = scorer.model.get_input_embeddings().weight.shape[0]

        def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
            # One teacher-forced generator forward: logits at each target position, B×T×V.
            logits = target_logits(generator, batch)
            if logits.shape[-1] < vocab:
                raise InputError(f"the generator has {logits.shape[-1]} output logits but the scorer {vocab} embeddings")
            # Rows beyond the tokenizer's vocabulary (padding of the embedding matrix) are dropped.
            probs = gumbel_softmax(logits[..., :vocab], config.tau, config.hard, noise_seed)  # B×T×V
            # Validation scores X_OE for every variant (for m_original and delta), where the task has it.
            score_original = with_original or (validation and "original_endings" in batch)
            # Tokenised by the data loader where it could (ScorerRows), else here.
            target_sets = [batch.get("scorer_targets", batch["targets"])]
            if score_original:
                target_sets.append(batch.get("scorer_original_endings", batch["original_endings"]))
            # The soft ending Ŷ is the scorer's source; padding positions are masked out.
            scores = scorer.score_soft_many(probs, batch["target_mask"], target_sets)  # each B
            loss = combine(*scores[: 2 if with_original else 1])
            terms = {"m_target": scores[0].detach().mean()}
            if with_original:
                terms["m_original"] = scores[1].detach().mean()

            def target_nll() -> torch.Tensor:  # an extra log-softmax over B×T×V: only when asked for
                return nll_loss(logits.detach(), batch["target_ids"], batch["target_mask"])
            nll = target_nll() if validation else None

            def diagnostics() -> dict[str, torch.Tensor]:
                values = {**gumbel_statistics(probs.detach(), batch["target_mask"]),
                          "nll_target": nll if nll is not None else target_nll()}
                if score_original:
                    values["m_original"] = scores[1].detach().mean()
                    values["delta"] = (scores[0] - scores[1]).detach().mean()
                return values
            return LossOutput(loss, terms, nll, diagnostics)
        return Loss(compute, scorer, prepare=ScorerRows(scorer.target_rows))
    return build


build_score = _builder(score_loss, with_original=False)
build_delta = _builder(delta_loss, with_original=True)
build_score_delta = _builder(score_delta_loss, with_original=True)
