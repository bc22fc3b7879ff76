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



def gumbel_softmax(logits: torch.Tensor, tau: float, hard: bool, generator: torch.Generator) -> torch.Tensor:
    """softmax((logits + g) / tau), g ~ Gumbel(0, 1) drawn from `generator` (seeded, so a step
    is reproducible and a resumed run draws what the interrupted one would have). With `hard`,
    the forward value is the one-hot argmax and the gradient that of the soft sample."""
    uniform = torch.rand(logits.shape, generator=generator, device="cpu").to(logits.device, logits.dtype)
    gumbels = -torch.log(-torch.log(uniform.clamp(min=1e-10, max=1.0 - 1e-7)))
    soft = torch.softmax((logits + gumbels) / tau, dim=-1)
    if not hard:
        return soft
    one_hot = torch.zeros_like(soft).scatter_(-1, soft.argmax(dim=-1, keepdim=True), 1.0)
    return one_hot - soft.detach() + soft


def score_loss(m_edited: torch.Tensor) -> torch.Tensor:
    """−M(Ŷ, Y_EE), batch mean; m_edited: B."""
    return -m_edited.mean()


def delta_loss(m_edited: torch.Tensor, m_original: torch.Tensor) -> torch.Tensor:
    """−[M(Ŷ, Y_EE) − M(Ŷ, X_OE)], batch mean; both B."""
    return -(m_edited - m_original).mean()


def score_delta_loss(m_edited: torch.Tensor, m_original: torch.Tensor) -> torch.Tensor:
    """−[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)] = −[M + Δ_M], batch mean; both B."""
    return -(2 * m_edited - m_original).mean()
