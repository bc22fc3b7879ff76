"""Contrastive Preference Optimisation (Xu et al., 2024), with y_w = the edited ending and
y_l = the original ending."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from storyrewrite.models.encoding import target_logits
from storyrewrite.models.logprobs import token_log_probs
from storyrewrite.objectives.base import Loss, LossOutput, ObjectiveContext
from storyrewrite.objectives.nll import nll_loss
from storyrewrite.objectives.registry import CPOConfig


def cpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, chosen_nll: torch.Tensor,
             beta: float, lambda_: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = −(1/B) Σ_b log σ(β·(log π(y_w|x) − log π(y_l|x))) + λ·NLL(y_w)

    chosen_logps, rejected_logps: B sequence log-probabilities (sums over tokens);
    chosen_nll: the scalar NLL of the chosen endings (mean over their tokens, as in TRL's CPO).
    Both terms are averaged at the batch level, as in the paper. Returns L and its two terms,
    `preference` and `nll_term` (= NLL(y_w), before λ).
    """
    preference = -F.logsigmoid(beta * (chosen_logps - rejected_logps)).mean()
    return preference + lambda_ * chosen_nll, {"preference": preference, "nll_term": chosen_nll}


def cpo_diagnostics(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, beta: float) -> dict[str, torch.Tensor]:
    """TRL's CPO log, batch means: rewards r = β·log π(y|x) of the chosen and rejected endings,
    their margin r_w − r_l, the share of instances with r_w > r_l, and the log-probabilities."""
    chosen_rewards, rejected_rewards = beta * chosen_logps, beta * rejected_logps
    return {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "logps/chosen": chosen_logps.mean(),
        "logps/rejected": rejected_logps.mean(),
    }


def build(context: ObjectiveContext[CPOConfig]) -> Loss:
    """CPO on one forward of the chosen and rejected endings (2B rows)."""
    beta, lambda_ = context.settings.beta, context.settings.lambda_

    def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
        pair = batch["pair"]  # rows 0..B-1: x → edited ending (chosen); B..2B-1: x → original ending
        logits = target_logits(generator, pair)  # one forward for chosen and rejected: 2B×T×V
        mask = pair["target_mask"].to(torch.float32)
        sequence_logps = (token_log_probs(logits, pair["target_ids"]) * mask).sum(dim=1)  # 2B
        size = len(batch["ids"])
        chosen, rejected = sequence_logps[:size], sequence_logps[size:]
        chosen_nll = nll_loss(logits[:size], pair["target_ids"][:size], pair["target_mask"][:size])
        loss, terms = cpo_loss(chosen, rejected, chosen_nll, beta, lambda_)
        return LossOutput(loss, {k: v.detach() for k, v in terms.items()}, chosen_nll.detach(),
                          lambda: cpo_diagnostics(chosen.detach(), rejected.detach(), beta))
    return Loss(compute)
