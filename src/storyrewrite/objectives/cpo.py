"""Contrastive Preference Optimisation (Xu et al., 2024), with y_w = the edited ending and
y_l = the original ending."""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
