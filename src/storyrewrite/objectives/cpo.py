"""Contrastive Preference Optimisation (Xu et al., 2024), with y_w = the edited ending and
y_l = the original ending."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from storyrewrite.io import InputError
from storyrewrite.params import positive


@dataclass(frozen=True)
class CPOConfig:
    """`cpo` section of params.yaml (paper grid: beta ∈ {0.1, 0.5, 1, 2}, lambda ∈ {0.5, 1, 2})."""

    beta: float
    lambda_: float = field(metadata={"key": "lambda"})

    def check(self, where: str) -> None:
        positive(where, beta=self.beta)
        if self.lambda_ < 0:
            raise InputError(f"params: `{where}.lambda` = {self.lambda_} must be >= 0")


def cpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, chosen_nll: torch.Tensor,
             beta: float, lambda_: float) -> torch.Tensor:
    """L = −(1/B) Σ_b log σ(β·(log π(y_w|x) − log π(y_l|x))) + λ·NLL(y_w)

    chosen_logps, rejected_logps: B sequence log-probabilities (sums over tokens);
    chosen_nll: the scalar NLL of the chosen endings (mean over their tokens, as in TRL's CPO).
    Both terms are averaged at the batch level, as in the paper.
    """
    preference = -F.logsigmoid(beta * (chosen_logps - rejected_logps)).mean()
    return preference + lambda_ * chosen_nll
