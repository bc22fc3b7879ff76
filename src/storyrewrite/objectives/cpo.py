"""Contrastive Preference Optimisation (Xu et al., 2024), with y_w = the edited ending and
y_l = the original ending."""
from __future__ import annotations

import torch
import torch.nn.functional as F



def cpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, chosen_nll: torch.Tensor,
             beta: float, lambda_: float) -> torch.Tensor:
    """L = −(1/B) Σ_b log σ(β·(log π(y_w|x) − log π(y_l|x))) + λ·NLL(y_w)

    chosen_logps, rejected_logps: B sequence log-probabilities (sums over tokens);
    chosen_nll: the scalar NLL of the chosen endings (mean over their tokens, as in TRL's CPO).
    Both terms are averaged at the batch level, as in the paper.
    """
    preference = -F.logsigmoid(beta * (chosen_logps - rejected_logps)).mean()
    return preference + lambda_ * chosen_nll
