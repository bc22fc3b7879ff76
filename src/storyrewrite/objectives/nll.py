"""Negative log-likelihood of the reference ending (the paper's NLL baseline)."""
from __future__ import annotations

import torch
from transformers import PreTrainedModel

from storyrewrite.models.encoding import target_logits
from storyrewrite.models.logprobs import masked_mean, token_log_probs
from storyrewrite.objectives.base import Loss, LossOutput, ObjectiveContext


def nll_loss(logits: torch.Tensor, target_ids: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """L = -(1/N) Σ_{b,t} m_{b,t} log p(y_{b,t} | x_b, y_{b,<t}), N = Σ m: the mean over all real
    (non-padding) target tokens of the batch, as Hugging Face's label loss computes it.

    logits: B×T×V; target_ids, target_mask: B×T.
    """
    return -masked_mean(token_log_probs(logits, target_ids), target_mask)


def token_accuracy(logits: torch.Tensor, target_ids: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Share of real target tokens that are the generator's argmax (teacher-forced)."""
    return masked_mean((logits.argmax(dim=-1) == target_ids).float(), target_mask)


def build(context: ObjectiveContext) -> Loss:
    """NLL of the edited ending, with the generator's teacher-forced token accuracy as diagnostic."""
    def compute(generator: PreTrainedModel, batch: dict, noise_seed: int, validation: bool) -> LossOutput:
        logits = target_logits(generator, batch)  # B×T×V
        loss = nll_loss(logits, batch["target_ids"], batch["target_mask"])

        def diagnostics() -> dict[str, torch.Tensor]:
            return {"token_accuracy": token_accuracy(logits.detach(), batch["target_ids"], batch["target_mask"])}
        return LossOutput(loss, {}, loss.detach(), diagnostics)
    return Loss(compute)
