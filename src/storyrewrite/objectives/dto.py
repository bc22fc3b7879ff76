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

import torch

from storyrewrite.models.logprobs import masked_mean


def gumbel_softmax(logits: torch.Tensor, tau: float, hard: bool, seed: int) -> torch.Tensor:
    """softmax((logits + g) / tau), g ~ Gumbel(0, 1), in float32.

    The noise is drawn on the logits' device from a generator seeded with `seed` (the step), so
    a step is reproducible for a given device and seed, a resumed run draws what the interrupted
    one would have, and no B×T×V tensor crosses between host and GPU. bf16 logits are promoted by
    the addition, not copied first. With `hard`, the forward value is the one-hot argmax and the
    gradient that of the soft sample (straight-through)."""
    generator = torch.Generator(device=logits.device).manual_seed(seed)
    uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    gumbels = -torch.log(-torch.log(uniform.clamp_(min=1e-10, max=1.0 - 1e-7)))
    soft = torch.softmax((logits + gumbels) / tau, dim=-1)
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
