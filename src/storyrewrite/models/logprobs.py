"""Per-token log-probabilities of the target tokens, from logits in the batch layout of
`storyrewrite.models.encoding` (B×T×V against B×T). Shared by the objectives (NLL, CPO) and the
LM scorer, so both read the same numbers the same way."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def token_log_probs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """log p(y_t | ...) of each target token: logits B×T×V, target_ids B×T -> B×T (float32)."""
    return torch.gather(F.log_softmax(logits.float(), dim=-1), 2, target_ids.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ m·v / Σ m over all positions (float32; 0 where the mask is empty): values, mask B×T."""
    weights = mask.to(torch.float32)
    return (values * weights).sum() / weights.sum().clamp(min=1)


def mean_target_log_prob(logits: torch.Tensor, target_ids: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Per row: Σ_t m_t log p(y_t) / Σ_t m_t. logits B×T×V, target_ids/mask B×T -> B."""
    mask = target_mask.to(torch.float32)
    return (token_log_probs(logits, target_ids) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
