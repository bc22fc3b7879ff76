"""Training objectives, registered by name.

Each objective is a pure function of tensors (its formula in its docstring: `nll.py`, `cpo.py`,
`dto.py`) plus a registry entry saying how to get those tensors from the generator and a batch,
and what it needs (a scorer, the original ending, chosen/rejected pairs). The Lightning module
calls the built loss and never branches on the name: a new objective is one function and one
entry in `OBJECTIVES`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from storyrewrite.io import InputError
from storyrewrite.models.encoding import target_logits
from storyrewrite.objectives.cpo import cpo_loss
from storyrewrite.objectives.dto import delta_loss, gumbel_softmax, score_delta_loss, score_loss
from storyrewrite.objectives.nll import nll_loss, token_log_probs
from storyrewrite.params import CPOConfig, DTOConfig

# (generator, batch, noise_seed) -> scalar loss. The batch layout is storyrewrite.models.encoding's,
# plus the texts `targets` and `original_endings`, and `pair` (chosen + rejected) for CPO.
LossFn = Callable[[PreTrainedModel, dict, int], torch.Tensor]

if TYPE_CHECKING:  # the scorer module imports objectives.nll: no import cycle at run time
    from storyrewrite.metrics.lm_scorer import LMScorer


@dataclass(frozen=True)
class ObjectiveContext:
    dto: DTOConfig
    cpo: CPOConfig
    scorer: "LMScorer | None" = None


@dataclass(frozen=True)
class Objective:
    name: str
    build: Callable[[ObjectiveContext], LossFn]
    description: str
    label: str = ""  # in reports
    needs_scorer: bool = False
    needs_original_ending: bool = False
    pairs: bool = False  # the batch carries chosen (edited) and rejected (original) endings


def _nll(context: ObjectiveContext) -> LossFn:
    def loss(generator: PreTrainedModel, batch: dict, noise_seed: int) -> torch.Tensor:
        return nll_loss(target_logits(generator, batch), batch["target_ids"], batch["target_mask"])
    return loss


def _cpo(context: ObjectiveContext) -> LossFn:
    beta, lambda_ = context.cpo.beta, context.cpo.lambda_

    def loss(generator: PreTrainedModel, batch: dict, noise_seed: int) -> torch.Tensor:
        pair = batch["pair"]  # rows 0..B-1: x → edited ending (chosen); B..2B-1: x → original ending
        logits = target_logits(generator, pair)  # one forward for chosen and rejected: 2B×T×V
        mask = pair["target_mask"].to(torch.float32)
        sequence_logps = (token_log_probs(logits, pair["target_ids"]) * mask).sum(dim=1)  # 2B
        size = len(batch["ids"])
        chosen_nll = nll_loss(logits[:size], pair["target_ids"][:size], pair["target_mask"][:size])
        return cpo_loss(sequence_logps[:size], sequence_logps[size:], chosen_nll, beta, lambda_)
    return loss


def _dto(combine: Callable[..., torch.Tensor], with_original: bool) -> Callable[[ObjectiveContext], LossFn]:
    def build(context: ObjectiveContext) -> LossFn:
        scorer, config = context.scorer, context.dto
        vocab = scorer.model.get_input_embeddings().weight.shape[0]

        def loss(generator: PreTrainedModel, batch: dict, noise_seed: int) -> torch.Tensor:
            # One teacher-forced generator forward: logits at each target position, B×T×V.
            logits = target_logits(generator, batch)
            if logits.shape[-1] < vocab:
                raise InputError(f"the generator has {logits.shape[-1]} output logits but the scorer {vocab} embeddings")
            # Rows beyond the tokenizer's vocabulary (padding of the embedding matrix) are dropped.
            probs = gumbel_softmax(logits[..., :vocab].float(), config.tau, config.hard,
                                   torch.Generator().manual_seed(noise_seed))  # B×T×V
            target_sets = [batch["targets"]] + ([batch["original_endings"]] if with_original else [])
            # The soft ending Ŷ is the scorer's source; padding positions are masked out.
            return combine(*scorer.score_soft_many(probs, batch["target_mask"], target_sets))
        return loss
    return build


OBJECTIVES: dict[str, Objective] = {
    "nll": Objective("nll", _nll, "negative log-likelihood of the edited ending", "NLL"),
    "cpo": Objective("cpo", _cpo, "CPO: edited ending preferred to the original ending", "CPO",
                     needs_original_ending=True, pairs=True),
    "score": Objective("score", _dto(score_loss, False), "DTO: −M(Ŷ, Y_EE)", "DTO-Score", needs_scorer=True),
    "delta": Objective("delta", _dto(delta_loss, True), "DTO: −[M(Ŷ, Y_EE) − M(Ŷ, X_OE)]", "DTO-Delta",
                       needs_scorer=True, needs_original_ending=True),
    "score_delta": Objective("score_delta", _dto(score_delta_loss, True), "DTO: −[2·M(Ŷ, Y_EE) − M(Ŷ, X_OE)]",
                             "DTO-Score+Delta", needs_scorer=True, needs_original_ending=True),
}


def get_objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise InputError(f"params: `objective` = {name!r} is not valid; valid values: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
